"""CRON_RUNNER_WORKER_METRICS_PORT: real workers serve Dramatiq's own Prometheus middleware
metrics (what the chart's PodMonitor scrapes), with one process and with several."""

from __future__ import annotations

import contextlib
import subprocess
import urllib.request

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from runner.testing import RedisServer, free_port
from tests.helpers.wait import wait_for
from tests.queue.helpers import WorkerProc, effects, producer, queue_env


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("actor_name") == "q-ok":
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


@pytest.mark.parametrize("processes", ["1", "2"])
def test_workers_serve_dramatiq_metrics(
    redis_server: RedisServer, r: redis.Redis, processes: str
) -> None:
    port = free_port()
    env = queue_env(redis_server, CRON_RUNNER_WORKER_METRICS_PORT=str(port))
    worker = WorkerProc(env, "--queues", "q-ok", "--processes", processes)
    try:
        wait_for(lambda: len(worker.events("worker_ready")) == int(processes), 60)
        p = producer(redis_server)
        for n in range(3):
            p.send("q-ok", {"n": n})
        p.close()
        wait_for(lambda: len(effects(r, "ran")) == 3, 60)
        wait_for(lambda: _scrape(port).get("dramatiq_messages_total") == 3, 20)
        seen = _scrape(port)
        assert seen["dramatiq_message_duration_milliseconds_count"] == 3
        assert seen.get("dramatiq_message_errors_total", 0) == 0
    finally:
        worker.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(30)
        worker.stop()  # kills what is left


def test_a_bad_metrics_port_is_a_configuration_error(redis_server: RedisServer) -> None:
    from runner.errors import ConfigError  # noqa: PLC0415
    from tests.queue.helpers import cli  # noqa: PLC0415

    res = cli(queue_env(redis_server, CRON_RUNNER_WORKER_METRICS_PORT="none"), "worker")
    assert res.returncode == ConfigError.exit_code
    assert "CRON_RUNNER_WORKER_METRICS_PORT" in res.stderr and "Traceback" not in res.stderr
