"""Catch-up, in-process (tests/helpers/harness.py): an hourly task whose runs at 11:00 and 12:00
never happened, run again at 13:00 by two servers racing; the real lease on a real Redis, the
runners' wall clock set through the clock seam (docs/design.md, Catch-up, trigger and
backfill).

Redis's own clock is not faked: the task's meta ``since`` (its first run of this release, which
slots before are not missed) is set to the fake 10:00 by hand.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runner.errors import ConfigError
from runner.lease import store
from runner.lease.scripts import new_token
from runner.outcomes import FAILED, RAN, SKIPPED_DONE, SKIPPED_HELD, TERMINATED, TOO_LATE
from runner.run.execution import Execution, RunResult
from runner.run.targets import CommandTarget
from runner.signals import Shutdown
from runner.tasks import RunContext
from runner.testing import RedisServer
from tests.helpers.harness import Harness, harness
from tests.helpers.lease_tools import pttl_ms

HOUR = 3600
# In the future of the Redis server's clock, which the harness does not fake.
AT_10 = int(datetime(2031, 3, 4, 10, 0, tzinfo=UTC).timestamp())
AT_11, AT_12, AT_13 = AT_10 + HOUR, AT_10 + 2 * HOUR, AT_10 + 3 * HOUR
HOURLY = {"SCHEDULE": "0 * * * *"}


@pytest.fixture
def h(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with harness(redis_server, monkeypatch) as h:
        yield h


class Calls:
    """A task that records each run's slot, fence and holder, taking ``hold_s`` each."""

    def __init__(self, hold_s: float = 0.0) -> None:
        self.seen: list[tuple[int | None, int, str]] = []
        self.hold_s = hold_s
        self._lock = threading.Lock()

    def __call__(self, ctx: RunContext) -> None:
        with self._lock:
            self.seen.append((ctx.slot, ctx.fencing_token, ctx.holder))
        time.sleep(self.hold_s)

    @property
    def slots(self) -> list[int | None]:
        return [slot for slot, _, _ in self.seen]


def ran_at_10(h: Harness, task: Calls) -> None:
    """The task's first run of this release, at 10:00; then nothing until 13:00."""
    h.wall_at(AT_10 + 5)
    assert h.run(task, h.settings(**HOURLY, HOLDER="a")).outcome == RAN
    h.redis().hset(h.keys.meta, "since", str(AT_10 * 1000))


