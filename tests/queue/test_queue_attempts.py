"""Every attempt that started leaves a record in `history`, at the latest when the next
attempt of its message starts: a worker killed with kill -9, a job put back at SIGTERM, and a
job still running when the shutdown grace ends. Real `cron-runner worker` processes, real
signals, a real Redis.
"""

from __future__ import annotations

import time

import pytest
import redis

from runner.testing import RedisServer
from tests.helpers.wait import wait_for
from tests.queue.helpers import (
    WorkerProc,
    effects,
    history,
    queue_env,
    send_slot,
    start_worker,
)
from tests.queue.queue_tasks import RELEASE

# A slot an hour ago: its message waited, as when the workers were down when it fired.
SLOT = (int(time.time()) // 60) * 60 - 3600


def _outcomes(env: dict[str, str], task: str) -> list[tuple[str, str]]:
    return [(h["holder"], h["outcome"]) for h in history(env, task) if h["slot"] == SLOT]


@pytest.mark.parametrize(
    ("how", "task", "first"),
    [
        ("kill -9", "q-careful", "lease_lost"),
        ("sigterm, stopped at ctx.check()", "q-careful", "requeued"),
        ("sigterm, still running at the end of the grace", "q-stubborn", "lease_lost"),
    ],
)
def test_an_attempt_cut_off_is_in_the_history_once_the_next_one_starts(  # noqa: PLR0917
    how: str,
    task: str,
    first: str,
    redis_server: RedisServer,
    r: redis.Redis,
    workers: list[WorkerProc],
) -> None:
    env = queue_env(redis_server, CRON_RUNNER_SHUTDOWN_GRACE="2s", CRON_RUNNER_LEASE_TTL="3s")
    send_slot(r, task, SLOT, payload={"seconds": 60})
    w0 = start_worker(workers, env)
    wait_for(lambda: effects(r, "start"), 20, "the first attempt to start")
    if how == "kill -9":
        w0.kill_group()
        w0.wait(10)
    else:
        code, _ = w0.stopped()
        assert code == 143
    assert not effects(r, "ran")
    r.set(RELEASE, "1")
    start_worker(workers, env)
    # The dead worker's message comes back once its heartbeat is old (2 s here), the lease
    # it left once its TTL is up (3 s).
    wait_for(lambda: effects(r, "ran"), 30, "the next attempt to run")
    wait_for(lambda: len(_outcomes(env, task)) == 2, 10, "both attempts recorded")
    assert _outcomes(env, task) == [("w0", first), ("w1", "ran")]
    (lost,) = [h for h in history(env, task) if h["slot"] == SLOT and h["holder"] == "w0"]
    assert lost["fencing_token"] == effects(r, "start")[0]["fence"]
