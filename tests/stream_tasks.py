"""Tasks of the standard-stream and signal tests (tests/fault/test_standard_streams.py,
test_cli_signals.py). Side effects go to the file named by SIDE_EFFECTS, one line each."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from runner import RunContext, task


def _mark(line: str) -> None:
    with Path(os.environ["SIDE_EFFECTS"]).open("a") as f:
        f.write(line + "\n")


@task("streams")
def streams(ctx: RunContext) -> None:
    """Prints to stdout and stderr, then records what the runner's fds 0, 1 and 2 are."""
    print("a line to stdout")
    print("a line to stderr", file=sys.stderr)
    sys.stdout.flush()
    _mark("fds " + " ".join(os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)))
    _mark("ran")


@task("spin")
def spin(ctx: RunContext) -> None:
    """Burns CPU until cancelled: the runner's own CPU time, which RLIMIT_CPU counts."""
    _mark("start")
    while True:
        ctx.check()
