"""What `serve` shows, read from Redis in a few pipelined round trips per refresh.

One refresh reads every task's status (two pipelines, runner/ops/state.py), the run records
added since the previous refresh (one pipeline: an exclusive XRANGE per task from the last
entry seen, usually empty), the queues' counts and the watchdog's heartbeat. The run records
feed the counters and histograms, which therefore count what this process has seen: at the
first sight of a task, its newest ``FIRST_READ`` records, then every record as it lands.
Nothing is written: serve is read-only.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from runner import clock
from runner.lease import replies
from runner.ops.state import Heartbeat, Reader, RunRecord, TaskStatus, heartbeat_key, heartbeat_of
from runner.ops.state import record_of as _record_of

#: Records read at the first sight of a task (its newest), for the strip and the counters.
FIRST_READ = 100
#: Records read per task per refresh at most; a busier task catches up over the next ones.
READ_BATCH = 1000
#: Runs each task keeps in memory for the page's strip.
STRIP = 30
#: Run-duration buckets (seconds): cron jobs run from a second to hours.
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, float("inf"))
#: Enqueue-to-start buckets (seconds): a worker's poll interval to a backlog of minutes.
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, float("inf"))
FAILURES = frozenset({"failed", "lease_lost", "terminated", "unavailable", "replaced"})


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        return [("+Inf" if b == float("inf") else f"{b:g}", c)
                for b, c in zip(self.buckets, self.counts, strict=True)]  # fmt: skip


@dataclass
class TaskRuns:
    """What this process has seen of one task's run stream."""

    last_id: str | None = None
    recent: deque[RunRecord] = field(default_factory=lambda: deque(maxlen=STRIP))
    outcomes: dict[str, int] = field(default_factory=dict)
    durations: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    # Enqueue records waiting for the worker's first record of the same slot: slot -> sent at.
    sent: dict[int, float] = field(default_factory=dict)

    def add(self, record: RunRecord) -> None:
        self.recent.append(record)
        if record.admin:
            return  # an admin's unlock, acknowledgement, pause or resume, not a run
        outcome = record.outcome or "unknown"
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if outcome != "enqueued" and record.duration_ms is not None:
            self.durations.observe(record.duration_ms / 1000)
        if record.slot is None or record.started_at is None:
            return
        if outcome == "enqueued":
            self.sent[record.slot] = record.started_at + (record.duration_ms or 0) / 1000
            while len(self.sent) > STRIP:
                self.sent.pop(next(iter(self.sent)))
        elif (sent_at := self.sent.pop(record.slot, None)) is not None:
            self.latency.observe(max(0.0, record.started_at - sent_at))

    @property
    def consecutive_failures(self) -> int:
        count = 0
        for record in reversed(self.recent):
            if record.outcome in FAILURES:
                count += 1
            elif record.outcome in ("ran", "enqueued"):
                break
        return count


@dataclass(frozen=True)
class QueueRow:
    queue: str
    ready: int
    in_flight: int
    delayed: int
    dead: int


@dataclass(frozen=True)
class Snapshot:
    now_s: float
    tasks: tuple[TaskStatus, ...]
    runs: dict[str, TaskRuns]
    queues: tuple[QueueRow, ...]
    heartbeat: Heartbeat | None
    read_s: float  # how long the read took


