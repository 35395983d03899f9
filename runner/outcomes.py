"""Outcomes: what a run or a queue worker records, and the exit code each one means
(docs/design.md, Exit codes).

One table. Each outcome says whether it is a skip (this runner did not run the slot, and that
is no failure), whether it counts as success (the slot's work is done, or handed to a worker:
anything neither a skip nor a success is a failure), and its exit code where the outcome fixes
one. Where it does not, the code comes with the result: the task's own for ``failed``; for
``skipped_held``, the policy's (runner.run.policy): 0 when the holder is running, 75 when a
holder of the same slot could not be confirmed running.

The codes are defined once, as the ``EXIT_*`` constants of :mod:`runner.errors`, which the
error classes carry too; the CLI maps an error to its code in one place (runner.cli.main).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from runner.errors import (
    EXIT_LEASE_LOST,
    EXIT_OK,
    EXIT_REPLACED,
    EXIT_TERMINATED,
    EXIT_UNAVAILABLE,
)

RAN: Final = "ran"
ENQUEUED: Final = "enqueued"
SKIPPED_HELD: Final = "skipped_held"
SKIPPED_DONE: Final = "skipped_done"
SKIPPED_STALE: Final = "skipped_stale"
TOO_LATE: Final = "too_late"
FAILED: Final = "failed"
LEASE_LOST: Final = "lease_lost"
TERMINATED: Final = "terminated"
UNAVAILABLE: Final = "unavailable"
REQUEUED: Final = "requeued"
PAUSED: Final = "paused"
REPLACED: Final = "replaced"


class Outcome(NamedTuple):
    skip: bool
    success: bool
    exit_code: int | None  # None: the result carries it (the task's own, or the policy's)
    meaning: str


# fmt: off
OUTCOMES: Final[dict[str, Outcome]] = {
    #               skip   success exit code
    RAN:           Outcome(False, True,  EXIT_OK,
                           "the task ran and succeeded; its slot is marked done"),
    ENQUEUED:      Outcome(False, True,  EXIT_OK,
                           "queue mode: the slot's one message was sent; a worker runs it"),
    SKIPPED_HELD:  Outcome(True,  False, None,
                           "another holder has the lease (0; recorded once per slot when it "
                           "ran another slot, or a later slot superseded this one), or a holder "
                           "of the same slot neither renewed nor released it within the held "
                           "wait (75)"),
    SKIPPED_DONE:  Outcome(True,  False, EXIT_OK, "the slot already ran"),
    SKIPPED_STALE: Outcome(True,  False, EXIT_OK,
                           "a CronJob slot older than its marker's retention: it cannot be "
                           "proven unrun"),
    TOO_LATE:      Outcome(True,  False, EXIT_OK,
                           "without a Job name, started past its slot's starting deadline"),
    FAILED:        Outcome(False, False, None,
                           "the task failed: its own exit code (1 for a Python task that raised)"),
    LEASE_LOST:    Outcome(False, False, EXIT_LEASE_LOST,
                           "the lease was lost during the run; the task was stopped"),
    TERMINATED:    Outcome(False, False, EXIT_TERMINATED,
                           "a stop signal stopped the run; the lease was released"),
    UNAVAILABLE:   Outcome(False, False, EXIT_UNAVAILABLE,
                           "Redis unreachable within the connect deadline; the task did not run"),
    REQUEUED:      Outcome(True,  False, EXIT_OK,
                           "queue worker: stopped by the shutdown and put back on its queue"),
    PAUSED:        Outcome(True,  False, EXIT_OK,
                           "the task is paused (cron-runner pause): not run, recorded once per slot"),
    REPLACED:      Outcome(False, False, EXIT_REPLACED,
                           "overlap replace: a run of a newer slot asked this one to stop; the "
                           "task was stopped, the slot marked done (not to be retried)"),
}
# fmt: on


def exit_code(outcome: str, otherwise: int | None = None) -> int:
    """The exit code of ``outcome``: its fixed one, else ``otherwise`` (the task's own code,
    or the policy's), which such an outcome must be given."""
    fixed = OUTCOMES[outcome].exit_code
    if fixed is not None:
        return fixed
    if otherwise is None:
        raise ValueError(f"outcome {outcome!r} has no fixed exit code: the result carries it")
    return otherwise


def is_skip(outcome: str) -> bool:
    return OUTCOMES[outcome].skip


def is_failure(outcome: str) -> bool:
    row = OUTCOMES[outcome]
    return not (row.skip or row.success)
