"""The watchdog, on state written by real runs of the CLI: overdue tasks exit 1, by name.

Old runs are made two ways, both through the runner's own scripts: a CronJob pod's run whose
Job name carries a slot two days old (the chart sets CRON_RUNNER_SCHEDULE beside it), and a
run under faketime two days in the past.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import redis

from runner.schedule.slots import Schedule
from runner.testing import RedisServer
from tests.helpers.proc import CRON_RUNNER, cronjob_env, events, run, runner_env

DAY_S = 86_400


def _watchdog(env: dict[str, str], *args: str) -> tuple[int, Any, str]:
    res = run(["watchdog", "--output", "json", *args], env)
    return res.returncode, json.loads(res.stdout), res.stderr


def test_a_cronjob_that_stopped_running_is_overdue_with_its_missed_slots(
    redis_server: RedisServer,
) -> None:
    schedule = Schedule.parse("0 3 * * *", "UTC", 0)
    old_slot = schedule.previous_at_or_before(time.time() - 2 * DAY_S)
    env = cronjob_env(redis_server.url, "nightly", "0 3 * * *", old_slot)
    assert run(["exec", "--name", "nightly", "--", "true"], env).returncode == 0
    # Healthy neighbour: ran its current slot.
    fresh = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="*/5 * * * *")
    assert run(["exec", "--name", "fivemin", "--", "true"], fresh).returncode == 0

    code, doc, stderr = _watchdog(runner_env(redis_server.url))
    assert code == 1
    assert set(doc) == {
        "scope",
        "now",
        "tolerance_s",
        "checked",
        "overdue",
        "over_max_runtime",
        "unchecked",
        "paused",
    }
    assert (doc["checked"], doc["unchecked"], doc["tolerance_s"]) == (2, [], 600)
    (overdue,) = doc["overdue"]
    assert set(overdue) == {"task", "schedule", "timezone", "last_success_at", "missed"}
    assert (overdue["task"], overdue["schedule"], overdue["timezone"]) == (
        "nightly",
        "0 3 * * *",
        "UTC",
    )
    missed = overdue["missed"]["slots"]
    assert missed == [old_slot + DAY_S, old_slot + 2 * DAY_S][: len(missed)]
    assert len(missed) >= 1  # two days back: yesterday's slot, and today's once 03:10 passed
    assert missed[0] == old_slot + DAY_S
    logged = [e for e in events(stderr) if e.get("event") == "overdue"]
    assert [e["task"] for e in logged] == ["nightly"]

    text = run(["watchdog"], runner_env(redis_server.url))
    assert text.returncode == 1
    assert text.stdout.startswith("OVERDUE  nightly (0 3 * * * UTC)")
    assert "2 tasks checked, 1 overdue" in text.stdout


def test_a_run_made_two_days_ago_under_faketime(redis_server: RedisServer) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 * * * *")
    past = subprocess.run(
        ["faketime", "-f", "-2d", CRON_RUNNER, "exec", "--name", "hourly", "--", "true"],
        # Both clocks go back together: with FAKETIME_DONT_FAKE_MONOTONIC=1, libfaketime hands
        # Python's absolute-deadline sleeps (clock_nanosleep) an invalid time: EINVAL.
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert past.returncode == 0, past.stderr
    code, doc, _ = _watchdog(runner_env(redis_server.url))
    assert code == 1
    (overdue,) = doc["overdue"]
    assert overdue["task"] == "hourly"
    assert len(overdue["missed"]["slots"]) == 10  # listed: the oldest ten of ~47
    assert overdue["missed"]["more"] is True

    # The same task run now, for its current slot: the slots it missed stay reported (the
    # ledger) until someone acknowledges them.
    assert run(["exec", "--name", "hourly", "--", "true"], env).returncode == 0
    code, doc, _ = _watchdog(runner_env(redis_server.url))
    assert code == 1
    assert doc["overdue"][0]["missed"]["slots"] == overdue["missed"]["slots"]
    acked = run(["ack", "hourly", "--all"], runner_env(redis_server.url))
    assert acked.returncode == 0, acked.stderr
    code, doc, _ = _watchdog(runner_env(redis_server.url))
    assert (code, doc["overdue"]) == (0, [])


def test_a_task_that_only_ever_failed_is_overdue(redis_server: RedisServer) -> None:
    schedule = Schedule.parse("30 * * * *", "UTC", 0)
    slot = schedule.previous_at_or_before(time.time() - 3 * 3600)
    env = cronjob_env(redis_server.url, "flaky", "30 * * * *", slot)
    assert run(["exec", "--name", "flaky", "--", "false"], env).returncode == 1
    code, doc, _ = _watchdog(runner_env(redis_server.url))
    assert code == 1
    assert doc["overdue"][0]["last_success_at"] is None
    assert doc["overdue"][0]["missed"]["slots"][0] == slot


def test_healthy_and_unknown_tasks_exit_0(redis_server: RedisServer, r: redis.Redis) -> None:
    code, empty, _ = _watchdog(runner_env(redis_server.url))
    assert code == 0
    assert {k: v for k, v in empty.items() if k != "now"} == {
        "scope": "default", "tolerance_s": 600, "checked": 0, "overdue": [], "unchecked": [],
        "over_max_runtime": [], "paused": [],
    }  # fmt: skip
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="*/5 * * * *")
    assert run(["exec", "--name", "fivemin", "--", "true"], env).returncode == 0
    # No schedule: the watchdog cannot judge it, and says so without failing.
    assert (
        run(["exec", "--name", "adhoc", "--", "true"], runner_env(redis_server.url)).returncode == 0
    )
    # Another scope's overdue task is not this scope's business.
    old = Schedule.parse("0 3 * * *", "UTC", 0).previous_at_or_before(time.time() - 2 * DAY_S)
    other = {
        **cronjob_env(redis_server.url, "nightly", "0 3 * * *", old),
        "CRON_RUNNER_SCOPE": "other",
    }
    assert run(["exec", "--name", "nightly", "--", "true"], other).returncode == 0

    code, doc, _ = _watchdog(runner_env(redis_server.url))
    assert (code, doc["checked"], doc["overdue"], doc["unchecked"]) == (0, 1, [], ["adhoc"])
    text = run(["watchdog"], runner_env(redis_server.url))
    assert text.returncode == 0
    assert "1 tasks checked, 0 overdue; no schedule recorded for: adhoc" in text.stdout
    assert _watchdog({**runner_env(redis_server.url), "CRON_RUNNER_SCOPE": "other"})[0] == 1


def test_a_long_tolerance_excuses_a_late_run(redis_server: RedisServer) -> None:
    schedule = Schedule.parse("0 3 * * *", "UTC", 0)
    old_slot = schedule.previous_at_or_before(time.time() - 2 * DAY_S)
    env = cronjob_env(redis_server.url, "nightly", "0 3 * * *", old_slot)
    assert run(["exec", "--name", "nightly", "--", "true"], env).returncode == 0
    assert _watchdog(runner_env(redis_server.url), "--tolerance", "72h")[0] == 0


def _faked_watchdog(
    env: dict[str, str], shift: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["faketime", "-f", shift, CRON_RUNNER, "watchdog", "--output", "json", *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_an_expected_task_that_never_ran_is_overdue_once_a_slot_passes(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    """The chart passes every task with --expect: a CronJob that never fires (suspended by
    mistake, a controller that stopped, a schedule that never matches) fails the watchdog."""
    env = runner_env(redis_server.url)
    expect = ["--expect", "never=0 * * * *", "--expect", "berlin=30 4 * * *;Europe/Berlin"]
    # Told two days ago that these tasks exist: nothing was overdue yet then.
    first = _faked_watchdog(env, "-2d", *expect)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["checked"] == 2
    code, doc, _ = _watchdog(env, *expect)
    assert code == 1
    overdue = {o["task"]: o for o in doc["overdue"]}
    assert sorted(overdue) == ["berlin", "never"]
    assert overdue["berlin"]["timezone"] == "Europe/Berlin"
    assert overdue["never"]["last_success_at"] is None
    # ~47 hourly slots since it was first expected: the oldest ten listed, and "more".
    assert (len(overdue["never"]["missed"]["slots"]), overdue["never"]["missed"]["more"]) == (
        10,
        True,
    )
    # Expecting again does not move the date: the first expectation stands.
    since = r.hget("cron-runner:{default:never}:state", "expected_since")
    assert _watchdog(env, *expect)[0] == 1
    assert r.hget("cron-runner:{default:never}:state", "expected_since") == since
    # Suspended on purpose: the chart passes --ignore, and those are not checked.
    assert _watchdog(env, "--ignore", "never", "--ignore", "berlin")[0] == 0


def test_an_expected_task_is_healthy_once_it_runs_and_unknown_before_any_slot(
    redis_server: RedisServer,
) -> None:
    env = runner_env(redis_server.url)
    # Expected just now: no slot has passed since, so nothing is overdue.
    code, doc, _ = _watchdog(env, "--expect", "fresh=0 3 * * *")
    assert (code, doc["checked"], doc["overdue"]) == (0, 1, [])
    # Expected two days ago, then it ran for its latest slot: the slots of those two days stay
    # missed (the ledger) until acknowledged; then it is healthy.
    assert _faked_watchdog(env, "-2d", "--expect", "late=*/5 * * * *").returncode == 0
    assert _watchdog(env, "--expect", "late=*/5 * * * *")[0] == 1
    ran = {**env, "CRON_RUNNER_SCHEDULE": "*/5 * * * *"}
    assert run(["exec", "--name", "late", "--", "true"], ran).returncode == 0
    assert _watchdog(env, "--expect", "late=*/5 * * * *")[0] == 1
    assert run(["ack", "late", "--all"], env).returncode == 0
    assert _watchdog(env, "--expect", "late=*/5 * * * *")[0] == 0


def test_forget_drops_a_removed_task_from_the_watchdog(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    schedule = Schedule.parse("0 3 * * *", "UTC", 0)
    old_slot = schedule.previous_at_or_before(time.time() - 2 * DAY_S)
    env = cronjob_env(redis_server.url, "removed", "0 3 * * *", old_slot)
    assert run(["exec", "--name", "removed", "--", "true"], env).returncode == 0
    plain = runner_env(redis_server.url)
    text = run(["watchdog"], plain)
    assert text.returncode == 1
    assert "cron-runner forget TASK --force" in text.stdout
    refused = run(["forget", "removed"], plain)
    assert refused.returncode == 78
    assert "--force" in refused.stderr
    r.set("cron-runner:{default:removed}:lease", "pod-x:1", px=60_000)
    assert run(["forget", "removed", "--force"], plain).returncode == 1  # running now
    r.delete("cron-runner:{default:removed}:lease")
    fence_before = r.get("cron-runner:{default:removed}:fence")
    forgot = run(["forget", "removed", "--force"], plain)
    assert forgot.returncode == 0, forgot.stderr
    assert "3 key(s) deleted" in forgot.stdout  # state, history, missed-slot ledger
    assert any(e.get("event") == "forget" for e in events(forgot.stderr))
    assert _watchdog(plain)[0] == 0
    assert r.get("cron-runner:{default:removed}:fence") == fence_before  # never goes back
