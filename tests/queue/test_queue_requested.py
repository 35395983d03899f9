"""Slots the user asked for, in queue mode: a backfill's, and those a run catches up. Each is
sent as a message of its own, all at once, so a worker fetches them together: the first takes
the task's lease, and the others wait for their turn (back on the queue with a delay) rather
than being skipped as held by another slot. Real `cron-runner` processes on a real Redis.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import redis

from runner.keys import TaskKeys
from runner.testing import RedisServer
from tests.helpers.proc import events
from tests.helpers.wait import wait_for
from tests.queue.helpers import (
    WorkerProc,
    cli,
    effects,
    history,
    queue_env,
    start_worker,
    stats,
    unacked,
)

TASK = "q-turn"


def _drained(r: redis.Redis) -> bool:
    row = stats(r, TASK)
    return (row.ready, row.in_flight, row.delayed, row.dead) == (0, 0, 0, 0) and unacked(r) == 0


def _send(how: str, env: dict[str, str], r: redis.Redis) -> tuple[list[int], str]:
    """The slots a backfill or a catching-up run sent, and what it printed."""
    minute = int(time.time()) // 60 * 60
    if how == "backfill":
        done = cli(env, "backfill", TASK, "--from", str(minute - 240), "--to", str(minute - 120))
    else:
        # Its first run long ago: the window's slots are missed ones, to catch up.
        r.hset(TaskKeys("cron-runner", "default", TASK).meta, "since", "0")
        env = {**env, "CRON_RUNNER_CATCHUP": "all", "CRON_RUNNER_CATCHUP_WINDOW": "3m"}
        done = cli(env, "run", TASK)
    assert done.returncode == 0, done.stderr
    sent = [e["slot"] for e in events(done.stderr) if e.get("event") == "enqueued"]
    return sent, done.stdout


@pytest.mark.parametrize("how", ["backfill", "catchup"])
def test_every_slot_asked_for_runs_once_in_turn_on_one_worker(
    how: str, redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    env = queue_env(
        redis_server,
        CRON_RUNNER_MODE="enqueue",
        CRON_RUNNER_SCHEDULE="* * * * *",
        CRON_RUNNER_SLOT_RETENTION="1h",
    )
    sent, printed = _send(how, env, r)
    assert len(sent) >= 3
    if how == "backfill":
        # Sent, not run: the workers run them.
        assert printed.strip() == (
            f"backfill {TASK}: 3 slots: 3 sent to the workers, 0 skipped (already sent), 0 failed"
        )
    worker = start_worker(workers, queue_env(redis_server), "--threads", "8")
    wait_for(lambda: len(effects(r, "ran")) >= len(sent), 20 + 3 * len(sent), "every slot run")
    wait_for(lambda: _drained(r), 20, "the queue to drain")
    ran = effects(r, "ran")
    assert sorted(e["slot"] for e in ran) == sorted(sent)
    # One after another under the lease, never side by side.
    spans: list[Any] = sorted(
        (s["at"], e["at"]) for s in effects(r, "start") for e in ran if e["slot"] == s["slot"]
    )
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    # Each slot: sent once, ran once, and no skip recorded on the way.
    outcomes = [(h["slot"], h["outcome"]) for h in history(env, TASK) if h["slot"] is not None]
    assert sorted(outcomes) == sorted([*((s, "enqueued") for s in sent),
                                       *((s, "ran") for s in sent)]), outcomes  # fmt: skip
    assert worker.events("put_back"), "the slots fetched together waited for their turn"
    if how == "backfill":
        again = cli(env, "backfill", TASK, "--from", str(min(sent)), "--to", str(max(sent)))
        assert again.stdout.strip() == (
            f"backfill {TASK}: 3 slots: 0 sent to the workers, 3 skipped (already sent), 0 failed"
        ), again.stderr
