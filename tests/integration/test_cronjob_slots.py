"""A CronJob pod's slot, from the Job name and the scheduled-timestamp annotation, bounded by now
and by the marker retention (issue 11 item 3, issue 13 item 3), through the CLI on a real Redis."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import redis

from runner.errors import ConfigError
from runner.schedule.slots import Schedule
from runner.testing import RedisServer
from tests.helpers.proc import events, outcome, run, runner_env, side_effects

DAY_S = 86_400


def _pod_env(redis_url: str, effects: Path, slot_s: int, **extra: str) -> dict[str, str]:
    return runner_env(
        redis_url,
        CRON_RUNNER_JOB_NAME=f"nightly-{slot_s // 60}",
        CRON_RUNNER_CRONJOB_NAME="nightly",
        CRON_RUNNER_SCHEDULE="0 3 * * *",
        SIDE_EFFECTS=str(effects),
        **extra,
    )


def _rfc3339(t_s: int) -> str:
    return datetime.fromtimestamp(t_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_job_named_for_a_future_slot_does_not_run_and_writes_nothing(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    tomorrow = (int(time.time()) // 60 + 24 * 60) * 60
    res = run(["run", "ok"], _pod_env(redis_server.url, effects, tomorrow))
    assert res.returncode == ConfigError.exit_code, res.stderr
    assert f"CRON_RUNNER_JOB_NAME='nightly-{tomorrow // 60}'" in res.stderr
    assert "later than now" in res.stderr
    assert "Traceback" not in res.stderr
    assert side_effects(effects) == []
    assert r.keys("*") == []
    # Beyond the tolerance only: a Job named for the coming minute, seconds early, runs.
    soon = (int(time.time()) // 60 + 1) * 60
    if soon - time.time() < 25:
        assert run(["run", "ok"], _pod_env(redis_server.url, effects, soon)).returncode == 0


def test_a_job_slot_older_than_its_marker_retention_is_not_run_and_is_recorded(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    daily = Schedule.parse("0 3 * * *", "UTC", 0)
    assert daily.retention_s == 2 * DAY_S
    old = daily.previous_at_or_before(time.time() - 3 * DAY_S)
    res = run(["run", "ok"], _pod_env(redis_server.url, effects, old))
    assert res.returncode == 0, res.stderr
    assert outcome(res.stderr) == "skipped_stale"
    (finished,) = [e for e in events(res.stderr) if e.get("event") == "finished"]
    assert "older than its marker's retention (172800s)" in finished["msg"]
    assert side_effects(effects) == []
    assert not r.keys("cron-runner:{default:ok}:slot:*")
    assert r.keys("cron-runner:{default:ok}:lease") == []
    # Recorded in the run stream, without moving what status and the watchdog read.
    (entry,) = cast(list[Any], r.xrange("cron-runner:{default:ok}:runs"))
    assert entry[1]["outcome"] == "skipped_stale"
    state = cast(dict[str, str], r.hgetall("cron-runner:{default:ok}:state"))
    assert not {k for k in state if k.endswith("_slot")}
    status = run(["status", "--output", "json", "ok"], runner_env(redis_server.url))
    (task,) = json.loads(status.stdout)["tasks"]
    assert task["last_slot"] is None
    assert task["last_success"] is None
    # Within the retention the same Job runs.
    recent = daily.previous_at_or_before(time.time() - DAY_S)
    assert outcome(run(["run", "ok"], _pod_env(redis_server.url, effects, recent)).stderr) == "ran"
    assert len(side_effects(effects)) == 1


def test_status_and_the_watchdog_ignore_an_implausible_recorded_slot(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    """A success recorded for a slot in 2160 (what the previous release wrote for such a Job
    name) does not hide the missed slots since the run, nor move the next slot."""
    daily = Schedule.parse("0 3 * * *", "UTC", 0)
    ran_at = time.time() - 3 * DAY_S
    far = 99_999_999 * 60
    r.hset(
        "cron-runner:{default:nightly}:state",
        mapping={
            "schedule": "0 3 * * *", "timezone": "UTC", "last_slot": far,
            "last_outcome": "ran", "last_run_at": f"{ran_at:.3f}",
            "last_success_at": f"{ran_at:.3f}", "last_success_slot": far,
        },
    )  # fmt: skip
    env = runner_env(redis_server.url)
    status = run(["status", "--output", "json", "nightly"], env)
    (task,) = json.loads(status.stdout)["tasks"]
    assert task["next_slot"] == daily.next_after(time.time())
    watchdog = run(["watchdog", "--output", "json"], env)
    assert watchdog.returncode == 1, watchdog.stdout
    (overdue,) = json.loads(watchdog.stdout)["overdue"]
    assert overdue["task"] == "nightly"
    missed = overdue["missed"]["slots"]
    assert missed and missed[0] == daily.next_after(ran_at)


def test_the_scheduled_timestamp_annotation_agrees_with_the_job_name(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    minute = int(time.time()) // 60 * 60
    # The controller writes it in the CronJob's zone: the same instant.
    berlin = datetime.fromtimestamp(minute, UTC).astimezone().isoformat(timespec="seconds")
    for stamp in (_rfc3339(minute), berlin):
        env = _pod_env(redis_server.url, effects, minute, CRON_RUNNER_SCHEDULED_TIMESTAMP=stamp)
        res = run(["run", "ok", "--holder", stamp], env)
        assert res.returncode == 0, res.stderr
        assert [e["slot"] for e in events(res.stderr) if e.get("event") == "acquired"][:1] in (
            [minute],
            [],
        )
    assert len(side_effects(effects)) == 1  # the second pod found the slot done

    # A disagreement is a configuration error naming both, and nothing is written.
    r.flushall()
    other = _rfc3339(minute - 3600)
    env = _pod_env(redis_server.url, effects, minute, CRON_RUNNER_SCHEDULED_TIMESTAMP=other)
    res = run(["run", "ok"], env)
    assert res.returncode == ConfigError.exit_code, res.stderr
    assert "CRON_RUNNER_JOB_NAME='nightly-" in res.stderr
    assert "CRON_RUNNER_SCHEDULED_TIMESTAMP" in res.stderr
    assert other in res.stderr
    assert r.keys("*") == []

    # Present alone (a Job name that carries no minute), it gives the slot.
    env = {
        **_pod_env(redis_server.url, effects, minute, CRON_RUNNER_SCHEDULED_TIMESTAMP=other),
        "CRON_RUNNER_JOB_NAME": "nightly-manual-x7k2",
    }
    res = run(["run", "ok"], env)
    assert res.returncode == 0, res.stderr
    assert [e["slot"] for e in events(res.stderr) if e.get("event") == "acquired"] == [
        minute - 3600
    ]

    bad = _pod_env(redis_server.url, effects, minute, CRON_RUNNER_SCHEDULED_TIMESTAMP="yesterday")
    res = run(["run", "ok"], bad)
    assert res.returncode == ConfigError.exit_code
    assert "CRON_RUNNER_SCHEDULED_TIMESTAMP='yesterday' is not a time: expected RFC 3339" in (
        res.stderr
    )
