"""The journal: the one schema of what runs leave in Redis about themselves (docs/design.md).

Two records, both written in the finish script that releases or completes the lease
(runner.lease.scripts, FINISH), or in its record mode when there is no lease to touch:

- the **run record**, one entry of the task's run stream (``XADD``): one run, as ``history``
  lists it;
- the **state hash**: the task's last run, its last success, last failure and last enqueue,
  and what the watchdog judges it by (schedule, time zone, max runtime).

Writers: a run (runner.run.execution, through its ``Lease``), a queue worker for each job
(runner.queue.actors: through the task's ``Lease`` for a job of a slot, through
``record_unleased`` for a Producer's), the admin commands (``unlock``, ``ack``, ``pause`` and
``resume`` add a record; the watchdog adds ``expected_since``, ``ledger_until`` and
``max_runtime_ms``; ``pause`` and ``resume`` the pause's window). Readers: ``status``,
``history``, ``serve`` and the watchdog
(runner.ops.state). Every name and value here is read by the previous release too: change
none, only add.

Where a worker's writes differ from a run's, on purpose:

- its record carries ``message_id`` (the Dramatiq message; ``''`` when unknown), after
  ``duration_ms`` and before ``error``;
- its state sets neither ``schedule``, ``timezone`` nor ``max_runtime_ms``: those are the
  enqueueing CronJob's, which its run stores; a worker leaves them as they are;
- its state is written unfenced: a later slot's enqueue may take a higher fence while the
  job still runs (the fence a job of a slot records is its own lease's; a Producer's job has
  none, 0);
- its outcomes are a run's (``ran``, ``failed``, ``lease_lost``, ``replaced``, and the skips,
  which write no state); a job put back records nothing; so it never touches the
  ``last_enqueued_*`` summary, which only an enqueueing run writes;
- its holder is the worker's id, and ``last_slot`` is written only for a job with a slot.
"""

from __future__ import annotations

from typing import Any

from runner.keys import TaskKeys
from runner.lease.scripts import Finished, finish, finished
from runner.outcomes import ENQUEUED, RAN

Fields = dict[str, str | int | float]

# -- the run record (one stream entry) ----------------------------------------------------------
SLOT = "slot"  # '' for a manual run (and for a skipped_stale one: see runner.run.execution)
HOLDER = "holder"
FENCE = "fence"
OUTCOME = "outcome"
EXIT_CODE = "exit_code"
STARTED_AT = "started_at"  # epoch seconds, 3 decimals
DURATION_MS = "duration_ms"
MESSAGE_ID = "message_id"  # a queue worker's only
TRIGGER = "trigger"  # `cron-runner trigger`'s run (no slot): the holder that ran it
BACKFILL = "backfill"  # a slot `cron-runner backfill` ran: the holder that ran it
ERROR = "error"  # only when there is one, cut to ERROR_MAX_CHARS
UNLOCKED = "unlocked"  # an unlock's record: the token it removed (the UNLOCK script writes it)
NOTE = "note"  # a pause's or resume's record: the pause's note (runner.ops.pause)
PAUSED_UNTIL = "paused_until"  # a pause's record: when it ends by itself, '' until resumed
ERROR_MAX_CHARS = 500

# -- the state hash ---------------------------------------------------------------------------
LAST_RUN_AT = "last_run_at"
LAST_OUTCOME = "last_outcome"
LAST_FENCE = "last_fence"  # also what a finish compares before it writes the hash (FINISH)
LAST_HOLDER = "last_holder"
LAST_SLOT = "last_slot"
SCHEDULE = "schedule"
TIMEZONE = "timezone"
MAX_RUNTIME_MS = "max_runtime_ms"  # a run holding the lease longer is reported
LAST_FAILURE_OUTCOME = "last_failure_outcome"
LAST_FAILURE_EXIT_CODE = "last_failure_exit_code"
#: When a watchdog was first told to expect a task that had not run yet.
EXPECTED_SINCE = "expected_since"
#: The watchdog's ledger has judged every fire time up to here (epoch seconds).
LEDGER_UNTIL = "ledger_until"
#: '1' once the task is in its scope's index (Lease.index).
INDEXED = "indexed"
#: The last pause's window (epoch seconds; PAUSED_TO '' while it lasts with no end): its slots
#: are not missed (runner.ops.pause).
PAUSED_FROM = "paused_from"
PAUSED_TO = "paused_to"

# Three summaries, each three fields: ``<summary>_at``, ``<summary>_duration_ms`` and, for a
# run with a slot, ``<summary>_slot``.
LAST_SUCCESS = "last_success"
LAST_FAILURE = "last_failure"
LAST_ENQUEUED = "last_enqueued"  # queue mode: an enqueue is not the task's success
# Every outcome but these two that reaches the state hash is a failure (runner.outcomes: the
# skips record no state).
_SUMMARY_OF = {RAN: LAST_SUCCESS, ENQUEUED: LAST_ENQUEUED}


