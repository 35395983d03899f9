"""The overlap policies in-process (tests/helpers/harness.py): runs of consecutive CronJob slots
(Job names) as threads on a real Redis, each task a Python function that notes when it ran.
What each policy promises is read from those times and from what Redis holds. The same with
separate processes acting as clusters is in tests/fault/test_overlap_clusters.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from runner.config.settings import Settings
from runner.errors import DefinitionConflict
from runner.outcomes import PAUSED, RAN, REPLACED, SKIPPED_HELD
from runner.run.execution import RunResult
from runner.tasks import RunContext
from runner.testing import RedisServer
from tests.helpers.harness import Harness, harness
from tests.helpers.wait import wait_for

SLOT = 1_767_261_600  # 2026-01-01T10:00Z
MINUTE = 60


@pytest.fixture
def h(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with harness(redis_server, monkeypatch) as h:
        h.wall_at(SLOT + 5 * MINUTE)  # every slot below is due, none is stale
        yield h


@dataclass
class Timed:
    """A task that notes when it started and ended, running ``seconds`` or until cancelled."""

    seconds: float
    started: threading.Event = field(default_factory=threading.Event)
    start_s: float = 0.0
    end_s: float = 0.0
    fence: int = 0
    cancelled: str = ""

    def __call__(self, ctx: RunContext) -> None:
        self.start_s, self.fence = time.time(), ctx.fencing_token
        self.started.set()
        try:
            if ctx.cancelled.wait(self.seconds):
                self.cancelled = ctx.cancel_reason
        finally:
            self.end_s = time.time()


def pod(h: Harness, slot: int, overlap: str, **env: str) -> Settings:
    """A CronJob pod's settings for ``slot``."""
    env = {"HOLDER": f"pod-{slot}", **env}
    return h.settings(JOB_NAME=f"job-{slot // MINUTE}", CRONJOB_NAME="job", OVERLAP=overlap, **env)


class Runs:
    def __init__(self, h: Harness) -> None:
        self.h = h
        self.pool = ThreadPoolExecutor(max_workers=4)

    def start(self, task: Timed, settings: Settings) -> Future[RunResult]:
        return self.pool.submit(self.h.run, task, settings)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


@pytest.fixture
def runs(h: Harness) -> Iterator[Runs]:
    pool = Runs(h)
    try:
        yield pool
    finally:
        pool.close()


def test_replace_stops_the_holder_before_the_newcomer_starts(h: Harness, runs: Runs) -> None:
    old, new = Timed(60), Timed(0.2)
    holding = runs.start(old, pod(h, SLOT, "replace"))
    assert old.started.wait(10)
    asked_s = time.time()
    newcomer = runs.start(new, pod(h, SLOT + MINUTE, "replace"))

    assert holding.result(30) == RunResult(
        REPLACED, 79, reason=f"preempted: pod-{SLOT + MINUTE}, running slot {SLOT + MINUTE} "
        "under overlap replace, asked this run to stop",
    )  # fmt: skip
    assert newcomer.result(30).outcome == RAN
    assert old.cancelled == "replaced by a run of a newer slot"
    assert old.end_s <= new.start_s  # no overlap
    assert new.fence > old.fence
    # The renewal every second sees the request; the newcomer's next look takes the lease.
    assert old.end_s - asked_s < 3.0
    assert new.start_s - asked_s < 4.0
    assert h.marker(SLOT)["outcome"] == REPLACED  # not to be run again
    outcomes = [(r["outcome"], r["slot"], r["exit_code"]) for r in h.records()]
    assert outcomes == [(REPLACED, str(SLOT), "79"), (RAN, str(SLOT + MINUTE), "0")]


def test_buffer_one_runs_the_waiting_slot_right_after_the_holder(h: Harness, runs: Runs) -> None:
    first, second = Timed(1.0), Timed(0.1)
    holding = runs.start(first, pod(h, SLOT, "buffer-one"))
    assert first.started.wait(10)
    waiter = runs.start(second, pod(h, SLOT + MINUTE, "buffer-one"))

    assert holding.result(30).outcome == RAN
    assert waiter.result(30).outcome == RAN
    assert first.cancelled == ""  # not stopped: it ran to its end
    assert first.end_s <= second.start_s < first.end_s + 1.0  # right after, within a poll
    assert second.fence > first.fence


