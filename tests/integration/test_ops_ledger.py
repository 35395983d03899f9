"""The missed-slot ledger, the maximum run time and the watchdog's heartbeat, on state left by
real runs of the CLI. The watchdog and status run under faketime at chosen instants of one
day two days back; the runs are CronJob pods whose Job names carry that day's slots."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

import redis

from runner.testing import RedisServer
from tests.helpers.proc import cronjob_env, run, run_at, runner_env, spawn
from tests.helpers.wait import wait_for

HOURLY = "0 * * * *"


def _day() -> datetime:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today.fromtimestamp(today.timestamp() - 2 * 86_400, UTC)


def _at(hour: int, minute: int = 0) -> int:
    return int(_day().replace(hour=hour, minute=minute).timestamp())


def _pod(redis_url: str, task: str, slot_s: int) -> dict[str, str]:
    return cronjob_env(redis_url, task, HOURLY, slot_s)


def _missed_at(at_s: int, env: dict[str, str]) -> tuple[int, list[int], list[int]]:
    """(watchdog's exit code, the slots it lists as missed, the slots status lists)."""
    dog = run_at(at_s, ["watchdog", "-o", "json"], env)
    doc = json.loads(dog.stdout)
    listed = doc["overdue"][0]["missed"]["slots"] if doc["overdue"] else []
    status = json.loads(run_at(at_s, ["status", "hourly", "-o", "json"], env).stdout)
    missed = status["tasks"][0]["missed"]
    return dog.returncode, listed, missed["slots"] if missed else []


def test_a_missed_slot_stays_reported_after_a_later_success_until_acknowledged(
    redis_server: RedisServer,
) -> None:
    url, plain = redis_server.url, runner_env(redis_server.url)
    assert (
        run(["exec", "--name", "hourly", "--", "true"], _pod(url, "hourly", _at(10))).returncode
        == 0
    )
    # 11:00 never ran; at 11:20 the watchdog finds it.
    assert _missed_at(_at(11, 20), plain) == (1, [_at(11)], [_at(11)])
    # 12:00 succeeds. The old rule (a success covers every earlier slot) forgot 11:00 here.
    assert (
        run(["exec", "--name", "hourly", "--", "true"], _pod(url, "hourly", _at(12))).returncode
        == 0
    )
    assert _missed_at(_at(12, 20), plain) == (1, [_at(11)], [_at(11)])
    assert _missed_at(_at(13, 5), plain) == (1, [_at(11)], [_at(11)])

    # Acknowledging another slot is refused, naming the one in the ledger.
    wrong = run_at(_at(13, 5), ["ack", "hourly", str(_at(9))], plain)
    assert wrong.returncode == 1
    assert str(_at(11)) in wrong.stdout
    stamp = datetime.fromtimestamp(_at(11), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    acked = run_at(_at(13, 5), ["ack", "hourly", stamp], plain)
    assert acked.returncode == 0, acked.stderr
    assert _missed_at(_at(13, 5), plain) == (0, [], [])
    history = json.loads(run(["history", "hourly", "-o", "json"], plain).stdout)["runs"]
    assert (history[0]["outcome"], history[0]["slot"]) == ("acknowledged", _at(11))


def test_a_missed_slot_that_runs_later_is_no_longer_reported(redis_server: RedisServer) -> None:
    url, plain = redis_server.url, runner_env(redis_server.url)
    assert (
        run(["exec", "--name", "hourly", "--", "true"], _pod(url, "hourly", _at(10))).returncode
        == 0
    )
    assert _missed_at(_at(11, 20), plain)[0] == 1
    assert (
        run(["exec", "--name", "hourly", "--", "true"], _pod(url, "hourly", _at(12))).returncode
        == 0
    )
    # A backfill runs the 11:00 slot (its Job name carries it): the ledger lets it go.
    assert (
        run(["exec", "--name", "hourly", "--", "true"], _pod(url, "hourly", _at(11))).returncode
        == 0
    )
    assert _missed_at(_at(12, 20), plain) == (0, [], [])


def test_ack_needs_a_slot_or_all_and_a_readable_slot(redis_server: RedisServer) -> None:
    from runner.errors import ConfigError, UsageError  # noqa: PLC0415

    plain = runner_env(redis_server.url)
    # A missing SLOT is a usage error; a SLOT that is not a time, a bad value (as every
    # command's time is).
    cases = ((["ack", "hourly"], "--all", UsageError.exit_code),
             (["ack", "hourly", "noon"], "SLOT", ConfigError.exit_code),
             (["ack", "hourly", "9" * 30], "SLOT", ConfigError.exit_code),
             (["ack", "hourly", "9999-12-31T23:59:59-12:00"], "SLOT", ConfigError.exit_code))  # fmt: skip
    for args, named, code in cases:
        res = run(args, plain)
        assert res.returncode == code, res.stderr
        assert named in res.stderr
        assert "Traceback" not in res.stderr


def _status(env: dict[str, str], task: str) -> dict[str, Any]:
    res = run(["status", task, "-o", "json"], env)
    assert res.returncode == 0, res.stderr
    return cast(dict[str, Any], json.loads(res.stdout)["tasks"][0])


def test_a_run_over_its_max_runtime_is_reported(redis_server: RedisServer) -> None:
    plain = runner_env(redis_server.url)
    env = runner_env(redis_server.url, CRON_RUNNER_MAX_RUNTIME="1s")
    # The run stores its max runtime; the next one is judged by it while it runs.
    assert run(["exec", "--name", "slow", "--", "true"], env).returncode == 0
    proc = spawn(["exec", "--name", "slow", "--", "sleep", "30"], env)
    try:
        client = redis_server.client()
        wait_for(lambda: client.exists("cron-runner:{default:slow}:lease"), timeout_s=10)
        quick = json.loads(run(["status", "slow", "-o", "json"], plain).stdout)["tasks"][0]
        assert quick["running_since"] is not None
        wait_for(lambda: _status(plain, "slow")["over_max_runtime"], what="the run to pass 1 s")
        dog = run(["watchdog", "-o", "json"], plain)
        assert dog.returncode == 1, dog.stdout
        (late,) = json.loads(dog.stdout)["over_max_runtime"]
        assert (late["task"], late["max_runtime_s"]) == ("slow", 1.0)
        text = run(["status"], plain).stdout
        assert "OVER MAX RUNTIME  slow: held by" in text
        # A task that has not stored one is given it by the watchdog (the chart passes it).
        assert json.loads(run(["watchdog", "-o", "json", "--max-runtime", "slow=1h"], plain)
                          .stdout)["over_max_runtime"] == []  # fmt: skip
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_the_watchdog_heartbeat_expires(redis_server: RedisServer, r: redis.Redis) -> None:
    plain = runner_env(redis_server.url)

    def heartbeat() -> Any:
        return json.loads(run(["status", "-o", "json"], plain).stdout)["watchdog"]

    assert heartbeat() is None
    assert run(["watchdog", "--heartbeat-ttl", "2s"], plain).returncode == 0
    beat = heartbeat()
    assert (beat["ttl_s"], beat["checked"], beat["overdue"]) == (2.0, 0, 0)
    assert "watchdog: last ran" in run(["status"], plain).stdout
    wait_for(lambda: heartbeat() is None, timeout_s=10)
    assert "watchdog: MISSING" in run(["status"], plain).stdout


def test_in_queue_mode_a_job_no_worker_ran_stays_overdue(redis_server: RedisServer) -> None:
    """The 10:00 slot is enqueued (its marker says so), and no worker ever runs it: the watchdog
    still reports it at each run, not only at the first one that judged the marker."""
    url, plain = redis_server.url, runner_env(redis_server.url)
    pod = {**_pod(url, "q-ok", _at(10)), "CRON_RUNNER_MODE": "enqueue",
           "CRON_RUNNER_TASK_MODULES": "tests.queue.queue_tasks"}  # fmt: skip
    sent = run(["run", "q-ok"], pod)
    assert sent.returncode == 0, sent.stderr
    for at in (_at(10, 20), _at(10, 25)):
        dog = run_at(at, ["watchdog", "-o", "json"], plain)
        assert dog.returncode == 1, dog.stdout
        assert json.loads(dog.stdout)["overdue"][0]["missed"]["slots"] == [_at(10)]


def test_a_heartbeat_ttl_that_cannot_work_is_refused_naming_its_flag(
    redis_server: RedisServer,
) -> None:
    from runner.errors import ConfigError  # noqa: PLC0415

    plain = runner_env(redis_server.url)
    for value in ("0", "500ms", "99999999999h"):
        res = run(["watchdog", "--heartbeat-ttl", value], plain)
        assert res.returncode == ConfigError.exit_code, (value, res.stderr)
        assert "--heartbeat-ttl" in res.stderr and "Traceback" not in res.stderr
