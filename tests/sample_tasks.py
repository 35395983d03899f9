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


@task("child-codes")
def child_codes(ctx: RunContext) -> None:
    """Waits on its own subprocesses, polling as a slow loop would, and writes their codes:
    a PID-1 runner that reaped them would turn each code into 0."""
    import subprocess  # noqa: PLC0415

    codes: list[int] = []
    for code in (7, 5):
        child = subprocess.Popen(["sh", "-c", f"sleep 0.2; exit {code}"])
        while child.poll() is None:
            time.sleep(0.02)
        codes.append(child.returncode)
    codes.append(subprocess.run(["sh", "-c", "exit 3"], check=False).returncode)
    _mark(ctx, "codes:" + ",".join(map(str, codes)))
