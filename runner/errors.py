"""The one exception hierarchy. Each error knows its exit code; cli maps it (docs/design.md, Exit codes).

The runner's own outcomes use the ``sysexits.h`` range, so that a wrapped command's own codes
(1, 2, 3, 4 are common: Laravel's ``Command::INVALID`` is 2) pass through ``exec`` without being
taken for the runner's.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_TASK_FAILED = 1
EXIT_USAGE = 64  # EX_USAGE: the command line is wrong
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: Redis unreachable within the connect deadline
EXIT_LEASE_LOST = 75  # EX_TEMPFAIL: the lease was lost during the run; a retry may succeed
EXIT_CONFIG = 78  # EX_CONFIG: a setting is wrong; retrying cannot help
# Outside sysexits and unused by common commands: overlap `replace` stopped this run for a newer
# slot. Not a retry's business (the chart's podFailurePolicy fails the Job on it).
EXIT_REPLACED = 79
EXIT_CANNOT_EXECUTE = 126  # as timeout(1) and env(1): found but not runnable
EXIT_NOT_FOUND = 127  # as timeout(1) and env(1): the command does not exist
EXIT_TERMINATED = 143  # 128 + SIGTERM, for every stop signal


class CronRunnerError(Exception):
    """Base of every error the runner raises on purpose."""

    exit_code = 1


class ConfigError(CronRunnerError):
    """Configuration error: bad cron, unknown task, bad URL, bad duration."""

    exit_code = EXIT_CONFIG


class UsageError(ConfigError):
    """The command line itself is wrong: an unknown flag, a missing argument."""

    exit_code = EXIT_USAGE


class UnknownTask(ConfigError):
    """The task name is not registered."""


class ProtocolRefused(ConfigError):
    """A newer runner marked the task's keys as needing a protocol this runner does not speak."""

    def __init__(self, mine: int, stored: str, stored_min: str, key: str) -> None:
        self.mine = mine
        super().__init__(
            f"protocol refused: this runner speaks protocol {mine}, but a runner of protocol "
            f"{stored or '?'} marked the task as needing protocol {stored_min} or later "
            f"({key}): upgrade this runner rather than run beside it"
        )


class DefinitionConflict(ConfigError):
    """Another runner of the same task name and scope stored a different definition."""

    def __init__(self, mine: str, stored: str, key: str) -> None:
        self.mine = mine
        self.stored = stored
        super().__init__(
            f"definition conflict: this runner's task is [{mine}], but the task's runners "
            f"store [{stored}] ({key}); one task with two definitions would run twice. Make "
            "them agree. To change the definition on purpose, change it everywhere, then run "
            "`cron-runner redefine TASK --force` once (or one run with CRON_RUNNER_REDEFINE=true)"
        )


class FinishIncomplete(ConfigError):
    """The finish script could not make every write: an ACL refusal, a key of the wrong type."""

    def __init__(
        self, operation: str, failed: list[str], marked: str, slot: int | None, retention_ms: int
    ) -> None:
        self.operation = operation
        self.failed = failed
        self.marked = marked
        if marked == "marked" or slot is None:
            kept = "the slot is marked done" if slot is not None else "no slot to mark"
        elif marked == "kept":
            kept = (
                f"the slot marker could not be written, so the lease is kept for "
                f"{retention_ms // 1000} s instead and the slot does not run again (after the "
                "fix, `cron-runner unlock` frees it)"
            )
        else:
            kept = "neither the slot marker nor the lease could be written"
        super().__init__(
            f"{operation}: {kept}; these writes failed (check the ACL user and the key "
            f"types): {'; '.join(failed)}"
        )


class StoreUnavailable(CronRunnerError):
    """Redis could not be reached within the connect deadline, or refused to acknowledge."""

    exit_code = EXIT_UNAVAILABLE


class LeaseLost(CronRunnerError):
    """The lease could not be confirmed, or was taken by another holder, during the run."""

    exit_code = EXIT_LEASE_LOST


class LeaseNotOwned(LeaseLost):
    """A lease script found another token (or none): this holder is stale and changed nothing."""

    def __init__(self, operation: str, current_holder: str | None) -> None:
        self.operation = operation
        self.current_holder = current_holder
        held_by = f"held by {current_holder}" if current_holder else "free"
        super().__init__(f"{operation} refused: not the lease owner (lease is {held_by})")


class Preempted(CronRunnerError):
    """Overlap ``replace``: a run of a newer slot asked this holder to stop. The renewal that
    says so has kept the lease, so the task can stop as on a stop request before it is freed."""

    exit_code = EXIT_REPLACED

    def __init__(self, asker: str, slot: int | None) -> None:
        self.asker = asker
        self.slot = slot
        super().__init__(
            f"preempted: {asker}, running slot {slot if slot is not None else '?'} under overlap "
            "replace, asked this run to stop"
        )


class Terminated(CronRunnerError):
    """A stop signal (SIGTERM, or another of runner.signals.STOP_SIGNALS) stopped the run."""

    exit_code = EXIT_TERMINATED


class Cancelled(Exception):
    """Raised by RunContext.check() inside a task when it must stop: lease lost or shutdown."""
