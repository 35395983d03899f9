"""Tasks used by the CLI tests. Side effects go to the file named by SIDE_EFFECTS, one line each."""

from __future__ import annotations

import os
import time
from pathlib import Path

from runner import RunContext, task


def _mark(ctx: RunContext, what: str) -> None:
    path = os.environ.get("SIDE_EFFECTS")
    if path:
        with Path(path).open("a") as f:
            f.write(f"{what} {ctx.holder} {ctx.fencing_token} {ctx.slot} {time.time():.3f}\n")


@task("ok")
def ok(ctx: RunContext) -> None:
    _mark(ctx, "ran")


@task("boom")
def boom(ctx: RunContext) -> None:
    raise RuntimeError("boom: the task failed on purpose")


@task("slow")
def slow(ctx: RunContext) -> None:
    """Works in small steps for TASK_SECONDS, checking between steps."""
    _mark(ctx, "start")
    end = time.monotonic() + float(os.environ.get("TASK_SECONDS", "5"))
    while time.monotonic() < end:
        ctx.check()
        _mark(ctx, "step")
        time.sleep(0.05)
    _mark(ctx, "done")


@task("stubborn")
def stubborn(ctx: RunContext) -> None:
    """Ignores cancellation: it cannot be killed inside the process."""
    _mark(ctx, "start")
    time.sleep(float(os.environ.get("TASK_SECONDS", "30")))
