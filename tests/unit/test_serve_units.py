"""The pure parts of serve and pings: what a run record adds to the counters, the strip, and
the ping URLs."""

from __future__ import annotations

from runner.ops.state import RunRecord
from runner.run.ping import ping_url
from runner.serve.snapshot import TaskRuns


def rec(outcome: str, slot: int | None, started_at: float, duration_ms: int = 1000) -> RunRecord:
    return RunRecord(id="1-0", started_at=started_at, slot=slot, holder="h", fence=1,
                     outcome=outcome, exit_code=0, duration_ms=duration_ms, error=None,
                     unlocked=None)  # fmt: skip


def test_latency_is_from_the_end_of_the_enqueue_to_the_first_worker_record() -> None:
    runs = TaskRuns()
    runs.add(rec("enqueued", 600, 600.0, duration_ms=500))
    runs.add(rec("failed", 600, 603.5))  # the first attempt: 3 s after the send
    runs.add(rec("ran", 600, 640.0))  # a retry after its backoff: not queue latency
    assert runs.latency.counts[-1] == 1
    assert runs.latency.total == 3.0
    assert runs.outcomes == {"enqueued": 1, "failed": 1, "ran": 1}
    assert runs.durations.counts[-1] == 2  # an enqueue's own time is not a run's


def test_failures_in_a_row_and_what_is_not_a_run() -> None:
    runs = TaskRuns()
    for outcome in ("ran", "failed", "lease_lost", "acknowledged", "terminated"):
        runs.add(rec(outcome, 60, 60.0))
    assert runs.consecutive_failures == 3
    assert "acknowledged" not in runs.outcomes
    runs.add(rec("ran", 120, 120.0))
    assert runs.consecutive_failures == 0


def test_ping_urls_keep_a_query_and_drop_a_trailing_slash() -> None:
    assert (
        ping_url("https://hc-ping.com/abc", "/start", "r1")
        == "https://hc-ping.com/abc/start?rid=r1"
    )
    assert ping_url("https://hc-ping.com/abc/", "", "r1") == "https://hc-ping.com/abc?rid=r1"
    assert ping_url("https://x.test/p?k=v", "/3", "r1") == "https://x.test/p/3?k=v&rid=r1"
