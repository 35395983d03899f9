"""/metrics: one snapshot in the Prometheus text format, built with the official client.

Every metric is named here, in ``METRICS``, so the chart's alerts and dashboard can be checked
against it (tests/chart/test_serve.py). Per task: labelled ``task``; the holder is a label of
its own series (``cron_runner_task_lease_holder``), present only while a lease is held, so a
new pod name per run adds one short-lived series, not a label on every metric.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from runner.serve.snapshot import Snapshot

#: name -> (type, help). Counters and histograms are named without their suffixes.
METRICS: dict[str, tuple[str, str]] = {
    "cron_runner_up": ("gauge", "1 when Redis answered this scrape, else 0"),
    "cron_runner_scrape_read_seconds": ("gauge", "time this scrape spent reading Redis"),
    "cron_runner_tasks": ("gauge", "tasks known in the scope"),
    "cron_runner_task_last_success_timestamp_seconds": ("gauge", "when the last success ended"),
    "cron_runner_task_last_failure_timestamp_seconds": ("gauge", "when the last failure ended"),
    "cron_runner_task_last_duration_seconds": ("gauge", "how long the last run took"),
    "cron_runner_task_next_slot_timestamp_seconds": ("gauge", "the next fire time"),
    "cron_runner_task_runs": (
        "counter",
        "recorded runs by outcome, as seen by this process (a slot skipped because the task "
        "was paused or another slot held the lease is recorded once; the skips of a slot that "
        "ran elsewhere are not: see OpenTelemetry's runs)",
    ),
    "cron_runner_task_consecutive_failures": ("gauge", "failed runs since the last success"),
    "cron_runner_task_missed_slots": ("gauge", "missed slots reported (ledger and listing)"),
    "cron_runner_task_overdue": ("gauge", "1 when a slot was missed and not acknowledged"),
    "cron_runner_task_lease_held": ("gauge", "1 while a run holds the lease"),
    "cron_runner_task_lease_holder": ("gauge", "1 for the holder of a held lease"),
    "cron_runner_task_running_seconds": ("gauge", "how long the held lease has been held"),
    "cron_runner_task_max_runtime_seconds": ("gauge", "the task's max runtime, when set"),
    "cron_runner_task_over_max_runtime": ("gauge", "1 while a run holds the lease past it"),
    "cron_runner_task_paused": ("gauge", "1 while the task is paused (cron-runner pause)"),
    "cron_runner_task_paused_since_timestamp_seconds": ("gauge", "when the pause in force began"),
    "cron_runner_task_paused_until_timestamp_seconds": (
        "gauge",
        "when the pause in force ends by itself (none: until resumed)",
    ),
    "cron_runner_task_run_duration_seconds": ("histogram", "run durations, as seen"),
    "cron_runner_queue_latency_seconds": ("histogram", "from enqueue to a worker's start"),
    "cron_runner_queue_depth": ("gauge", "messages waiting for a worker"),
    "cron_runner_queue_in_flight": ("gauge", "messages fetched, not yet acknowledged"),
    "cron_runner_queue_delayed": ("gauge", "retries waiting out their backoff"),
    "cron_runner_queue_dead_letters": ("gauge", "messages in the dead-letter queue"),
    "cron_runner_watchdog_heartbeat_present": ("gauge", "1 while the watchdog's heartbeat lives"),
    "cron_runner_watchdog_heartbeat_timestamp_seconds": ("gauge", "when the watchdog last ran"),
}


def _gauge(name: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, METRICS[name][1], labels=list(labels))


class SnapshotCollector(Collector):
    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None

    def collect(self) -> Iterator[Metric]:  # noqa: PLR0915 - one family per metric, in order
        snap = self.snapshot
        up = _gauge("cron_runner_up")
        up.add_metric([], 0 if snap is None else 1)
        yield up
        if snap is None:
            return
        read = _gauge("cron_runner_scrape_read_seconds")
        read.add_metric([], snap.read_s)
        yield read
        count = _gauge("cron_runner_tasks")
        count.add_metric([], len(snap.tasks))
        yield count

        t = ("task",)
        success = _gauge("cron_runner_task_last_success_timestamp_seconds", t)
        failure = _gauge("cron_runner_task_last_failure_timestamp_seconds", t)
        duration = _gauge("cron_runner_task_last_duration_seconds", t)
        next_slot = _gauge("cron_runner_task_next_slot_timestamp_seconds", t)
        streak = _gauge("cron_runner_task_consecutive_failures", t)
        missed = _gauge("cron_runner_task_missed_slots", t)
        overdue = _gauge("cron_runner_task_overdue", t)
        held = _gauge("cron_runner_task_lease_held", t)
        holder = _gauge("cron_runner_task_lease_holder", ("task", "holder"))
        running = _gauge("cron_runner_task_running_seconds", t)
        max_runtime = _gauge("cron_runner_task_max_runtime_seconds", t)
        over = _gauge("cron_runner_task_over_max_runtime", t)
        paused = _gauge("cron_runner_task_paused", t)
        paused_since = _gauge("cron_runner_task_paused_since_timestamp_seconds", t)
        paused_until = _gauge("cron_runner_task_paused_until_timestamp_seconds", t)
        for s in snap.tasks:
            name = [s.task]
            if s.last_success:
                success.add_metric(name, s.last_success.at)
            if s.last_failure:
                failure.add_metric(name, s.last_failure.at)
            last = max((r for r in (s.last_success, s.last_failure) if r), key=lambda r: r.at,
                       default=None)  # fmt: skip
            if last is not None and last.duration_ms is not None:
                duration.add_metric(name, last.duration_ms / 1000)
            if s.next_slot is not None:
                next_slot.add_metric(name, s.next_slot)
            seen = snap.runs.get(s.task)
            streak.add_metric(name, seen.consecutive_failures if seen else 0)
            if s.missed is not None:
                missed.add_metric(name, s.missed.total)
                overdue.add_metric(name, 1 if s.overdue else 0)
            held.add_metric(name, 0 if s.holder is None else 1)
            if s.holder is not None:
                holder.add_metric([s.task, s.holder], 1)
            if s.running_since is not None:
                running.add_metric(name, max(0.0, snap.now_s - s.running_since))
            if s.max_runtime_s is not None:
                max_runtime.add_metric(name, s.max_runtime_s)
            over.add_metric(name, 1 if s.over_max_runtime else 0)
            paused.add_metric(name, 0 if s.paused is None else 1)
            if s.paused is not None and s.paused.at is not None:
                paused_since.add_metric(name, s.paused.at)
            if s.paused is not None and s.paused.until is not None:
                paused_until.add_metric(name, s.paused.until)
        yield from (success, failure, duration, next_slot, streak, missed, overdue, held,
                    holder, running, max_runtime, over, paused, paused_since, paused_until)  # fmt: skip
        yield from self._runs(snap)
        yield from self._queues(snap)
        yield from self._watchdog(snap)

    @staticmethod
    def _runs(snap: Snapshot) -> Iterator[Metric]:
        runs = CounterMetricFamily(
            "cron_runner_task_runs", METRICS["cron_runner_task_runs"][1], labels=["task", "outcome"]
        )
        durations = HistogramMetricFamily(
            "cron_runner_task_run_duration_seconds",
            METRICS["cron_runner_task_run_duration_seconds"][1],
            labels=["task"],
        )
        latency = HistogramMetricFamily(
            "cron_runner_queue_latency_seconds",
            METRICS["cron_runner_queue_latency_seconds"][1],
            labels=["task"],
        )
        for task, seen in sorted(snap.runs.items()):
            for outcome, n in sorted(seen.outcomes.items()):
                runs.add_metric([task, outcome], n)
            if seen.durations.counts[-1]:
                durations.add_metric([task], seen.durations.cumulative(), seen.durations.total)
            if seen.latency.counts[-1]:
                latency.add_metric([task], seen.latency.cumulative(), seen.latency.total)
        yield from (runs, durations, latency)

    @staticmethod
    def _queues(snap: Snapshot) -> Iterator[Metric]:
        q = ("queue",)
        families = {
            "cron_runner_queue_depth": _gauge("cron_runner_queue_depth", q),
            "cron_runner_queue_in_flight": _gauge("cron_runner_queue_in_flight", q),
            "cron_runner_queue_delayed": _gauge("cron_runner_queue_delayed", q),
            "cron_runner_queue_dead_letters": _gauge("cron_runner_queue_dead_letters", q),
        }
        for row in snap.queues:
            families["cron_runner_queue_depth"].add_metric([row.queue], row.ready)
            families["cron_runner_queue_in_flight"].add_metric([row.queue], row.in_flight)
            families["cron_runner_queue_delayed"].add_metric([row.queue], row.delayed)
            families["cron_runner_queue_dead_letters"].add_metric([row.queue], row.dead)
        yield from families.values()

    @staticmethod
    def _watchdog(snap: Snapshot) -> Iterator[Metric]:
        present = _gauge("cron_runner_watchdog_heartbeat_present")
        present.add_metric([], 0 if snap.heartbeat is None else 1)
        yield present
        at = _gauge("cron_runner_watchdog_heartbeat_timestamp_seconds")
        if snap.heartbeat is not None:
            at.add_metric([], snap.heartbeat.at)
        yield at


class Exposition:
    """A registry of its own (not the process-wide default) holding one snapshot collector."""

    def __init__(self) -> None:
        self.collector = SnapshotCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._lock = threading.Lock()

    def render(self, snapshot: Snapshot | None) -> bytes:
        with self._lock:
            self.collector.snapshot = snapshot
            data: Any = generate_latest(self.registry)
        return bytes(data)
