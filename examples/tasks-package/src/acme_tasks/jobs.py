"""Example tasks. Each runs once per slot across all replicas: `cron-runner run invoices`."""

from __future__ import annotations

from runner import RunContext, task


@task("invoices")
def invoices(ctx: RunContext) -> None:
    for batch in range(10):
        ctx.check()  # stop promptly if the lease is lost or the pod is terminating
        ctx.logger.info(f"sending invoice batch {batch}", extra={"event": "progress"})


@task("ledger-sync")
def ledger_sync(ctx: RunContext) -> None:
    # The fencing token only goes up: a downstream store that keeps the highest token it has
    # seen can refuse a write from a stale holder (see docs/reliability.md).
    ctx.logger.info(f"writing with fencing token {ctx.fencing_token}", extra={"event": "progress"})