def race_at_13(h: Harness, task: Calls, **env: str) -> list[RunResult]:
    """Two servers start the 13:00 run at once."""
    h.wall_at(AT_13 + 5)
    results: list[RunResult] = []
    runs = [h.execution(task, h.settings(**HOURLY, **env, HOLDER=who)) for who in ("a", "b")]

    def run(execution: Execution) -> None:
        results.append(execution.run())

    threads = [threading.Thread(target=run, args=(execution,)) for execution in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


# -- the promise: each missed slot runs once, oldest first, under one lease ---------------------


def test_all_runs_each_missed_slot_once_oldest_first_then_its_own(h: Harness) -> None:
    task = Calls(hold_s=0.3)
    ran_at_10(h, task)
    results = race_at_13(h, task, CATCHUP="all", CATCHUP_WINDOW="3h")

    assert sorted(r.outcome for r in results) in ([RAN, SKIPPED_HELD], [RAN, SKIPPED_DONE])
    assert all(r.exit_code == 0 for r in results)
    assert task.slots == [AT_10, AT_11, AT_12, AT_13]
    # One server ran all three, under the one lease it took: the same fence.
    (_, fence_10, _), *later = task.seen
    assert len({(fence, holder) for _, fence, holder in later}) == 1
    assert later[0][1] > fence_10
    for slot in (AT_11, AT_12, AT_13):
        assert h.marker(slot)["holder"] == later[0][2]
    records = h.records()
    assert [(r["slot"], r["outcome"]) for r in records] == [
        (str(slot), RAN) for slot in (AT_10, AT_11, AT_12, AT_13)
    ]
    # The state ends on the run's own slot, the latest.
    assert h.state()["last_success_slot"] == str(AT_13)
    assert h.lease_token() is None


def test_latest_runs_only_the_newest_missed_slot(h: Harness) -> None:
    task = Calls(hold_s=0.3)
    ran_at_10(h, task)
    race_at_13(h, task, CATCHUP="latest", CATCHUP_WINDOW="3h")

    assert task.slots == [AT_10, AT_12, AT_13]
    assert h.marker(AT_11) == {}  # coalesced: never run
    assert h.marker(AT_12)["holder"] in ("a", "b")


@pytest.mark.parametrize(
    ("window", "caught_up"),
    [
        ("30m", []),
        ("1h", [AT_12]),
        ("90m", [AT_12]),
        ("2h", [AT_11, AT_12]),
        ("5h", [AT_11, AT_12]),
    ],
)
def test_a_shorter_window_runs_fewer(h: Harness, window: str, caught_up: list[int]) -> None:
    task = Calls(hold_s=0.3)
    ran_at_10(h, task)
    race_at_13(h, task, CATCHUP="all", CATCHUP_WINDOW=window)

    assert task.slots == [AT_10, *caught_up, AT_13]


def test_none_runs_only_its_own_slot(h: Harness) -> None:
    task = Calls()
    ran_at_10(h, task)
    race_at_13(h, task, CATCHUP="none", CATCHUP_WINDOW="3h")

    assert task.slots == [AT_10, AT_13]


def test_nothing_before_the_first_run_of_this_release_is_missed(h: Harness) -> None:
    task = Calls()
    h.redis().hset(h.keys.meta, "since", str(AT_12 * 1000))
    h.wall_at(AT_13 + 5)
    assert h.run(task, h.settings(**HOURLY, CATCHUP="all", CATCHUP_WINDOW="3h")).outcome == RAN

    assert task.slots == [AT_12, AT_13]


def test_a_slot_skipped_for_an_earlier_slots_run_is_not_missed(h: Harness) -> None:
    ran_at_10(h, Calls())
    # A run of 10:00 goes on past 11:00 (its lease, as the acquire script leaves it).
    h.redis().set(h.keys.lease, new_token("long", AT_10), px=60_000)
    h.wall_at(AT_11 + 5)
    settings = h.settings(**HOURLY, CATCHUP="all", CATCHUP_WINDOW="3h")
    assert h.run(Calls(), settings).outcome == SKIPPED_HELD
    # Its skip is kept as long as a run's marker: it outlives the window, and stays decided.
    assert h.marker(AT_11)["skipped"] == SKIPPED_HELD
    assert pttl_ms(h.redis(), h.keys.slot(AT_11)) > 4 * HOUR * 1000
    h.redis().delete(h.keys.lease)

    task = Calls()
    h.wall_at(AT_13 + 5)
    h.run(task, settings)
    assert task.slots == [AT_12, AT_13]


# -- late starts ------------------------------------------------------------------------------


def test_a_late_start_within_the_window_runs_its_own_slot(h: Harness) -> None:
    task = Calls()
    ran_at_10(h, task)
    h.wall_at(AT_13 + 40 * 60)  # past the starting deadline (300 s), within the window
    result = h.run(task, h.settings(**HOURLY, CATCHUP="latest", CATCHUP_WINDOW="1h"))

    assert result == RunResult(RAN, 0)
    assert task.slots == [AT_10, AT_12, AT_13]


def test_a_late_start_past_the_window_is_too_late(h: Harness) -> None:
    task = Calls()
    ran_at_10(h, task)
    h.wall_at(AT_13 + 40 * 60)
    result = h.run(task, h.settings(**HOURLY, CATCHUP="all", CATCHUP_WINDOW="30m"))

    assert (result.outcome, result.exit_code) == (TOO_LATE, 0)
    assert result.reason is not None and "CRON_RUNNER_CATCHUP_WINDOW" in result.reason
    assert task.slots == [AT_10]


# -- failures, stops, and what is kept --------------------------------------------------------


def test_a_caught_up_slot_that_fails_is_recorded_left_unmarked_and_the_others_run(
    h: Harness,
) -> None:
    seen: list[int | None] = []

    def fails_at_11(ctx: RunContext) -> None:
        seen.append(ctx.slot)
        if ctx.slot == AT_11:
            raise RuntimeError("eleven")

    ran_at_10(h, Calls())
    h.wall_at(AT_13 + 5)
    result = h.run(fails_at_11, h.settings(**HOURLY, CATCHUP="all", CATCHUP_WINDOW="3h"))

    # The run's result is its own slot's: 13:00 ran.
    assert result == RunResult(RAN, 0)
    assert seen == [AT_11, AT_12, AT_13]
    assert h.marker(AT_11) == {}
    assert [(r["slot"], r["outcome"]) for r in h.records()[1:]] == [
        (str(AT_11), FAILED), (str(AT_12), RAN), (str(AT_13), RAN)
    ]  # fmt: skip
    assert h.records()[1]["error"] == "RuntimeError: eleven"

    # The next run's catch-up tries it again.
    again = Calls()
    h.wall_at(AT_13 + HOUR + 5)
    h.run(again, h.settings(**HOURLY, CATCHUP="all", CATCHUP_WINDOW="4h"))
    assert again.slots == [AT_11, AT_13 + HOUR]


def test_a_stop_while_catching_up_ends_the_run_and_leaves_its_own_slot_open(h: Harness) -> None:
    shutdown = Shutdown()
    seen: list[int | None] = []

    def stopped_at_11(ctx: RunContext) -> None:
        seen.append(ctx.slot)
        if ctx.slot == AT_11:
            shutdown.request(signal.SIGTERM)
            assert ctx.cancelled.wait(10)
            ctx.check()

    ran_at_10(h, Calls())
    h.wall_at(AT_13 + 5)
    settings = h.settings(**HOURLY, CATCHUP="all", CATCHUP_WINDOW="3h")
    result = h.run(stopped_at_11, settings, shutdown=shutdown)

    assert (result.outcome, result.exit_code) == (TERMINATED, 143)
    assert seen == [AT_11]
    assert h.lease_token() is None
    assert (h.marker(AT_11), h.marker(AT_12), h.marker(AT_13)) == ({}, {}, {})
    assert [(r["slot"], r["outcome"]) for r in h.records()[1:]] == [(str(AT_11), TERMINATED)]


def test_markers_are_kept_as_long_as_the_window_needs(h: Harness) -> None:
    ran_at_10(h, Calls())
    h.wall_at(AT_13 + 5)
    h.run(Calls(), h.settings(**HOURLY, CATCHUP="all", CATCHUP_WINDOW="10h"))

    # The window, the longest gap and twice the skew tolerance: 10 h + 1 h + 1 min.
    for slot in (AT_11, AT_12, AT_13):
        assert 39_000_000 < pttl_ms(h.redis(), h.keys.slot(slot)) <= 39_660_000


def test_a_command_is_told_each_slot_it_runs(h: Harness, tmp_path: Path) -> None:
    ran_at_10(h, Calls())
    h.wall_at(AT_13 + 5)
    settings = h.settings(**HOURLY, CATCHUP="all", CATCHUP_WINDOW="3h")
    effects = tmp_path / "slots"
    # One target for the run: started again for each slot, as the CLI's exec does.
    target = CommandTarget(["sh", "-c", f'echo "$CRON_RUNNER_SLOT" >> {effects}'])
    client = store.connect(settings.redis, settings.lease.ttl_s)
    try:
        result = Execution(settings, client, h.task, target, Shutdown(), what="run test").run()
    finally:
        client.close()

    assert result.outcome == RAN
    assert effects.read_text().split() == [str(AT_11), str(AT_12), str(AT_13)]


# -- refusals: the settings name themselves ---------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CATCHUP": "all"}, r"CRON_RUNNER_CATCHUP=all \(--catchup, @task\(catchup=\)\) needs a window"),
        ({"CATCHUP": "latest", "CATCHUP_WINDOW": "0"}, "needs a window"),
        ({"CATCHUP": "all", "CATCHUP_WINDOW": "1h", "SCHEDULE": ""}, "needs a schedule"),
        ({"CATCHUP": "all", "CATCHUP_WINDOW": "1001h"}, r"CRON_RUNNER_CATCHUP_WINDOW=3603600s .* holds up to 1001 slots"),
        ({"CATCHUP": "all", "CATCHUP_WINDOW": "3h", "SLOT_RETENTION": "3h"},
         r"needs slot markers kept at least 14460s.*CRON_RUNNER_SLOT_RETENTION=10800s"),
    ],
)  # fmt: skip
def test_a_catchup_that_cannot_keep_its_promise_is_refused(
    h: Harness, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        h.execution(Calls(), h.settings(**{**HOURLY, **env}))
