"""What runs leave in Redis, read back: lease, fence, state hash, run stream (docs/design.md).

The state hash and the run records follow one schema, runner.lease.journal, whose names are
read here; the schedule in the state is what ``status`` and the watchdog judge a task by. A
CronJob pod's run stores it too: the chart sets ``CRON_RUNNER_SCHEDULE`` beside the Job name.
The watchdog's own writes (the ledger, ``expected_since``, ``max_runtime_ms``) live here. A
paused task (runner.ops.pause) is not overdue, and the slots its pause skipped are not missed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from runner.errors import ConfigError
from runner.keys import NAME_RE, TaskKeys, scope_index
from runner.lease import journal, replies
from runner.lease.scripts import holder_of, started_at_of
from runner.ops.pause import PAUSE, PAUSE_FIELDS, RESUME, Pause, pause_of, pause_window
from runner.outcomes import FAILED, PAUSED, RAN
from runner.schedule import slots

log = logging.getLogger("runner.ops")

#: Missed slots listed per task; past this the listing says there are more.
MISSED_LISTED = 10
#: Fire times one watchdog run judges per task at most; older ones are left to the listing.
LEDGER_SCAN_LIMIT = 1000
#: Records in the run stream that are an operator's act, not a run.
ADMIN_OUTCOMES = frozenset({"acknowledged", PAUSE, RESUME})


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
    # How many in all (the ledger's and the listing's), when ``more`` cuts the listing.
    count: int | None = None

    @property
    def total(self) -> int:
        return len(self.slots) if self.count is None else self.count


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
    running_since: float | None = None  # when the lease now held was taken (newer tokens)
    max_runtime_s: float | None = None
    now_s: float = 0.0
    paused: Pause | None = None  # the pause in force (runner.ops.pause)

    @property
    def overdue(self) -> bool | None:
        """A paused task is not overdue: what it missed before the pause stays listed, and is
        reported again once it is resumed."""
        if self.missed is None:
            return None
        return bool(self.missed.slots) and self.paused is None

    @property
    def known(self) -> bool:
        """Ran, runs, or is expected by the watchdog: anything but a name Redis has never seen
        (or one left in the scope's index by an older release's `forget`, which does not
        remove it from there)."""
        return self.holder is not None or self.schedule is not None or (
            self.last_run_at is not None or self.last_slot is not None
            or self.last_success is not None or self.last_failure is not None
            or self.paused is not None
        )  # fmt: skip

    @property
    def over_max_runtime(self) -> bool:
        """The lease is held by a run that started longer than ``max_runtime`` ago."""
        if self.running_since is None or self.max_runtime_s is None:
            return False
        return self.now_s - self.running_since > self.max_runtime_s


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
    note: str | None = None  # for a pause or a resume: the pause's note
    paused_until: float | None = None  # for a pause: when it ends by itself

    @property
    def admin(self) -> bool:
        """An operator's act (unlock, ack, pause, resume), not a run."""
        return self.unlocked is not None or self.outcome in ADMIN_OUTCOMES


def _int(value: Any) -> int | None:
    return replies.stored_int(value)


def _slot(value: Any) -> int | None:
    return replies.stored_int(value, time=True)


def _float(value: Any) -> float | None:
    """Every float a record holds is a time (epoch seconds)."""
    return replies.stored_time(value)


def _result(state: dict[str, str], summary: str) -> Result | None:
    """``summary``: journal.LAST_SUCCESS or journal.LAST_FAILURE."""
    at = _float(state.get(journal.at_field(summary)))
    if at is None:
        return None
    success = summary == journal.LAST_SUCCESS
    return Result(
        at=at,
        slot=_slot(state.get(journal.slot_field(summary))),
        duration_ms=_int(state.get(journal.duration_field(summary))),
        outcome=RAN if success else state.get(journal.LAST_FAILURE_OUTCOME, FAILED),
        exit_code=0 if success else _int(state.get(journal.LAST_FAILURE_EXIT_CODE)),
    )


def missed_slots(
    schedule: slots.Schedule,
    *,
    now_s: float,
    tolerance_s: float,
    covered_until_s: float,
    held: bool = False,
    limit: int = MISSED_LISTED,
    paused: tuple[float, float] | None = None,
) -> Missed:
    """Fire times in ``(covered_until_s, now_s - tolerance_s]``: scheduled, never succeeded.

    ``covered_until_s`` is the last successful slot (a success covers its own slot and every
    one before it). With the lease held, the latest missed slot is counted as running. Fire
    times within ``paused`` (from, to) were skipped on purpose: not missed.
    """
    due = schedule.previous_at_or_before(now_s - tolerance_s)
    found: list[int] = []
    more = False
    t = covered_until_s
    while (fire := schedule.next_after(t)) <= due:
        if paused is not None and paused[0] <= fire <= paused[1]:
            t = max(fire, paused[1])
            continue
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


