"""A run's phases and decisions, in-process (tests/helpers/harness.py): the real lease on a real
Redis, the wall clock set through the clock seam, the task a Python function.

Each case is a run's decision (runner/run/policy.py) or a way a run ends (runner/run/execution.py),
checked by what the run returns and what it leaves in Redis.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from runner.lease.keeper import Keeper
from runner.lease.scripts import Acquired, Lease, new_token
from runner.outcomes import (
    FAILED,
    LEASE_LOST,
    RAN,
    SKIPPED_DONE,
    SKIPPED_HELD,
    SKIPPED_STALE,
    TERMINATED,
    TOO_LATE,
)
from runner.run.execution import RunResult
from runner.signals import Shutdown
from runner.tasks import RunContext
from runner.testing import RedisServer
from tests.helpers.harness import Abandoned, Harness, harness
from tests.helpers.lease_tools import pttl_ms

SLOT = int(datetime(2026, 1, 1, 10, 0, tzinfo=UTC).timestamp())
EVERY_5_MIN = {"SCHEDULE": "*/5 * * * *", "HOLDER": "a"}


@pytest.fixture
def h(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with harness(redis_server, monkeypatch) as h:
        h.wall_at(SLOT + 5)
        yield h


class Calls:
    """A task that records each run's slot and fence."""

    def __init__(self) -> None:
        self.seen: list[tuple[int | None, int]] = []

    def __call__(self, ctx: RunContext) -> None:
        self.seen.append((ctx.slot, ctx.fencing_token))


def hold(h: Harness, holder: str, slot: int | None, ttl_ms: int) -> Lease:
    """Another runner's lease on the task, taken now and never renewed."""
    lease = Lease(h.redis(), h.keys, new_token(holder, slot), ttl_ms=ttl_ms)
    assert isinstance(lease.acquire(slot), Acquired)
    return lease


# -- ran, and the slot's marker --------------------------------------------------------------


def test_a_run_runs_its_slot_and_marks_it_done(h: Harness) -> None:
    task = Calls()
    result = h.run(task, h.settings(**EVERY_5_MIN))

    assert result == RunResult(RAN, 0)
    ((slot, fence),) = task.seen
    assert slot == SLOT
    assert h.lease_token() is None
    marker = h.marker(SLOT)
    assert (marker["holder"], marker["fence"]) == ("a", str(fence))
    # Kept twice the schedule's longest gap, at least an hour: passed to the completion.
    assert 3_500_000 < pttl_ms(h.redis(), h.keys.slot(SLOT)) <= 3_600_000
    ((record),) = h.records()
    assert (record["outcome"], record["slot"], record["fence"]) == (RAN, str(SLOT), str(fence))
    state = h.state()
    assert (state["last_outcome"], state["last_success_slot"]) == (RAN, str(SLOT))


def test_a_second_run_of_a_done_slot_skips_it(h: Harness) -> None:
    assert h.run(Calls(), h.settings(**EVERY_5_MIN)).outcome == RAN
    late = Calls()
    result = h.run(late, h.settings(**{**EVERY_5_MIN, "HOLDER": "b"}))

    assert (result.outcome, result.exit_code) == (SKIPPED_DONE, 0)
    assert result.reason is not None and result.reason.startswith("slot done by a at ")
    assert late.seen == []
    assert len(h.records()) == 1  # the skip is the done run's replica: it records nothing


# -- the lease held --------------------------------------------------------------------------


def test_a_lease_held_for_another_slot_is_skipped_at_once(h: Harness) -> None:
    other = hold(h, "other", SLOT - 300, ttl_ms=30_000)
    task = Calls()
    result = h.run(task, h.settings(**EVERY_5_MIN))

    assert result == RunResult(SKIPPED_HELD, 0, reason="held by other")
    assert task.seen == []
    assert h.lease_token() == other.token


def test_a_holder_of_the_same_slot_seen_renewing_is_left_to_run(h: Harness) -> None:
    other = hold(h, "other", SLOT, ttl_ms=3000)
    keeper = Keeper(other, ttl_s=3.0, confirmed_at=time.monotonic()).start()
    try:
        task = Calls()
        result = h.run(task, h.settings(**EVERY_5_MIN))
    finally:
        keeper.stop()

    assert result == RunResult(SKIPPED_HELD, 0, reason="running at other")
    assert task.seen == []


def test_a_holder_of_the_same_slot_that_neither_renews_nor_releases_fails_the_run(
    h: Harness,
) -> None:
    hold(h, "other", SLOT, ttl_ms=30_000)
    task = Calls()
    result = h.run(task, h.settings(**EVERY_5_MIN, HELD_WAIT="1s"))

    # Not run, and not reported done: 75, so that the Job retries.
    assert (result.outcome, result.exit_code) == (SKIPPED_HELD, 75)
    assert result.reason is not None and "CRON_RUNNER_HELD_WAIT" in result.reason
    assert task.seen == []


def test_a_holder_of_the_same_slot_that_vanishes_is_taken_over(h: Harness) -> None:
    hold(h, "killed", SLOT, ttl_ms=1000)
    task = Calls()
    result = h.run(task, h.settings(**EVERY_5_MIN))

    assert result.outcome == RAN
    assert [slot for slot, _ in task.seen] == [SLOT]
    assert h.marker(SLOT)["holder"] == "a"


# -- late and stale --------------------------------------------------------------------------


