"""A run killed with kill -9 is in the history once the next run of its slot starts: that run
finds the lease the killed one left, waits for it to expire, takes the slot over and records
the killed run, from what its lease left (its holder, when it started). Real processes, a real
kill, a real Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import redis

from runner.testing import RedisServer
from tests.helpers.proc import LoggedRun, outcome, runner_env, spawn_started
from tests.helpers.ticker import children
from tests.queue.helpers import history


def _exec(holder: str, effects: Path, seconds: float) -> list[str]:
    task = f"echo start >> {effects}; sleep {seconds}; echo ran >> {effects}"
    return ["exec", "--name", "report", "--holder", holder, "--", "sh", "-c", task]


def test_a_run_killed_mid_task_is_recorded_by_the_run_that_takes_its_slot_over(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    minute = int(time.time() // 60) - 1
    env = runner_env(redis_server.url, CRON_RUNNER_JOB_NAME=f"report-{minute}",
                     CRON_RUNNER_LEASE_TTL="3s")  # fmt: skip
    first = spawn_started(_exec("pod-a", effects, 60), env, effects)
    groups = set()
    for pid in children(first.pid):
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(pid))
    os.kill(first.pid, signal.SIGKILL)  # a node crash: no release, no record
    for group in groups - {os.getpgrp()}:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)  # its command, which the node takes with it
    first.communicate(timeout=10)
    # The Job's retry, with the killed run's lease still there.
    retry = LoggedRun(_exec("pod-a-retry", effects, 0.1), env, tmp_path / "retry.log")
    assert outcome(retry.finish(60)) == "ran"
    runs = [(h["holder"], h["outcome"]) for h in history(env, "report")]
    assert runs == [("pod-a", "lease_lost"), ("pod-a-retry", "ran")]
    (lost,) = history(env, "report")[:1]
    assert lost["slot"] == minute * 60
    assert "took the slot over" in lost["error"]