def covered_until(
    schedule: slots.Schedule,
    last_success: Result | None,
    state: dict[str, str],
    oldest: list[Any],
) -> float | None:
    """Up to when the schedule is known to be served: the last successful slot; for a task
    that never succeeded, just before the first slot it tried (its oldest record); for one
    that never ran at all, the time a watchdog was first told to expect it."""
    if last_success is not None:
        if last_success.slot is None:
            return last_success.at
        return float(plausible_slot(schedule, last_success.slot, last_success.at))
    if not oldest:
        return _float(state.get(journal.EXPECTED_SINCE))
    first = record_of(*oldest[0])
    if first.started_at is None:
        return None if first.slot is None else float(first.slot - 1)
    slot = schedule.previous_at_or_before(first.started_at)
    if first.slot is not None:
        slot = plausible_slot(schedule, first.slot, first.started_at)
    return float(slot - 1)


def _merge(ledger: tuple[int, ...], tail: Missed) -> Missed:
    """The ledger's slots and the listing's, oldest first, listed up to MISSED_LISTED."""
    every = sorted(set(ledger) | set(tail.slots))
    count = len(every) + (1 if tail.more else 0)
    return Missed(
        due_slot=tail.due_slot,
        slots=tuple(every[:MISSED_LISTED]),
        more=tail.more or len(every) > MISSED_LISTED,
        running=tail.running,
        count=count if tail.more or len(every) > MISSED_LISTED else None,
    )


def _ledger_of(task: str, reply: Any) -> list[int]:
    """A task's missed-slot ledger (ZRANGE), each member a slot; a member no runner wrote (a
    forged or damaged one) is reported and left out, and the rest of the ledger stands."""
    slots_: list[int] = []
    for member in replies.members(reply, f"{task}: the missed-slot ledger"):
        slot = replies.slot_member(member)
        if slot is None:
            log.warning(
                f"{task}: the missed-slot ledger holds {member[:40]!r}, which is not a slot: "
                "left out (`cron-runner ack` with --all removes the ledger's members)",
                extra={"event": "unreadable", "task": task},
            )
        else:
            slots_.append(slot)
    return slots_


#: What the ledger reads of a slot marker: a holder (the slot ran, or was enqueued) and
#: ``skipped`` (protocol 3: why the slot did not run; a skip counter alone is not a run).
MARKER_FIELDS = ("holder", "skipped")


def _marked(reply: Any) -> tuple[bool, bool]:
    """(ran, skipped because the task was paused) from a marker's MARKER_FIELDS. A marker that
    cannot be read counts as not run, so the ledger keeps reporting its slot until
    acknowledged."""
    if isinstance(reply, Exception):
        return False, False
    try:
        holder, skipped = replies.fields(reply, len(MARKER_FIELDS), "slot marker")
    except replies.UnexpectedReply:
        return False, False
    return holder is not None, skipped == PAUSED