class Source:
    """Reads snapshots; one refresh at a time, and a fresh one at most every ``min_age_s``
    (several scrapers and a person on the page share it)."""

    def __init__(
        self, client: Any, prefix: str, scope: str, *, tolerance_s: float, min_age_s: float = 1.0
    ) -> None:
        self.reader = Reader(client, prefix, scope)
        self.client = client
        self.prefix = prefix
        self.scope = scope
        self.tolerance_s = tolerance_s
        self.min_age_s = min_age_s
        self.runs: dict[str, TaskRuns] = {}
        self._lock = threading.Lock()
        self._last: Snapshot | None = None
        self._last_mono = 0.0

    def snapshot(self) -> Snapshot:
        with self._lock:
            if self._last is not None and clock.monotonic() - self._last_mono < self.min_age_s:
                return self._last
            started = clock.monotonic()
            now_s = clock.wall()
            names = self.reader.tasks()
            statuses = self.reader.statuses(names, now_s=now_s, tolerance_s=self.tolerance_s)
            names = [s.task for s in statuses]
            self._read_runs(names)
            # A task whose records cannot be read is left out, alone (Reader.unreadable).
            statuses = [s for s in statuses if s.task not in self.reader.unreadable]
            queues = self._queues()
            heartbeat = heartbeat_of(self.client.get(heartbeat_key(self.prefix, self.scope)))
            for gone in set(self.runs) - set(names):
                del self.runs[gone]
            self._last = Snapshot(
                now_s=now_s,
                tasks=tuple(statuses),
                runs=self.runs,
                queues=queues,
                heartbeat=heartbeat,
                read_s=clock.monotonic() - started,
            )
            self._last_mono = clock.monotonic()
            return self._last

    def _read_runs(self, names: Sequence[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            seen = self.runs.setdefault(name, TaskRuns())
            key = self.reader.keys(name).runs
            if seen.last_id is None:
                pipe.xrevrange(key, count=FIRST_READ)
            else:
                pipe.xrange(key, min=f"({seen.last_id}", count=READ_BATCH)
        answers = replies.answered(lambda: pipe.execute(raise_on_error=False), "run streams")
        for name, reply in zip(names, answers if names else [], strict=True):
            seen = self.runs[name]
            try:
                if isinstance(reply, ResponseError):
                    raise reply
                read = replies.entries(reply, f"{name}: the run stream")
            except (replies.UnexpectedReply, ResponseError) as exc:
                self.reader.report_unreadable(name, exc)
                continue
            entries = list(reversed(read)) if seen.last_id is None else read
            for entry_id, fields in entries:
                seen.add(_record_of(entry_id, fields))
                seen.last_id = entry_id
            if seen.last_id is None:
                seen.last_id = "0-0"  # read from the start next time

    def _queues(self) -> tuple[QueueRow, ...]:
        # Plain Redis reads: no Dramatiq.
        from runner.queue.stats import discover_queues, queue_stats  # noqa: PLC0415

        namespace = f"{self.prefix}:queue:{self.scope}"
        names = discover_queues(self.client, namespace)
        return tuple(
            QueueRow(q.queue, q.ready, q.in_flight, q.delayed, q.dead)
            for q in (queue_stats(self.client, namespace, names) if names else [])
        )

    def history(self, task: str, count: int) -> list[RunRecord]:
        return self.reader.history(task, count)

    def known(self, task: str) -> bool:
        keys = self.reader.keys(task)
        return bool(self.client.exists(keys.state, keys.lease))


def strip_of(runs: TaskRuns | None, status: TaskStatus, limit: int = 20) -> list[tuple[str, str]]:
    """The last runs and missed slots, oldest first: (kind, title) for the page's strip."""
    items: list[tuple[float, str, str]] = []
    for r in runs.recent if runs else ():
        if r.admin:
            continue
        # By slot, so a backfill or a late run sits where its slot does among the missed ones.
        when = float(r.slot) if r.slot is not None else (r.started_at or 0.0)
        items.append((when, _kind(r.outcome), _title(r)))
    if status.missed:
        items += [
            (float(slot), "missed", f"slot {_iso(slot)}: missed") for slot in status.missed.slots
        ]
    items.sort(key=lambda item: item[0])
    return [(kind, title) for _, kind, title in items[-limit:]]


def _kind(outcome: str | None) -> str:
    return {"ran": "ran", "enqueued": "ran", "lease_lost": "lost", "failed": "failed",
            "terminated": "failed", "unavailable": "failed",
            "paused": "paused"}.get(outcome or "", "other")  # fmt: skip


def _iso(t: float | None) -> str:
    from runner.ops.report import iso  # noqa: PLC0415

    return iso(t) or "-"


def _title(r: RunRecord) -> str:
    slot = _iso(r.slot) if r.slot is not None else "manual"
    return f"slot {slot}: {r.outcome} by {r.holder or '-'} (exit {r.exit_code})"


def outcomes_of(runs: Iterable[TaskRuns]) -> set[str]:
    return {o for r in runs for o in r.outcomes}
