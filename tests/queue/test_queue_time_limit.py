"""What a task's time limit stops, in real worker processes on a real Redis: a task that runs
Python code, or waits on its context, is stopped at its limit; a task blocked in one call
(time.sleep, a socket read) is stopped when that call returns, before its next instruction.
Either way the job fails with the limit named in its record, and never goes on past it.
"""

from __future__ import annotations

import pytest
import redis

from runner.testing import RedisServer
from tests.helpers.wait import wait_for
from tests.queue.helpers import WorkerProc, effects, history, producer, queue_env, start_worker


@pytest.mark.parametrize(
    ("task", "limit_s", "stopped_within_s"),
    [
        ("q-overtime", 0.3, (0.3, 2.0)),  # Python code: stopped at the limit
        ("q-waiting", 0.5, (0.5, 1.5)),  # waiting on its context: stopped at the limit
        ("q-blocked", 0.5, (3.0, 4.5)),  # blocked 3 s in time.sleep: stopped when it returns
    ],
)
def test_a_time_limit_stops_the_task_as_documented(  # noqa: PLR0917
    task: str,
    limit_s: float,
    stopped_within_s: tuple[float, float],
    redis_server: RedisServer,
    r: redis.Redis,
    workers: list[WorkerProc],
) -> None:
    p = producer(redis_server)
    p.send(task, {"seconds": 3 if task == "q-blocked" else 10})
    p.close()
    env = queue_env(redis_server)
    worker = start_worker(workers, env)
    wait_for(lambda: history(env, task), 20, "the job's record")
    (record,) = history(env, task)
    assert record["outcome"] == "failed"
    assert record["error"].startswith(f"time limit of {limit_s:g}s exceeded: stopped after ")
    low, high = stopped_within_s
    assert low <= record["duration_ms"] / 1000 <= high, record
    assert not effects(r, "after") and not effects(r, "ran"), "nothing ran past the limit"
    if task != "q-overtime":
        (warned,) = worker.events("time_limit")
        assert "stops only when that call returns" in warned["msg"]