def heartbeat_of(raw: str | None) -> Heartbeat | None:
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        return Heartbeat(
            at=float(doc["at"]),
            holder=str(doc["holder"]),
            ttl_s=float(doc["ttl_s"]),
            checked=int(doc["checked"]),
            overdue=int(doc["overdue"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def record_of(entry_id: str, fields: dict[str, str]) -> RunRecord:
    return RunRecord(
        id=entry_id,
        started_at=_float(fields.get(journal.STARTED_AT)),
        slot=_slot(fields.get(journal.SLOT)),
        holder=fields.get(journal.HOLDER) or None,
        fence=_int(fields.get(journal.FENCE)),
        outcome=fields.get(journal.OUTCOME) or None,
        exit_code=_int(fields.get(journal.EXIT_CODE)),
        duration_ms=_int(fields.get(journal.DURATION_MS)),
        error=fields.get(journal.ERROR) or None,
        unlocked=holder_of(fields[journal.UNLOCKED]) if fields.get(journal.UNLOCKED) else None,
        note=fields.get(journal.NOTE),
        paused_until=_float(fields.get(journal.PAUSED_UNTIL)),
    )


@dataclass(frozen=True)
class Heartbeat:
    """What the last watchdog run left; gone once its TTL passes without another run."""

    at: float
    holder: str
    ttl_s: float
    checked: int
    overdue: int


def heartbeat_key(prefix: str, scope: str) -> str:
    # The scope index's hash tag (`{scope:}`, keys.scope_index): the per-scope ACL pattern
    # covers it, and no task's key can have that name or match the tasks() scan.
    return f"{prefix}:{{{scope}:}}:watchdog"


class Reader:
    """Reads one scope's tasks. Every task's keys share a hash slot, so one pipeline per task."""

    def __init__(self, client: Any, prefix: str, scope: str) -> None:
        self.client = client
        self.prefix = prefix
        self.scope = scope
        # Tasks whose records could not be read, and why: reported and left out, alone.
        self.unreadable: dict[str, str] = {}

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
        key = scope_index(self.prefix, self.scope)
        try:
            return set(
                replies.members(replies.answered(lambda: self.client.smembers(key), key), key)
            )
        except ResponseError as exc:
            if isinstance(exc, NoPermissionError):
                raise
            # A damaged index (a key of another type): SCAN, where allowed, still finds them.
            log.warning(
                f"the scope's task index {key} cannot be read ({exc}): the tasks are found by "
                "SCAN alone, where the ACL allows it; mend the key (a set of the task names)",
                extra={"event": "unreadable"},
            )
            return set()

    def _scanned(self) -> set[str]:
        # Prefix and scope are validated (keys.py): no glob character can appear in them.
        base = f"{self.prefix}:{{{self.scope}:"
        # Only names a run could have written (keys.py): a key planted under any other name is
        # not a task, and must not reach a page or a label.
        pattern = re.compile(
            re.escape(base) + r"(?P<task>[A-Za-z0-9][A-Za-z0-9_.-]{0,62})\}:(?:state|lease)\Z"
        )
        found: set[str] = set()
        for suffix in ("state", "lease"):
            scanned = replies.answered(
                lambda: list(self.client.scan_iter(match=f"{base}*}}:{suffix}", count=1000)),  # noqa: B023 - called at once
                "SCAN",
            )
            for key in replies.members(scanned, "SCAN"):
                match = pattern.match(key)
                if match:
                    found.add(match["task"])
        return found

    def status(self, task: str, *, now_s: float, tolerance_s: float) -> TaskStatus:
        return self.statuses([task], now_s=now_s, tolerance_s=tolerance_s)[0]

    def statuses(self, tasks: list[str], *, now_s: float, tolerance_s: float) -> list[TaskStatus]:
        """Every task's status in two pipelined round trips, however many tasks there are:
        `serve` reads a thousand tasks per scrape this way."""
        per_task = 7
        pipe = self.client.pipeline(transaction=False)
        for task in tasks:
            keys = self.keys(task)
            pipe.get(keys.lease)
            pipe.pttl(keys.lease)
            pipe.get(keys.fence)
            pipe.hgetall(keys.state)
            pipe.xrange(keys.runs, count=1)
            pipe.zrange(keys.missed, 0, -1)
            pipe.hmget(keys.meta, *PAUSE_FIELDS)
        answers = (
            replies.answered(lambda: pipe.execute(raise_on_error=False), "status") if tasks else []
        )
        if len(answers) != per_task * len(tasks):
            raise replies.UnexpectedReply(
                "status", f"{len(answers)} replies to {per_task * len(tasks)} commands"
            )
        for i, reply in enumerate(answers):
            # An ACL from before the ledger lacks +zrange: misses are then judged as before. The
            # pause fields need +hmget, which every run has: without it, none is shown. Any
            # other refusal is the ACL's, for every task: no task can be read.
            if isinstance(reply, NoPermissionError) and i % per_task not in (5, 6):
                raise reply
        read: dict[str, list[Any]] = {}
        ledgers: list[list[int]] = []
        for i, task in enumerate(tasks):
            try:
                read[task] = self._decoded(task, answers[i * per_task : (i + 1) * per_task])
                self.unreadable.pop(task, None)
            except (replies.UnexpectedReply, ResponseError) as exc:
                self.report_unreadable(task, exc)
            ledgers.append(read[task][5] if task in read else [])
        ran = self._ran(tasks, ledgers)
        out = []
        for i, task in enumerate(tasks):
            if task not in read:
                continue
            unresolved = tuple(slot for slot in ledgers[i] if slot not in ran[i])
            try:
                built = self._build(
                    task, read[task], unresolved, now_s=now_s, tolerance_s=tolerance_s
                )
            except (ValueError, OverflowError) as exc:  # a value read that no schedule can place
                self.report_unreadable(task, exc)
                continue
            out.append(built)
        return out

    def report_unreadable(self, task: str, exc: Exception) -> None:
        reason = str(exc)
        if self.unreadable.get(task) != reason:
            log.warning(
                f"{task}: its records in Redis cannot be read ({reason}): left out; the other "
                "tasks are read as usual",
                extra={"event": "unreadable", "task": task},
            )
        self.unreadable[task] = reason

    @staticmethod
    def _decoded(task: str, read: list[Any]) -> list[Any]:
        """One task's pipelined replies (lease, its PTTL, fence, state hash, oldest run
        record, ledger, pause fields), each checked; raises what the first bad one gives."""
        token, pttl_ms, fence, state, oldest, ledger, pause_fields = read
        for reply in (token, pttl_ms, fence, state, oldest):
            if isinstance(reply, Exception):
                raise reply
        return [
            replies.optional_text(token, f"{task}: the lease"),
            replies.integer(pttl_ms, f"{task}: the lease's PTTL"),
            replies.optional_text(fence, f"{task}: the fence"),
            replies.string_hash(state, f"{task}: the state hash"),
            replies.entries(oldest, f"{task}: the run stream"),
            [] if isinstance(ledger, Exception) else _ledger_of(task, ledger),
            None if isinstance(pause_fields, Exception)
            else replies.fields(pause_fields, len(PAUSE_FIELDS), f"{task}: the meta hash"),
        ]  # fmt: skip

    def _ran(self, tasks: list[str], ledgers: list[list[int]]) -> list[set[int]]:
        """For each task, the ledger's slots that have run since (their marker names a holder:
        a marker may also hold no more than the skips of a slot that did not run)."""
        if not any(ledgers):
            return [set() for _ in tasks]
        pipe = self.client.pipeline(transaction=False)
        for task, ledger in zip(tasks, ledgers, strict=True):
            for slot in ledger:
                pipe.hmget(self.keys(task).slot(slot), *MARKER_FIELDS)
        found = iter(replies.answered(lambda: pipe.execute(raise_on_error=False), "slot markers"))
        return [{slot for slot in ledger if _marked(next(found))[0]} for ledger in ledgers]

    @staticmethod
    def _build(
        task: str, read: list[Any], ledger: tuple[int, ...], *, now_s: float, tolerance_s: float
    ) -> TaskStatus:
        """One task's status from its pipelined replies: lease, its PTTL, fence, state hash,
        oldest run record, ledger, the meta hash's pause fields."""
        token, pttl_ms, fence, state, oldest, _, pause_fields = read
        held = token is not None
        paused = None if pause_fields is None else pause_of(pause_fields, now_s)
        schedule_expr = state.get(journal.SCHEDULE) or None
        timezone = state.get(journal.TIMEZONE) or ("UTC" if schedule_expr else None)
        last_success = _result(state, journal.LAST_SUCCESS)
        next_slot: int | None = None
        missed: Missed | None = None
        schedule_error: str | None = None
        if schedule_expr:
            try:
                schedule = slots.Schedule.parse(schedule_expr, timezone or "UTC", 0.0)
                # A run may claim a slot up to the tolerance early, so the slot it recorded can
                # still lie ahead of now: the next slot is the one after both.
                last_slot = _slot(state.get(journal.LAST_SLOT)) or 0
                if last_slot > schedule.next_after(now_s):
                    last_slot = 0  # implausible: no run can have claimed a slot that far ahead
                next_slot = schedule.next_after(max(now_s, last_slot))
                covered = covered_until(schedule, last_success, state, oldest)
                if covered is not None:
                    # The ledger holds what a watchdog found missed up to ledger_until; the
                    # fire times after that are judged as before, a success covering the
                    # earlier ones, until a watchdog looks at each one's slot marker. In queue
                    # mode a marker only says enqueued: the listing keeps judging from the
                    # workers' last success, so a job no worker ran stays listed.
                    queued = bool(state.get(journal.at_field(journal.LAST_ENQUEUED)))
                    judged = None if queued else _float(state.get(journal.LEDGER_UNTIL))
                    tail = missed_slots(
                        schedule,
                        now_s=now_s,
                        tolerance_s=tolerance_s,
                        covered_until_s=max(covered, judged or covered),
                        held=held,
                        paused=pause_window(paused, state, now_s),
                    )
                    missed = _merge(ledger, tail)
            except ConfigError as exc:
                schedule_error = str(exc)
        max_runtime_ms = _int(state.get(journal.MAX_RUNTIME_MS))
        return TaskStatus(
            task=task,
            holder=holder_of(token) if token is not None else None,
            ttl_ms=pttl_ms if held and pttl_ms >= 0 else None,
            fence=_int(fence) or 0,
            schedule=schedule_expr,
            timezone=timezone,
            last_slot=_slot(state.get(journal.LAST_SLOT)),
            last_run_at=_float(state.get(journal.LAST_RUN_AT)),
            last_outcome=state.get(journal.LAST_OUTCOME) or None,
            last_holder=state.get(journal.LAST_HOLDER) or None,
            last_success=last_success,
            last_failure=_result(state, journal.LAST_FAILURE),
            next_slot=next_slot,
            missed=missed,
            schedule_error=schedule_error,
            running_since=started_at_of(token) if token is not None else None,
            max_runtime_s=max_runtime_ms / 1000 if max_runtime_ms else None,
            now_s=now_s,
            paused=paused,
        )

    # -- the missed-slot ledger (written by the watchdog and `ack`, read by everyone) ------

    def scan_ledger(self, task: str, *, now_s: float, tolerance_s: float) -> list[int]:
        """:meth:`judge_ledger`, or nothing under an ACL from before the ledger (no +zrange,
        +exists, +zadd or +zrem): then misses are judged as before, a success covering the
        earlier ones."""
        try:
            return self.judge_ledger(task, now_s=now_s, tolerance_s=tolerance_s)
        except NoPermissionError as exc:
            log.warning(
                f"the missed-slot ledger is off for {task}: the ACL user may not use it ({exc}); "
                "add +zrange +exists +zadd +zrem (docs/reliability.md)",
                extra={"event": "ledger_refused", "task": task},
            )
            return []
        except (replies.UnexpectedReply, ResponseError) as exc:
            # A damaged record of this task (a key of the wrong type, a value no runner wrote):
            # this task is not judged, every other one is.
            self.report_unreadable(task, exc)
            return []

    def judge_ledger(self, task: str, *, now_s: float, tolerance_s: float) -> list[int]:
        """Judge the fire times since the last scan by their slot markers, and record those
        that passed with no run in the ledger, where they stay whatever later slots do, until
        they run (their marker names a holder) or are acknowledged. Returns the slots added.

        A slot still within the lease of a run now going (the latest due one) is judged at the
        next scan. In queue mode a slot's marker means it was enqueued: the ledger judges the
        enqueue, and the listing after the worker's last success still catches a worker that
        never ran it. A slot the task's pause skipped is not missed: within the last pause's
        window (runner.ops.pause), or marked skipped as paused by the run that found it so.
        """
        keys = self.keys(task)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(keys.lease)
        pipe.hgetall(keys.state)
        pipe.xrange(keys.runs, count=1)
        pipe.zrange(keys.missed, 0, -1)
        pipe.hmget(keys.meta, *PAUSE_FIELDS)
        token, state, oldest, ledger, pause_fields = replies.answered(pipe.execute, "watchdog")
        token = replies.optional_text(token, f"{task}: the lease")
        state = replies.string_hash(state, f"{task}: the state hash")
        oldest = replies.entries(oldest, f"{task}: the run stream")
        pause_fields = replies.fields(pause_fields, len(PAUSE_FIELDS), f"{task}: the meta hash")
        window = pause_window(pause_of(pause_fields, now_s), state, now_s)
        if not state.get(journal.SCHEDULE):
            return []
        try:
            schedule = slots.Schedule.parse(
                state[journal.SCHEDULE], state.get(journal.TIMEZONE) or "UTC", 0
            )
        except ConfigError:
            return []
        start = _float(state.get(journal.LEDGER_UNTIL))
        if start is None:
            start = covered_until(schedule, _result(state, journal.LAST_SUCCESS), state, oldest)
        if start is None:
            return []
        due = schedule.previous_at_or_before(now_s - tolerance_s)
        fires: list[int] = []
        t = start
        while (fire := schedule.next_after(t)) <= due:
            if window is not None and window[0] <= fire <= window[1]:
                t = max(fire, window[1])
                continue
            fires.append(fire)
            t = fire
        fires = fires[-LEDGER_SCAN_LIMIT:]
        judged_until = max(start, due)
        if token is not None and fires:
            judged_until = fires.pop() - 1  # maybe the run holding the lease now
        resolved = _ledger_of(task, ledger)
        pipe = self.client.pipeline(transaction=False)
        for slot in (*fires, *resolved):
            pipe.hmget(keys.slot(slot), *MARKER_FIELDS)
        marks = (
            [_marked(m) for m in replies.answered(lambda: pipe.execute(raise_on_error=False), task)]
            if fires or resolved
            else []
        )
        new = [slot for slot, (ran_, paused) in zip(fires, marks, strict=False)
               if not ran_ and not paused]  # fmt: skip
        ran = [slot for slot, (ran_, _) in zip(resolved, marks[len(fires) :], strict=True) if ran_]
        pipe = self.client.pipeline(transaction=False)
        if new:
            pipe.zadd(keys.missed, {str(slot): slot for slot in new}, nx=True)
        if ran:
            pipe.zrem(keys.missed, *(str(slot) for slot in ran))
        pipe.hset(keys.state, journal.LEDGER_UNTIL, journal.timestamp(judged_until))
        pipe.execute()
        return new

    def beat(self, heartbeat: Heartbeat) -> None:
        """Leave the watchdog's heartbeat; it expires unless the next run renews it."""
        key = heartbeat_key(self.prefix, self.scope)
        value = json.dumps(dataclasses.asdict(heartbeat))
        self.client.set(key, value, px=max(1, int(heartbeat.ttl_s * 1000)))

    def heartbeat(self) -> Heartbeat | None:
        key = heartbeat_key(self.prefix, self.scope)
        return heartbeat_of(
            replies.optional_text(replies.answered(lambda: self.client.get(key), key), key)
        )

    def ledger(self, task: str) -> list[int]:
        key = self.keys(task).missed
        return _ledger_of(task, replies.answered(lambda: self.client.zrange(key, 0, -1), key))

    def acknowledge(self, task: str, slot: int, record: journal.Fields) -> bool:
        """Drop ``slot`` from the ledger and record who acknowledged it (``record``, from
        journal.admin_record); False if absent."""
        keys = self.keys(task)
        if not self.client.zrem(keys.missed, str(slot)):
            return False
        self.client.xadd(
            keys.runs, {**record, journal.SLOT: str(slot)}, maxlen=1000, approximate=True
        )
        return True

    def expect(self, task: str, schedule: str, timezone: str, *, now_s: float) -> None:
        """Make a task known before it first runs (``watchdog --expect``), so that a CronJob
        that never fires is overdue too. Fields already there are kept: the first expectation
        dates it, and a run's own schedule stays until its next run rewrites it."""
        keys = self.keys(task)
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(keys.state, journal.EXPECTED_SINCE, journal.timestamp(now_s))
        pipe.hsetnx(keys.state, journal.SCHEDULE, schedule)
        pipe.hsetnx(keys.state, journal.TIMEZONE, timezone)
        pipe.sadd(keys.index, task)
        *written, indexed = pipe.execute(raise_on_error=False)
        for reply in written:
            if isinstance(reply, Exception):
                raise reply
        # An ACL from before the index lacks +sadd: its SCAN finds the task anyway.
        if isinstance(indexed, Exception) and not isinstance(indexed, NoPermissionError):
            raise indexed

    def set_max_runtime(self, task: str, seconds: float) -> None:
        self.client.hset(self.keys(task).state, journal.MAX_RUNTIME_MS, str(int(seconds * 1000)))

    def forget(self, task: str) -> int:
        """Delete a task's state and history (not its fence, which must never go back, nor its
        slot markers, which expire): it is no longer known to status and the watchdog."""
        keys = self.keys(task)
        deleted = int(self.client.delete(keys.state, keys.runs, keys.missed))
        # An ACL from before the index lacks +srem, and then +sadd too: nothing to remove.
        with contextlib.suppress(NoPermissionError):
            self.client.srem(keys.index, task)
        return deleted

    def history(self, task: str, count: int) -> list[RunRecord]:
        key = self.keys(task).runs
        entries = replies.entries(
            replies.answered(lambda: self.client.xrevrange(key, count=count), key), key
        )
        return [record_of(entry_id, fields) for entry_id, fields in entries]