def test_a_run_that_starts_past_its_starting_deadline_is_too_late(h: Harness) -> None:
    h.wall_at(SLOT + 400)  # the hourly slot of 10:00, past the default deadline of 300 s
    task = Calls()
    result = h.run(task, h.settings(SCHEDULE="0 * * * *", HOLDER="a"))

    assert (result.outcome, result.exit_code) == (TOO_LATE, 0)
    assert result.reason is not None and "CRON_RUNNER_STARTING_DEADLINE" in result.reason
    assert task.seen == []
    ((record),) = h.records()
    assert (record["outcome"], record["slot"], record["fence"]) == (TOO_LATE, str(SLOT), "0")
    # No fence taken: the state hash, which is the runs', is left alone.
    assert h.state() == {}
    assert not h.redis().exists(h.keys.fence)


def test_a_cronjob_slot_older_than_its_marker_retention_is_stale(h: Harness) -> None:
    h.wall_at(SLOT + 2 * 86_400)  # without a schedule, markers are kept a day
    task = Calls()
    result = h.run(task, h.settings(JOB_NAME=f"job-{SLOT // 60}", CRONJOB_NAME="job"))

    assert (result.outcome, result.exit_code) == (SKIPPED_STALE, 0)
    assert task.seen == []
    ((record),) = h.records()
    # Without its slot: status and the watchdog go on from the last plausible run.
    assert (record["outcome"], record["slot"]) == (SKIPPED_STALE, "")
    assert h.state() == {}
    assert not h.redis().exists(h.keys.fence)


# -- failed, terminated, lost ----------------------------------------------------------------


def test_a_failed_run_frees_its_slot_for_the_retry(h: Harness) -> None:
    def boom(ctx: RunContext) -> None:
        raise RuntimeError("boom")

    result = h.run(boom, h.settings(**EVERY_5_MIN))

    assert result == RunResult(FAILED, 1, reason="RuntimeError: boom")
    assert h.lease_token() is None
    assert h.marker(SLOT) == {}
    state = h.state()
    assert (state["last_outcome"], state["last_failure_exit_code"]) == (FAILED, "1")

    retry = Calls()
    assert h.run(retry, h.settings(**EVERY_5_MIN)).outcome == RAN
    assert [slot for slot, _ in retry.seen] == [SLOT]


def test_a_stop_request_stops_the_task_and_releases_the_lease(h: Harness) -> None:
    shutdown = Shutdown()

    def stopped_mid_way(ctx: RunContext) -> None:
        shutdown.request(signal.SIGTERM)
        assert ctx.cancelled.wait(10)
        ctx.check()

    result = h.run(stopped_mid_way, h.settings(**EVERY_5_MIN), shutdown=shutdown)

    assert result == RunResult(TERMINATED, 143, reason="stopped by SIGTERM")
    assert h.lease_token() is None
    assert h.marker(SLOT) == {}  # the slot stays open for the retry
    ((record),) = h.records()
    assert (record["outcome"], record["exit_code"]) == (TERMINATED, "143")
    assert record["error"] == "stopped by SIGTERM (cancelled: shutdown requested)"
    assert h.run(Calls(), h.settings(**EVERY_5_MIN)).outcome == RAN


def test_a_stop_requested_before_the_start_runs_nothing(h: Harness) -> None:
    shutdown = Shutdown()
    shutdown.request(signal.SIGINT)
    task = Calls()
    result = h.run(task, h.settings(**EVERY_5_MIN), shutdown=shutdown)

    assert result == RunResult(TERMINATED, 143, reason="stopped by SIGINT before the task started")
    assert task.seen == []
    assert h.redis().keys("*") == []


@pytest.mark.parametrize("how", ["deleted", "taken"])
def test_a_lost_lease_stops_the_task(h: Harness, how: str) -> None:
    thief = new_token("thief", SLOT)

    def lose_the_lease(ctx: RunContext) -> None:
        if how == "deleted":
            h.redis().delete(h.keys.lease)
        else:
            h.redis().set(h.keys.lease, thief, px=30_000)
        assert ctx.cancelled.wait(10)  # the keeper's next renewal finds it gone
        ctx.check()

    result = h.run(lose_the_lease, h.settings(**EVERY_5_MIN))

    assert (result.outcome, result.exit_code) == (LEASE_LOST, 75)
    assert h.marker(SLOT) == {}
    # A lease someone else holds now is theirs: the lost run does not release it.
    assert h.lease_token() == (thief if how == "taken" else None)
    ((record),) = h.records()
    assert (record["outcome"], record["exit_code"]) == (LEASE_LOST, "75")


def test_a_task_that_ignores_its_cancellation_is_abandoned_with_its_lease(h: Harness) -> None:
    shutdown = Shutdown()
    unblock = threading.Event()

    def stubborn(ctx: RunContext) -> None:
        shutdown.request(signal.SIGTERM)
        unblock.wait(30)

    run = h.execution(
        stubborn, h.settings(**EVERY_5_MIN, SHUTDOWN_GRACE="200ms"), shutdown=shutdown
    )
    try:
        with pytest.raises(Abandoned) as abandoned:
            run.run()
    finally:
        unblock.set()

    # Exits at once, not releasing: the task still runs, so the lease expires by its TTL.
    assert abandoned.value.code == 143
    assert h.lease_token() == run.lease.token
    ((record),) = h.records()
    assert (record["outcome"], record["error"]) == (TERMINATED, "task ignored cancellation")
