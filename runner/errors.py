"""The one exception hierarchy. Each error knows its exit code; cli maps it (DESIGN.md, Exit codes)."""

from __future__ import annotations


class CronRunnerError(Exception):
    """Base of every error the runner raises on purpose."""

    exit_code = 1


class ConfigError(CronRunnerError):
    """Usage or configuration error: bad cron, unknown task, bad URL, bad duration."""

    exit_code = 2


class UnknownTask(ConfigError):
    """The task name is not registered."""


class StoreUnavailable(CronRunnerError):
    """Redis could not be reached within the connect deadline, or refused to acknowledge."""

    exit_code = 3


class LeaseLost(CronRunnerError):
    """The lease could not be confirmed, or was taken by another holder, during the run."""

    exit_code = 4


class LeaseNotOwned(LeaseLost):
    """A lease script found another token (or none): this holder is stale and changed nothing."""

    def __init__(self, operation: str, current_holder: str | None) -> None:
        self.operation = operation
        self.current_holder = current_holder
        held_by = f"held by {current_holder}" if current_holder else "free"
        super().__init__(f"{operation} refused: not the lease owner (lease is {held_by})")


class TaskFailed(CronRunnerError):
    """The task raised, or the command exited non-zero (its code is passed through)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(CronRunnerError):
    """SIGTERM or SIGINT stopped the run."""

    exit_code = 143


class Cancelled(Exception):
    """Raised by RunContext.check() inside a task when it must stop: lease lost or shutdown."""
