"""Queue mode over Redis in production shapes, all real processes: Sentinel (1 primary,
1 replica, 3 sentinels, with and without a sentinel password) and TLS with a client
certificate. The README says these work as for runs because the broker is given the
runner's own client; here an enqueue-mode run sends the slot's message and a real
`cron-runner worker`, configured from the environment alone, runs it and stops cleanly.

The task is tests.sample_tasks' `ok`, which records to a file: the queue tests' own tasks
write through a plain client of CRON_RUNNER_REDIS_URL, which cannot reach a primary that
only the sentinels name, nor a TLS server that wants this test's CA and client certificate.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis

from runner.keys import TaskKeys
from runner.queue.stats import QueueStats
from tests.helpers.proc import events, outcome, runner_env, side_effects
from tests.helpers.topologies import SentinelTopology, TlsFiles, TlsRedisServer, make_tls_files
from tests.helpers.wait import wait_for
from tests.queue.helpers import NAMESPACE, WorkerProc, cli, stats, unacked

TASK = "ok"


def _env(url: str, effects: Path, **extra: str) -> dict[str, str]:
    """queue_env's short intervals, for tests.sample_tasks."""
    return runner_env(
        url,
        CRON_RUNNER_TASK_MODULES="tests.sample_tasks",
        CRON_RUNNER_WORKER_POLL_INTERVAL="50ms",
        CRON_RUNNER_QUEUE_HEARTBEAT_TIMEOUT="2s",
        CRON_RUNNER_QUEUE_MAINTENANCE_CHANCE="0.05",
        SIDE_EFFECTS=str(effects),
        **extra,
    )


def enqueue_then_work(env: dict[str, str], primary: redis.Redis, effects: Path) -> None:
    """One enqueue-mode run sends the slot's message to ``primary``; a worker runs it once,
    under the task's lease, drains the queue and exits 0 on SIGTERM."""
    minutes = int(time.time() // 60)
    slot = minutes * 60
    enqueue = {**env, "CRON_RUNNER_MODE": "enqueue",
               "CRON_RUNNER_JOB_NAME": f"shapes-{minutes}", "CRON_RUNNER_CRONJOB_NAME": "shapes"}  # fmt: skip
    sent = cli(enqueue, "run", TASK, "--holder", "pod-0")
    assert (sent.returncode, outcome(sent.stderr)) == (0, "enqueued"), sent.stderr
    (message,) = [e for e in events(sent.stderr) if e.get("event") == "enqueued"]
    assert message["queue"] == TASK
    assert stats(primary, TASK).ready == 1

    worker = WorkerProc({**env, "CRON_RUNNER_HOLDER": "shape-worker"}, "--queues", TASK)
    try:
        wait_for(lambda: worker.ready() or worker.proc.poll() is not None, 20, "the worker")
        assert worker.ready(), worker.text()[-3000:]
        wait_for(lambda: side_effects(effects), 20, "the job to run")
        wait_for(lambda: unacked(primary) == 0, 10, "the worker to acknowledge the job")
        code, text = worker.stopped()
    finally:
        worker.stop()
    assert code == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    (stopped,) = [e for e in events(text) if e.get("event") == "worker_stopped"]
    assert stopped["exit_code"] == 0

    # "ran HOLDER FENCE SLOT TIME", once: the worker's id, the slot, and the fencing token of
    # the worker's own lease, taken after the enqueue's.
    (ran,) = side_effects(effects)
    holder, fence, ran_slot = ran.split()[1:4]
    assert (holder, ran_slot) == ("shape-worker", str(slot))
    assert int(fence) > message["fence"]
    assert stats(primary, TASK) == QueueStats(TASK, 0, 0, 0, 0)
    # It left the heartbeats holding nothing: no maintenance will take it for dead.
    assert primary.zcard(f"{NAMESPACE}:__heartbeats__") == 0
    keys = TaskKeys("cron-runner", "default", TASK)
    state = cast(dict[str, str], primary.hgetall(keys.state))
    assert (state["last_outcome"], state["last_success_slot"]) == ("ran", str(slot))
    assert state["last_enqueued_slot"] == str(slot)


# -- Sentinel -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sentinel_password", [None, "sentinel-s3cret"], ids=["open-sentinels", "sentinel-password"]
)
def test_sentinel_enqueue_and_worker_find_the_primary_through_the_sentinels(
    tmp_path: Path, sentinel_password: str | None
) -> None:
    effects = tmp_path / "effects"
    with SentinelTopology(sentinel_password=sentinel_password) as topology:
        extra = {
            "CRON_RUNNER_REDIS_SENTINELS": topology.sentinel_env,
            "CRON_RUNNER_REDIS_SENTINEL_MASTER": topology.master_name,
        }
        if sentinel_password:
            extra["CRON_RUNNER_REDIS_SENTINEL_PASSWORD"] = sentinel_password
        # The URL's host is not used with Sentinel: the sentinels name the primary.
        env = _env("redis://ignored.invalid:6379/0", effects, **extra)
        primary = topology.server_on(topology.master_port()).client()
        try:
            enqueue_then_work(env, primary, effects)
        finally:
            primary.close()


# -- TLS ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(tls: TlsFiles) -> Iterator[TlsRedisServer]:
    server = TlsRedisServer(tls, require_client_cert=True)
    with server:
        yield server


def test_tls_with_client_certificate_enqueue_and_worker(
    tls_server: TlsRedisServer, tls: TlsFiles, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    env = _env(
        tls_server.url,
        effects,
        CRON_RUNNER_REDIS_TLS_CA_FILE=tls.ca_cert,
        CRON_RUNNER_REDIS_TLS_CERT_FILE=tls.client_cert,
        CRON_RUNNER_REDIS_TLS_KEY_FILE=tls.client_key,
    )
    assert env["CRON_RUNNER_REDIS_URL"].startswith("rediss://")
    primary = tls_server.client()
    try:
        enqueue_then_work(env, primary, effects)
        # The server takes TLS clients with a certificate only: the same worker without
        # one is refused at start (exit 78), so the run above did use the runner's client.
        refused = cli(
            {**env, "CRON_RUNNER_REDIS_TLS_CERT_FILE": "", "CRON_RUNNER_REDIS_TLS_KEY_FILE": ""},
            "worker",
        )
        assert refused.returncode == 78, refused.stderr[-3000:]
        assert "CERTIFICATE_REQUIRED" in refused.stderr
    finally:
        primary.close()