def summary_of(outcome: str) -> str:
    """Which summary of the state hash an outcome updates."""
    return _SUMMARY_OF.get(outcome, LAST_FAILURE)


def at_field(summary: str) -> str:
    return f"{summary}_at"


def duration_field(summary: str) -> str:
    return f"{summary}_duration_ms"


def slot_field(summary: str) -> str:
    return f"{summary}_slot"


def timestamp(t_s: float) -> str:
    """Times are stored as epoch seconds with three decimals."""
    return f"{t_s:.3f}"


def run_record(
    *,
    slot: int | None,
    holder: str,
    fence: int,
    outcome: str,
    exit_code: int,
    started_at_s: float,
    duration_ms: int,
    error: str | None = None,
    message_id: str | None = None,
    trigger: str | None = None,
    backfill: str | None = None,
) -> Fields:
    """One entry of the run stream. ``message_id``: a queue worker's job (None for a run).
    ``trigger`` and ``backfill``: an operator asked for the run (runner.cli.manual)."""
    record: Fields = {
        SLOT: "" if slot is None else slot,
        HOLDER: holder,
        FENCE: fence,
        OUTCOME: outcome,
        EXIT_CODE: exit_code,
        STARTED_AT: timestamp(started_at_s),
        DURATION_MS: duration_ms,
    }
    if message_id is not None:
        record[MESSAGE_ID] = message_id
    if trigger is not None:
        record[TRIGGER] = trigger
    if backfill is not None:
        record[BACKFILL] = backfill
    if error:
        record[ERROR] = error[:ERROR_MAX_CHARS]
    return record


def admin_record(outcome: str, holder: str, at_s: float) -> Fields:
    """The record of an admin's act (``unlock``, ``ack``): who, when, no run behind it."""
    return {OUTCOME: outcome, HOLDER: holder, STARTED_AT: timestamp(at_s), DURATION_MS: 0}


def state(
    *,
    outcome: str,
    exit_code: int,
    fence: int,
    holder: str,
    slot: int | None,
    at_s: float,
    duration_ms: int,
    schedule: str | None = None,
    timezone: str = "UTC",
    max_runtime_s: float | None = None,
) -> Fields:
    """The state hash's fields for an outcome. ``schedule`` (with its ``timezone``) and
    ``max_runtime_s``: a run's settings, stored for status and the watchdog; a queue worker
    passes neither, and the hash keeps the enqueueing run's."""
    now = timestamp(at_s)
    fields: Fields = {
        LAST_RUN_AT: now,
        LAST_OUTCOME: outcome,
        LAST_FENCE: fence,
        LAST_HOLDER: holder,
    }
    if slot is not None:
        fields[LAST_SLOT] = slot
    if schedule:
        fields[SCHEDULE] = schedule
        fields[TIMEZONE] = timezone
    if max_runtime_s:
        fields[MAX_RUNTIME_MS] = int(max_runtime_s * 1000)
    summary = summary_of(outcome)
    fields[at_field(summary)] = now
    fields[duration_field(summary)] = duration_ms
    if slot is not None:
        fields[slot_field(summary)] = slot
    if summary == LAST_FAILURE:
        fields[LAST_FAILURE_OUTCOME] = outcome
        fields[LAST_FAILURE_EXIT_CODE] = exit_code
    return fields


# The finish script's record mode, as Lease.record calls it: an empty token (no owner check,
# the lease untouched), no slot marker; the retention is only read with a marker. The flags
# after the fence (keep the lease, a marker key given, the task's lease given, the failure
# count, pause after N, who pauses, the minimum while paused) are all off.
_RECORD_TOKEN = ""
_RECORD_RETENTION_MS = 3_600_000
_UNFENCED = ""


def record_unleased(
    client: Any, keys: TaskKeys, record: Fields, state_fields: Fields, *, runs_maxlen: int
) -> Finished:
    """Write a record and the state for an outcome that holds no lease (a queue worker's job),
    in one round trip, unfenced (see the module's docstring); then, the first time, add the
    task to its scope's index, as a run's finish does.

    Raises ``FinishIncomplete`` when the script could not make every write (an ACL refusal, a
    key of the wrong type), and what Redis raises when it cannot be reached.
    """
    status = finish(
        client, keys, lease_key=keys.lease, token=_RECORD_TOKEN, runs_maxlen=runs_maxlen,
        retention_ms=_RECORD_RETENTION_MS, fence=_UNFENCED, record=record, state=state_fields,
    )  # fmt: skip
    return finished(client, keys, "record", status, retention_ms=_RECORD_RETENTION_MS,
                    index=bool(state_fields))  # fmt: skip
