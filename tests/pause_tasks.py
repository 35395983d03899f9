"""Tasks of the pause tests (tests/integration/test_pause.py). Side effects go to the file named
by SIDE_EFFECTS, one line each."""

from __future__ import annotations

import os
from pathlib import Path

from runner import RunContext, task


@task("fragile", pause_on_failures=2)
def fragile(ctx: RunContext) -> None:
    """Fails unless FRAGILE=ok; pauses itself after two failures in a row."""
    path = os.environ.get("SIDE_EFFECTS")
    if path:
        with Path(path).open("a") as f:
            f.write(f"ran {ctx.holder}\n")
    if os.environ.get("FRAGILE") != "ok":
        raise RuntimeError("fragile: failed on purpose")