def test_buffer_one_a_later_slot_replaces_the_waiting_one(h: Harness, runs: Runs) -> None:
    first, second, third = Timed(1.5), Timed(0.1), Timed(0.1)
    holding = runs.start(first, pod(h, SLOT, "buffer-one"))
    assert first.started.wait(10)
    superseded = runs.start(second, pod(h, SLOT + MINUTE, "buffer-one"))
    wait_for(lambda: h.redis().get(h.keys.buffer) == str(SLOT + MINUTE), what="the buffer")
    latest = runs.start(third, pod(h, SLOT + 2 * MINUTE, "buffer-one"))

    skipped = superseded.result(30)
    assert (skipped.outcome, skipped.exit_code) == (SKIPPED_HELD, 0)
    assert skipped.reason == "superseded: a later slot waits for the lease or took it"
    assert holding.result(30).outcome == RAN
    assert latest.result(30).outcome == RAN
    assert not second.started.is_set()
    assert first.end_s <= third.start_s
    by_slot = {int(r["slot"]): r["outcome"] for r in h.records()}
    assert by_slot == {SLOT: RAN, SLOT + MINUTE: SKIPPED_HELD, SLOT + 2 * MINUTE: RAN}


def test_allow_other_slots_runs_two_slots_side_by_side(h: Harness, runs: Runs) -> None:
    first, second = Timed(1.0), Timed(1.0)
    a = runs.start(first, pod(h, SLOT, "allow-other-slots"))
    assert first.started.wait(10)
    b = runs.start(second, pod(h, SLOT + MINUTE, "allow-other-slots"))
    assert second.started.wait(10)
    # While both run, the task's lease shows one of them: status is not blind to them.
    assert h.lease_token() is not None

    assert (a.result(30).outcome, b.result(30).outcome) == (RAN, RAN)
    assert second.start_s < first.end_s  # they overlapped
    assert h.lease_token() is None
    assert h.run(Timed(0), pod(h, SLOT, "allow-other-slots")).outcome == "skipped_done"


def test_skip_records_the_skipped_slot_once(h: Harness, runs: Runs) -> None:
    first = Timed(1.0)
    holding = runs.start(first, pod(h, SLOT, "skip"))
    assert first.started.wait(10)
    for replica in range(3):
        settings = pod(h, SLOT + MINUTE, "skip", HOLDER=f"replica-{replica}")
        result = h.run(Timed(0), settings)
        assert result == RunResult(SKIPPED_HELD, 0, reason=f"held by pod-{SLOT}")
    assert holding.result(30).outcome == RAN
    skips = [r for r in h.records() if r["outcome"] == SKIPPED_HELD]
    assert [(r["slot"], r["holder"], r["fence"]) for r in skips] == [
        (str(SLOT + MINUTE), "replica-0", "0")
    ]
    assert skips[0]["error"] == f"held by pod-{SLOT} for the slot {SLOT}"
    assert h.marker(SLOT + MINUTE)["skips"] == "3"


def test_a_paused_task_runs_nothing_and_records_the_slot(h: Harness) -> None:
    h.redis().hset(h.keys.meta, mapping={"paused": "1", "paused_by": "ops", "paused_note": "x"})
    task = Timed(0)
    result = h.run(task, pod(h, SLOT, "skip"))
    assert result == RunResult(PAUSED, 0, reason="paused by ops: x")
    assert not task.started.is_set()
    ((record),) = h.records()
    assert (record["outcome"], record["slot"]) == (PAUSED, str(SLOT))


def test_the_policy_joins_the_definition_only_when_not_skip(h: Harness) -> None:
    scheduled = {"SCHEDULE": "*/5 * * * *", "HOLDER": "a"}
    h.wall_at(SLOT + 5)
    assert h.run(Timed(0), h.settings(**scheduled)).outcome == RAN
    # What previous releases store for the task: the policy is not in it.
    assert h.redis().hget(h.keys.meta, "definition") == ("run test, schedule '*/5 * * * *' in UTC")
    with pytest.raises(DefinitionConflict) as refused:
        h.run(Timed(0), h.settings(**scheduled, OVERLAP="replace"))
    assert "overlap replace" in str(refused.value)
    assert h.redis().hget(h.keys.meta, "protocol_min") == "1"  # refused: nothing raised
