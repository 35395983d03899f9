"""What runs leave in Redis, read back: lease, fence, state hash, run stream (docs/design.md).

The state hash is written by ``execution._state`` in the same script as the release or
completion; the schedule in it is what ``status`` and the watchdog judge a task by. A CronJob
pod's run stores it too: the chart sets ``CRON_RUNNER_SCHEDULE`` beside the Job name.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoPermissionError

from runner import slots
from runner.errors import ConfigError
from runner.keys import NAME_RE, TaskKeys, scope_index
from runner.lease import holder_of

#: State-hash field: when a watchdog was first told to expect a task that had not run yet.
EXPECTED_SINCE = "expected_since"
#: Missed slots listed per task; past this the listing says there are more.
MISSED_LISTED = 10


@dataclass(frozen=True)
class Result:
    """The last success or the last failure of a task."""

    at: float
    slot: int | None
    duration_ms: int | None
    outcome: str
    exit_code: int | None


@dataclass(frozen=True)
class Missed:
    """Fire times after the last success that should have run by now (``now - tolerance``)."""

    due_slot: int
    slots: tuple[int, ...]  # oldest first, at most MISSED_LISTED
    more: bool  # more than listed
    # The latest missed slot, not counted because the lease is held: that run may be it.
    running: int | None = None


@dataclass(frozen=True)
class TaskStatus:
    task: str
    holder: str | None
    ttl_ms: int | None
    fence: int
    schedule: str | None
    timezone: str | None
    last_slot: int | None
    last_run_at: float | None
    last_outcome: str | None
    last_holder: str | None
    last_success: Result | None
    last_failure: Result | None
    next_slot: int | None
    missed: Missed | None  # None when no schedule is known: overdue cannot be judged
    schedule_error: str | None = None

    @property
    def overdue(self) -> bool | None:
        return None if self.missed is None else bool(self.missed.slots)

    @property
    def known(self) -> bool:
        """Ran, runs, or is expected by the watchdog: anything but a name Redis has never seen
        (or one left in the scope's index by an older release's `forget`, which does not
        remove it from there)."""
        return self.holder is not None or self.schedule is not None or (
            self.last_run_at is not None or self.last_slot is not None
            or self.last_success is not None or self.last_failure is not None
        )  # fmt: skip


@dataclass(frozen=True)
class RunRecord:
    id: str
    started_at: float | None
    slot: int | None
    holder: str | None
    fence: int | None
    outcome: str | None
    exit_code: int | None
    duration_ms: int | None
    error: str | None
    unlocked: str | None  # for an unlock: the holder whose lease was removed


def _int(value: Any) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _result(state: dict[str, str], kind: str) -> Result | None:
    at = _float(state.get(f"last_{kind}_at"))
    if at is None:
        return None
    return Result(
        at=at,
        slot=_int(state.get(f"last_{kind}_slot")),
        duration_ms=_int(state.get(f"last_{kind}_duration_ms")),
        outcome="ran" if kind == "success" else state.get("last_failure_outcome", "failed"),
        exit_code=0 if kind == "success" else _int(state.get("last_failure_exit_code")),
    )


def missed_slots(
    schedule: slots.Schedule,
    *,
    now_s: float,
    tolerance_s: float,
    covered_until_s: float,
    held: bool = False,
    limit: int = MISSED_LISTED,
) -> Missed:
    """Fire times in ``(covered_until_s, now_s - tolerance_s]``: scheduled, never succeeded.

    ``covered_until_s`` is the last successful slot (a success covers its own slot and every
    one before it). With the lease held, the latest missed slot is counted as running.
    """
    due = schedule.previous_at_or_before(now_s - tolerance_s)
    found: list[int] = []
    more = False
    t = covered_until_s
    while (fire := schedule.next_after(t)) <= due:
        if len(found) == limit:
            more = True
            break
        found.append(fire)
        t = fire
    running = found.pop() if held and found and not more else None
    return Missed(due_slot=due, slots=tuple(found), more=more, running=running)


# How old a recorded slot may be: its schedule's marker retention, or this when longer (an
# explicit CRON_RUNNER_SLOT_RETENTION is not stored; this is the fallback retention).
PLAUSIBLE_AGE_S = 7 * 86_400.0


def plausible_slot(schedule: slots.Schedule, slot: int, at_s: float) -> int:
    """The slot a run recorded at ``at_s`` claimed, if a run then could have claimed it: not
    after the next fire time (a slot is claimed at most the skew tolerance early) nor older
    than the marker retention (older slots are not run). Otherwise, as a Job name from
    another day or a release that did not check would give, the fire time at or before
    ``at_s``: status and the watchdog are never moved by an implausible slot."""
    oldest = at_s - max(schedule.retention_s, PLAUSIBLE_AGE_S)
    if oldest <= slot <= schedule.next_after(at_s):
        return slot
    return schedule.previous_at_or_before(at_s)


def record_of(entry_id: str, fields: dict[str, str]) -> RunRecord:
    return RunRecord(
        id=entry_id,
        started_at=_float(fields.get("started_at")),
        slot=_int(fields.get("slot")),
        holder=fields.get("holder") or None,
        fence=_int(fields.get("fence")),
        outcome=fields.get("outcome") or None,
        exit_code=_int(fields.get("exit_code")),
        duration_ms=_int(fields.get("duration_ms")),
        error=fields.get("error") or None,
        unlocked=holder_of(fields["unlocked"]) if fields.get("unlocked") else None,
    )


class Reader:
    """Reads one scope's tasks. Every task's keys share a hash slot, so one pipeline per task."""

    def __init__(self, client: Any, prefix: str, scope: str) -> None:
        self.client = client
        self.prefix = prefix
        self.scope = scope

    def keys(self, task: str) -> TaskKeys:
        return TaskKeys(self.prefix, self.scope, task)

    def tasks(self) -> list[str]:
        """The scope's tasks: those in its index (every task that has finished a run under
        this release, or that a watchdog expects), and, where the ACL allows SCAN, every task
        with a state hash or a lease (a first run in progress, or runs of an older release).

        A per-scope ACL leaves SCAN out: it would list every scope's key names."""
        found: set[str] = set()
        refused: NoPermissionError | None = None
        for read in (self._indexed, self._scanned):
            try:
                found |= read()
            except NoPermissionError as exc:  # an ACL from before the index lacks +smembers
                if refused is not None:
                    raise
                refused = exc
        # Not a name a task can have: check's scratch task (keys.SCRATCH_TASK_PREFIX).
        return sorted(t for t in found if NAME_RE.match(t))

    def _indexed(self) -> set[str]:
        return {str(t) for t in self.client.smembers(scope_index(self.prefix, self.scope))}

    def _scanned(self) -> set[str]:
        # Prefix and scope are validated (keys.py): no glob character can appear in them.
        base = f"{self.prefix}:{{{self.scope}:"
        pattern = re.compile(re.escape(base) + r"(?P<task>[^{}:]+)\}:(?:state|lease)\Z")
        found: set[str] = set()
        for suffix in ("state", "lease"):
            for key in self.client.scan_iter(match=f"{base}*}}:{suffix}", count=1000):
                match = pattern.match(key)
                if match:
                    found.add(match["task"])
        return found

    def status(self, task: str, *, now_s: float, tolerance_s: float) -> TaskStatus:
        keys = self.keys(task)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(keys.lease)
        pipe.pttl(keys.lease)
        pipe.get(keys.fence)
        pipe.hgetall(keys.state)
        token, pttl_ms, fence, state = pipe.execute()
        state = dict(state or {})
        held = token is not None
        schedule_expr = state.get("schedule") or None
        timezone = state.get("timezone") or ("UTC" if schedule_expr else None)
        last_success = _result(state, "success")
        next_slot: int | None = None
        missed: Missed | None = None
        schedule_error: str | None = None
        if schedule_expr:
            try:
                schedule = slots.Schedule.parse(schedule_expr, timezone or "UTC", 0.0)
                # A run may claim a slot up to the tolerance early, so the slot it recorded can
                # still lie ahead of now: the next slot is the one after both.
                last_slot = _int(state.get("last_slot")) or 0
                if last_slot > schedule.next_after(now_s):
                    last_slot = 0  # implausible: no run can have claimed a slot that far ahead
                next_slot = schedule.next_after(max(now_s, last_slot))
                covered = self._covered_until(task, schedule, last_success, state)
                if covered is not None:
                    missed = missed_slots(
                        schedule,
                        now_s=now_s,
                        tolerance_s=tolerance_s,
                        covered_until_s=covered,
                        held=held,
                    )
            except ConfigError as exc:
                schedule_error = str(exc)
        return TaskStatus(
            task=task,
            holder=holder_of(token) if held else None,
            ttl_ms=int(pttl_ms) if held and int(pttl_ms) >= 0 else None,
            fence=_int(fence) or 0,
            schedule=schedule_expr,
            timezone=timezone,
            last_slot=_int(state.get("last_slot")),
            last_run_at=_float(state.get("last_run_at")),
            last_outcome=state.get("last_outcome") or None,
            last_holder=state.get("last_holder") or None,
            last_success=last_success,
            last_failure=_result(state, "failure"),
            next_slot=next_slot,
            missed=missed,
            schedule_error=schedule_error,
        )

    def _covered_until(
        self,
        task: str,
        schedule: slots.Schedule,
        last_success: Result | None,
        state: dict[str, str],
    ) -> float | None:
        """Up to when the schedule is known to be served: the last successful slot; for a task
        that never succeeded, just before the first slot it tried (its oldest record); for one
        that never ran at all, the time a watchdog was first told to expect it."""
        if last_success is not None:
            if last_success.slot is None:
                return last_success.at
            return float(plausible_slot(schedule, last_success.slot, last_success.at))
        oldest = self.client.xrange(self.keys(task).runs, count=1)
        if not oldest:
            return _float(state.get(EXPECTED_SINCE))
        first = record_of(*oldest[0])
        if first.started_at is None:
            return None if first.slot is None else float(first.slot - 1)
        slot = schedule.previous_at_or_before(first.started_at)
        if first.slot is not None:
            slot = plausible_slot(schedule, first.slot, first.started_at)
        return float(slot - 1)

    def expect(self, task: str, schedule: str, timezone: str, *, now_s: float) -> None:
        """Make a task known before it first runs (``watchdog --expect``), so that a CronJob
        that never fires is overdue too. Fields already there are kept: the first expectation
        dates it, and a run's own schedule stays until its next run rewrites it."""
        keys = self.keys(task)
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(keys.state, EXPECTED_SINCE, f"{now_s:.3f}")
        pipe.hsetnx(keys.state, "schedule", schedule)
        pipe.hsetnx(keys.state, "timezone", timezone)
        pipe.sadd(keys.index, task)
        *written, indexed = pipe.execute(raise_on_error=False)
        for reply in written:
            if isinstance(reply, Exception):
                raise reply
        # An ACL from before the index lacks +sadd: its SCAN finds the task anyway.
        if isinstance(indexed, Exception) and not isinstance(indexed, NoPermissionError):
            raise indexed

    def forget(self, task: str) -> int:
        """Delete a task's state and history (not its fence, which must never go back, nor its
        slot markers, which expire): it is no longer known to status and the watchdog."""
        keys = self.keys(task)
        deleted = int(self.client.delete(keys.state, keys.runs))
        # An ACL from before the index lacks +srem, and then +sadd too: nothing to remove.
        with contextlib.suppress(NoPermissionError):
            self.client.srem(keys.index, task)
        return deleted

    def history(self, task: str, count: int) -> list[RunRecord]:
        entries = self.client.xrevrange(self.keys(task).runs, count=count)
        return [record_of(entry_id, fields) for entry_id, fields in entries]
