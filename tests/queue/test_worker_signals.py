"""A worker takes every stop signal as SIGTERM, as a run does (runner/signals.py): SIGHUP (a
closed ssh session), SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM... stop it cleanly, its running job
finished, instead of killing it with the job in flight until its heartbeat expires."""

from __future__ import annotations

import signal
import subprocess

import pytest
import redis

from runner.testing import RedisServer
from tests.helpers.wait import wait_for
from tests.queue.helpers import WorkerProc, effects, producer, queue_env, unacked


@pytest.mark.parametrize(
    ("sig", "processes"),
    [
        ("SIGHUP", "1"),
        ("SIGQUIT", "1"),
        ("SIGUSR1", "1"),
        ("SIGUSR2", "1"),
        ("SIGHUP", "2"),
        # Every other signal whose default would end the process too (the whole table is in
        # tests/fault/test_cli_signals.py): a timer's, the CPU limit's, a real-time one.
        ("SIGALRM", "1"),
        ("SIGXCPU", "2"),
        ("SIGRTMIN", "1"),
    ],
)
def test_every_stop_signal_lets_the_running_job_finish(
    redis_server: RedisServer, r: redis.Redis, sig: str, processes: str
) -> None:
    env = queue_env(redis_server, CRON_RUNNER_SHUTDOWN_GRACE="10s", CRON_RUNNER_HOLDER="w")
    p = producer(redis_server)
    p.send("q-sleep", {"seconds": 1.0})
    p.close()
    w = WorkerProc(env, "--processes", processes)
    try:
        wait_for(lambda: effects(r, "start"), 20, "the job to start")
        w.proc.send_signal(getattr(signal, sig))
        try:
            code = w.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker was still up 30 s after {sig}; its log:\n{w.text()[-4000:]}")
        assert code == 0, w.text()
        assert len(effects(r, "ran")) == 1
        assert unacked(r) == 0
        assert len(w.events("worker_stopped")) == int(processes)
    finally:
        w.stop()
