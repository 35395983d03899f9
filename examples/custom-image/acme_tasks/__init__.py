"""An example tasks package, installed into the image by examples/custom-image/Dockerfile."""

from __future__ import annotations

import logging

from runner import RunContext, task

log = logging.getLogger(__name__)


@task("report")
def report(ctx: RunContext) -> None:
    for part in ("invoices", "refunds", "totals"):
        ctx.check()  # raises once the lease is lost or SIGTERM arrived: stop between units
        log.info("report: %s done (slot %s, fencing token %s)", part, ctx.slot, ctx.fencing_token)
