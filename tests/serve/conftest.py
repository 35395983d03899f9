"""One Redis per module with tasks in every state, each made by real runs of the CLI, and a
real `cron-runner serve` process on a free port."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.schedule.slots import Schedule
from runner.testing import RedisServer
from tests.helpers.proc import cronjob_env, events, run, runner_env, spawn
from tests.helpers.wait import schedule_far_from_edges, wait_for
from tests.queue.helpers import TASK_MODULES, WorkerProc, queue_env

HOSTILE_HOLDER = "<b>pod</b><script>alert(1)</script>"
PAUSE_NOTE = "<i>db</i> migration"
PAUSED_UNTIL_S = 4_070_908_800  # 2099-01-01T00:00:00Z
DAY_S = 86_400


@dataclass
class World:
    server: RedisServer
    env: dict[str, str]
    running: subprocess.Popen[str]


def _ok(res: subprocess.CompletedProcess[str], code: int = 0) -> None:
    assert res.returncode == code, res.stderr


def _over_max_runtime(env: dict[str, str], task: str) -> bool:
    res = run(["status", task, "-o", "json"], env)
    assert res.returncode == 0, res.stderr
    return bool(json.loads(res.stdout)["tasks"][0]["over_max_runtime"])


def build_world(server: RedisServer) -> World:
    """ok, failing (twice in a row), lease lost, terminated, unavailable, overdue (ledger), running past its
    max runtime, a Berlin task, a hostile holder, paused (with a hostile note), and queue mode:
    an enqueue a worker ran, and one waiting on a queue no worker reads."""
    url = server.url
    env = runner_env(url)
    # The two runs of `healthy` must share a slot (the second skips): a schedule whose edges
    # are far from now.
    every_five = schedule_far_from_edges(300)
    five = runner_env(url, CRON_RUNNER_SCHEDULE=every_five)
    _ok(run(["exec", "--name", "healthy", "--", "true"], five))
    _ok(run(["exec", "--name", "healthy", "--holder", "pod-b", "--", "true"], five))  # a skip
    for _ in range(2):
        _ok(run(["exec", "--name", "failing", "--", "false"], runner_env(
            url, CRON_RUNNER_SCHEDULE="* * * * *")), 1)  # fmt: skip
    berlin = runner_env(url, CRON_RUNNER_SCHEDULE="0 6 * * *", CRON_RUNNER_TIMEZONE="Europe/Berlin")
    _ok(run(["exec", "--name", "berlin", "--", "true"], berlin))
    _ok(run(["exec", "--name", "hostile", "--holder", HOSTILE_HOLDER, "--", "sh", "-c",
             "echo '<img src=x onerror=alert(1)>' >&2; exit 3"], five), 3)  # fmt: skip

    # Lease lost: an admin unlocks a running task; terminated: SIGTERM mid-run.
    client = server.client()
    for task in ("lost", "stopped"):
        proc = spawn(["exec", "--name", task, "--", "sleep", "30"], five)
        lease = f"cron-runner:{{default:{task}}}:lease"
        wait_for(lambda lease=lease: client.exists(lease), 10)  # type: ignore[misc]
        if task == "lost":
            _ok(run(["unlock", "lost", "--force"], env))
        else:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)

    # Unavailable: no replica acknowledged the lease (CRON_RUNNER_REDIS_MIN_REPLICAS), so the
    # run gave it back without running, and recorded why.
    from runner.errors import StoreUnavailable  # noqa: PLC0415

    alone = runner_env(url, CRON_RUNNER_SCHEDULE=every_five, CRON_RUNNER_REDIS_MIN_REPLICAS="1",
                       CRON_RUNNER_LEASE_TTL="1s")  # fmt: skip
    _ok(run(["exec", "--name", "alone", "--", "true"], alone), StoreUnavailable.exit_code)

    # Overdue: a nightly task whose last run was two days ago, its misses in the ledger.
    nightly = Schedule.parse("0 3 * * *", "UTC", 0).previous_at_or_before(time.time() - 2 * DAY_S)
    _ok(
        run(
            ["exec", "--name", "nightly", "--", "true"],
            cronjob_env(url, "nightly", "0 3 * * *", nightly),
        )
    )
    _ok(run(["watchdog"], env), 1)

    # Paused after a run; the pod of the slot before skips (recorded once), a later slot too.
    _ok(run(["exec", "--name", "held-back", "--", "true"], five))
    _ok(run(["pause", "held-back", "--note", PAUSE_NOTE, "--until", str(PAUSED_UNTIL_S)], env))
    earlier = Schedule.parse(every_five, "UTC", 0).previous_at_or_before(time.time() - 600)
    _ok(run(["exec", "--name", "held-back", "--", "true"],
            cronjob_env(url, "held-back", every_five, earlier)))  # fmt: skip

    # Running past its max runtime: the first run stores it, the second one holds the lease.
    slow = runner_env(url, CRON_RUNNER_SCHEDULE=every_five, CRON_RUNNER_MAX_RUNTIME="1s")
    _ok(run(["exec", "--name", "slow", "--", "true"], slow))
    # A manual run (no schedule: no slot), since the scheduled one already ran this slot.
    running = spawn(["exec", "--name", "slow", "--holder", "pod-slow", "--", "sleep", "120"], env)
    wait_for(lambda: client.exists("cron-runner:{default:slow}:lease"), 10)

    # Queue mode: q-ok enqueued by its CronJob and run by a worker; q-billed waits on billing.
    qenv = queue_env(server, CRON_RUNNER_SCHEDULE=every_five, CRON_RUNNER_MODE="enqueue")
    _ok(run(["run", "q-ok"], qenv))
    _ok(run(["run", "q-billed"], qenv))
    worker = WorkerProc(queue_env(server), "--queues", "q-ok", "--processes", "1")
    try:
        wait_for(lambda: client.hget("cron-runner:{default:q-ok}:state", "last_success_at"), 60)
    finally:
        worker.terminate()
        worker.wait()
        worker.stop()
    wait_for(lambda: _over_max_runtime(env, "slow"), what="the slow run to pass its max runtime")
    return World(server, {**env, "CRON_RUNNER_TASK_MODULES": TASK_MODULES}, running)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with RedisServer() as server:
        built = build_world(server)
        try:
            yield built
        finally:
            built.running.terminate()
            built.running.communicate(timeout=60)


@dataclass
class Served:
    base: str
    proc: subprocess.Popen[str]
    log: Path

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@contextmanager
def serving(env: dict[str, str], log: Path, *args: str) -> Iterator[Served]:
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*spawn_args(), "serve", "--host", "127.0.0.1", "--port", "0", *args],
            env=env, stdout=subprocess.DEVNULL, stderr=out, text=True,
        )  # fmt: skip
    try:
        wait_for(lambda: [e for e in events(log.read_text()) if e.get("event") == "serving"]
                 or proc.poll() is not None, 20)  # fmt: skip
        serving_ = [e for e in events(log.read_text()) if e.get("event") == "serving"]
        assert serving_, log.read_text()
        yield Served(f"http://127.0.0.1:{serving_[0]['port']}", proc, log)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def spawn_args() -> list[str]:
    from tests.helpers.proc import CRON_RUNNER  # noqa: PLC0415

    return [CRON_RUNNER]
