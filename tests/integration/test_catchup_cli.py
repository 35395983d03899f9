"""Catch-up in real processes: two servers' crontab lines racing at 13:00 under libfaketime
(Debian's faketime; tests/helpers/faketime_sleep mends its sleeps), and the round trips a run
costs, counted with MONITOR (docs/design.md, Catch-up, trigger and backfill)."""

from __future__ import annotations

import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import redis

from runner.keys import TaskKeys
from runner.lease.scripts import Acquired, Lease, new_token
from runner.testing import RedisServer
from tests.helpers.monitor import client_commands
from tests.helpers.proc import CRON_RUNNER, ROOT, events, outcome, run, runner_env

HOUR = 3600
SLEEP_FIX = ROOT / "tests" / "helpers" / "faketime_sleep"
# In the future of the Redis server's clock, which faketime does not move.
AT_10 = int(datetime(2031, 3, 4, 10, 0, tzinfo=UTC).timestamp())
AT_13 = AT_10 + 3 * HOUR


def keys(task: str) -> TaskKeys:
    return TaskKeys("cron-runner", "default", task)


def mark_done(r: redis.Redis, task: str, slot: int) -> None:
    lease = Lease(r, keys(task), new_token("earlier", slot), ttl_ms=10_000, indexed=False)
    assert isinstance(lease.acquire(slot), Acquired)
    lease.complete(slot, {"slot": slot, "outcome": "ran"}, {"last_outcome": "ran"})


def test_two_servers_at_13_run_11_and_12_once_each_then_13(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    faketime = shutil.which("faketime")
    assert faketime, "faketime is not installed: apt-get install faketime"
    mark_done(r, "hourly", AT_10)
    r.hset(keys("hourly").meta, "since", str(AT_10 * 1000))  # its first run, at 10:00
    effects = tmp_path / "effects"
    env = {
        **runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 * * * *",
                     CRON_RUNNER_CATCHUP="all", CRON_RUNNER_CATCHUP_WINDOW="3h",
                     CRON_RUNNER_LEASE_TTL="3s"),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": f"{SLEEP_FIX}:{ROOT}",
    }  # fmt: skip
    offset = AT_13 + 5 - time.time()
    command = f'echo "$CRON_RUNNER_SLOT $CRON_RUNNER_HOLDER" >> {effects}; sleep 0.5'
    argv = [faketime, "-m", "-f", f"{offset:+.3f}s", CRON_RUNNER, "exec", "--name", "hourly"]
    procs = [
        subprocess.Popen(
            [*argv, "--holder", holder, "--", "sh", "-c", command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for holder in ("server-a", "server-b")
    ]
    results = [(p.wait(timeout=60), p.communicate()[1]) for p in procs]

    assert [code for code, _ in results] == [0, 0], results
    assert sorted(outcome(err) or "" for _, err in results) in (
        ["ran", "skipped_held"], ["ran", "skipped_done"]
    )  # fmt: skip
    lines = [line.split() for line in effects.read_text().splitlines()]
    assert [int(slot) for slot, _ in lines] == [AT_10 + HOUR, AT_10 + 2 * HOUR, AT_13]
    assert len({holder for _, holder in lines}) == 1  # one server, under its one lease


def test_a_run_with_nothing_missed_costs_2_round_trips_and_one_more_per_slot_caught_up(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 * * * *",
                     CRON_RUNNER_CATCHUP="all", CRON_RUNNER_CATCHUP_WINDOW="3h")  # fmt: skip
    unscheduled = {k: v for k, v in env.items() if "SCHEDULE" not in k and "CATCHUP" not in k}
    # Caches the scripts and indexes the tasks, which only a task's first run does; and sets
    # 'since' to now: the slots before it are no task's missed ones.
    for task in ("counted", "behind"):
        warm = run(["exec", "--name", task, "--", "true"], unscheduled)
        assert warm.returncode == 0, warm.stderr
    now = int(time.time())
    own = now - now % HOUR
    r.hset(keys("behind").meta, "since", "0")
    mark_done(r, "behind", own - 3 * HOUR)

    with client_commands(redis_server) as seen:
        nothing_missed = run(["exec", "--name", "counted", "--", "true"], env)
        after_run = seen()
        caught_up = run(["exec", "--name", "behind", "--", "true"], env)
        after_catch_up = seen()

    assert (outcome(nothing_missed.stderr), outcome(caught_up.stderr)) == ("ran", "ran")
    assert len(after_run) == 2, after_run
    assert all('"EVALSHA"' in line for line in after_catch_up)
    # The acquire, one finish keeping the lease for each of the two slots caught up, the finish.
    assert len(after_catch_up) - len(after_run) == 4, after_catch_up
    caught = [e for e in events(caught_up.stderr) if e.get("event") == "caught_up"]
    assert [e["slot"] for e in caught] == [own - 2 * HOUR, own - HOUR]
