"""cron-runner: run a scheduled job once and only once, guarded by a Redis lease."""

from runner.tasks import RunContext, task

__all__ = ["RunContext", "task"]
__version__ = "0.1.0"
