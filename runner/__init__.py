"""cron-runner: run a scheduled job once and only once, guarded by a Redis lease."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.tasks import RunContext, task

__all__ = ["RunContext", "task"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # `from runner import task, RunContext` works as before; a process that imports only a
    # submodule (the CLI's `exec`) does not pay for runner.tasks.
    if name in __all__:
        from runner import tasks  # noqa: PLC0415

        return getattr(tasks, name)
    raise AttributeError(f"module 'runner' has no attribute {name!r}")
