"""Worker processes and queue inspection for the queue tests: real `cron-runner worker`
processes against the test's own Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any, cast

import redis

from runner.config.queue import QueueSettings
from runner.config.settings import load_settings
from runner.queue.messages import build_message, enqueue_on, make_broker
from runner.queue.producer import Producer
from runner.queue.stats import QueueStats, queue_stats
from runner.testing import RedisServer
from tests.helpers.proc import CRON_RUNNER, events, runner_env
from tests.helpers.wait import wait_for
from tests.queue.queue_tasks import EFFECTS

NAMESPACE = "cron-runner:queue:default"
TASK_MODULES = "tests.queue.queue_tasks"


def queue_env(server: RedisServer, **extra: str) -> dict[str, str]:
    """Short poll and heartbeat intervals, so re-delivery and retries show within a test."""
    settings = {
        "CRON_RUNNER_TASK_MODULES": TASK_MODULES,
        "CRON_RUNNER_WORKER_POLL_INTERVAL": "50ms",
        "CRON_RUNNER_QUEUE_HEARTBEAT_TIMEOUT": "2s",
        "CRON_RUNNER_QUEUE_MAINTENANCE_CHANCE": "0.05",
    }
    return runner_env(server.url, **{**settings, **extra})


class WorkerProc:
    """`cron-runner worker` in its own session (its own process group), stderr to a file."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="worker-", suffix=".log", delete=False
        )
        self.path = Path(self._log.name)
        self.proc = subprocess.Popen(
            [CRON_RUNNER, "worker", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.path.read_text(errors="replace")

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        return [e for e in events(self.text()) if event is None or e.get("event") == event]

    def ready(self) -> bool:
        return bool(self.events("worker_ready"))

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def kill_group(self) -> None:
        """kill -9 the worker and everything it started: a node that vanishes."""
        os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def stopped(self, timeout: float = 30) -> tuple[int, str]:
        """SIGTERM, as Kubernetes stops a pod: the exit code and the log once it has exited."""
        self.terminate()
        return self.wait(timeout), self.text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill_group()
            self.proc.wait(timeout=10)
        self._log.close()
        self.path.unlink(missing_ok=True)


def start_worker(
    workers: list[WorkerProc], env: dict[str, str], *args: str, holder: str = "w"
) -> WorkerProc:
    """A worker named ``w<n>`` (``holder`` + its index), kept in ``workers`` for the fixture
    to stop; returns once it is ready."""
    w = WorkerProc({**env, "CRON_RUNNER_HOLDER": f"{holder}{len(workers)}"}, *args)
    workers.append(w)
    wait_for(w.ready, 20, "the worker to be ready")
    return w


def effects(r: redis.Redis, what: str | None = None) -> list[dict[str, Any]]:
    out = [json.loads(line) for line in cast(list[str], r.lrange(EFFECTS, 0, -1))]
    return [e for e in out if what is None or e["what"] == what]


def stats(r: redis.Redis, queue: str) -> QueueStats:
    (row,) = queue_stats(r, NAMESPACE, [queue])
    return row


def unacked(r: redis.Redis) -> int:
    """Messages some worker fetched and never acknowledged (stuck unless re-delivered)."""
    return sum(int(cast(int, r.scard(k))) for k in r.scan_iter(match=f"{NAMESPACE}:__acks__.*"))


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CRON_RUNNER, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def producer(server: RedisServer) -> Producer:
    """A sender as a task or a script would have one, on the tests' namespace."""
    settings = load_settings(
        {"CRON_RUNNER_REDIS_URL": server.url, "CRON_RUNNER_TASK_MODULES": TASK_MODULES}
    )
    return Producer(settings, QueueSettings(namespace=NAMESPACE))


def send_slot(
    r: redis.Redis,
    task: str,
    slot: int | None,
    *,
    payload: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    name: str | None = None,
) -> str:
    """The message an enqueueing run sends for ``slot`` (its name, the message options of its
    CRON_RUNNER_* settings), sent here directly: several slots can then wait on the queue
    together, as when the workers were busy or down when the CronJobs fired."""
    message = build_message(task, task, slot=slot, fence=1, payload=payload, message_id=None,
                            limit_bytes=None, options=options, name=name or task)  # fmt: skip
    broker = make_broker(r, QueueSettings(namespace=NAMESPACE))
    with r.pipeline(transaction=False) as pipe:
        enqueue_on(pipe, broker, message)
        pipe.execute()
    return message.message_id


def history(env: dict[str, str], task: str) -> list[dict[str, Any]]:
    """`cron-runner history TASK -o json`, oldest first."""
    done = cli(env, "history", task, "-o", "json", "-n", "100")
    assert done.returncode == 0, done.stderr
    return list(reversed(json.loads(done.stdout)["runs"]))
