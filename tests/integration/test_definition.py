"""One task, one definition (issue 11, item 10), through the CLI on a real Redis: a runner whose
schedule, time zone, mode or command differs from the one its fleet stored does not run, unless
told to change it on purpose; and a server's run that starts past its slot's starting deadline
records too_late instead of running."""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

import redis

from runner.errors import ConfigError
from runner.testing import RedisServer
from tests.helpers.proc import events, outcome, run, runner_env, side_effects

META = "cron-runner:{default:billing}:meta"


def _billing(effects: Path) -> list[str]:
    return ["exec", "--name", "billing", "--", "sh", "-c", f"echo ran >> {effects}"]


def test_a_runner_with_another_definition_of_the_task_does_not_run(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    """The CronJob says 02:00 in Berlin; the README's crontab line on a server says 02:00 and
    no zone (UTC): each computes its own slot, and both would run the billing that day."""
    effects = tmp_path / "effects"
    minutes = int(time.time() // 60) - 1
    cronjob = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 2 * * *",
                         CRON_RUNNER_TIMEZONE="Europe/Berlin",
                         CRON_RUNNER_JOB_NAME=f"billing-{minutes}")  # fmt: skip
    server = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0  2 * * *")
    first = run(_billing(effects), cronjob)
    assert (outcome(first.stderr), first.returncode) == ("ran", 0), first.stderr
    stored = cast(str | None, r.hget(META, "definition"))
    assert stored is not None and "'0 2 * * *' in Europe/Berlin" in stored

    refused = run(_billing(effects), server)
    assert refused.returncode == ConfigError.exit_code, refused.stderr
    assert "Traceback" not in refused.stderr
    (error,) = [e for e in events(refused.stderr) if e.get("event") == "error"]
    # Both definitions named, and the way to change it on purpose.
    assert "'0 2 * * *' in UTC" in error["msg"]
    assert "'0 2 * * *' in Europe/Berlin" in error["msg"]
    assert "CRON_RUNNER_REDEFINE" in error["msg"]
    assert "cron-runner redefine TASK --force" in error["msg"]
    assert side_effects(effects) == ["ran"]
    # Nothing of the refused runner was written: the watchdog still judges Berlin's schedule.
    state = cast(dict[str, str], r.hgetall("cron-runner:{default:billing}:state"))
    assert state["timezone"] == "Europe/Berlin"
    assert r.hget(META, "definition") == stored

    # Another command under the same name is another definition too.
    other = run(["exec", "--name", "billing", "--", "true"], cronjob)
    assert other.returncode == ConfigError.exit_code, other.stderr

    # Changed on purpose: the server's definition replaces the stored one, and it runs.
    redefined = run(_billing(effects), {**server, "CRON_RUNNER_REDEFINE": "true"})
    assert (outcome(redefined.stderr), redefined.returncode) == ("ran", 0), redefined.stderr
    assert "in UTC" in cast(str, r.hget(META, "definition"))
    assert side_effects(effects) == ["ran", "ran"]
    # From then on the old definition is the one refused.
    stale = run(_billing(effects), cronjob)
    assert stale.returncode == ConfigError.exit_code, stale.stderr
    assert side_effects(effects) == ["ran", "ran"]


def test_redefine_lets_the_next_scheduled_run_store_a_changed_schedule(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    """A `helm upgrade` moves the schedule from 02:00 to 03:00 on every cluster: the new pods
    are refused until `redefine` deletes the stored definition once; then the new one runs and
    a pod of the old one still left is refused."""
    effects = tmp_path / "effects"
    minutes = int(time.time() // 60) - 1
    old = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 2 * * *",
                     CRON_RUNNER_JOB_NAME=f"billing-{minutes - 1}")  # fmt: skip
    new = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 3 * * *",
                     CRON_RUNNER_JOB_NAME=f"billing-{minutes}")  # fmt: skip
    assert run(_billing(effects), old).returncode == 0
    assert run(_billing(effects), new).returncode == ConfigError.exit_code

    unforced = run(["redefine", "billing"], runner_env(redis_server.url))
    assert unforced.returncode == ConfigError.exit_code and "--force" in unforced.stderr
    assert "'0 2 * * *'" in cast(str, r.hget(META, "definition"))

    done = run(["redefine", "billing", "--force"], runner_env(redis_server.url))
    assert done.returncode == 0, done.stderr
    assert "deleted the stored definition [exec sh, schedule '0 2 * * *' in UTC]" in done.stdout
    assert r.hget(META, "definition") is None
    again = run(["redefine", "billing", "--force"], runner_env(redis_server.url))
    assert (again.returncode, "no definition stored" in again.stdout) == (0, True)

    ran = run(_billing(effects), new)
    assert (outcome(ran.stderr), ran.returncode) == ("ran", 0), ran.stderr
    assert "'0 3 * * *'" in cast(str, r.hget(META, "definition"))
    assert run(_billing(effects), old).returncode == ConfigError.exit_code
    assert side_effects(effects) == ["ran", "ran"]


def test_arguments_that_change_from_run_to_run_are_not_another_definition(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A crontab line `exec --name report -- report --date=$(date +%F)`: the program and the
    schedule define the task, not the arguments of the day."""
    minutes = int(time.time() // 60)
    for day, minute in (("2026-12-01", minutes - 2), ("2026-12-02", minutes - 1)):
        env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="* * * * *",
                         CRON_RUNNER_JOB_NAME=f"report-{minute}")  # fmt: skip
        res = run(["exec", "--name", "report", "--", "sh", "-c", f": --date={day}"], env)
        assert (outcome(res.stderr), res.returncode) == ("ran", 0), res.stderr


def test_manual_runs_carry_no_definition(redis_server: RedisServer, tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    scheduled = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="* * * * *")
    assert run(_billing(effects), scheduled).returncode == 0
    # An operator's run now, without a schedule (no slot), of another command: not refused.
    manual = run(["exec", "--name", "billing", "--", "true"], runner_env(redis_server.url))
    assert (outcome(manual.stderr), manual.returncode) == ("ran", 0), manual.stderr


def _an_hour_ago_daily() -> str:
    then = time.gmtime(time.time() - 3600)
    return f"{then.tm_min} {then.tm_hour} * * *"


def test_a_server_run_past_the_starting_deadline_records_too_late_and_does_not_run(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE=_an_hour_ago_daily())
    del env["CRON_RUNNER_STARTING_DEADLINE"]  # the default, 300 s
    late = run(_billing(effects), env)
    assert (outcome(late.stderr), late.returncode) == ("too_late", 0), late.stderr
    assert "CRON_RUNNER_STARTING_DEADLINE" in late.stderr
    assert not effects.exists()
    assert not r.exists("cron-runner:{default:billing}:lease")
    (entry,) = r.xrange("cron-runner:{default:billing}:runs")  # type: ignore[misc]
    assert entry[1]["outcome"] == "too_late"
    assert not r.exists("cron-runner:{default:billing}:state")  # status still says: never ran

    # A longer deadline lets it run; a CronJob pod (a Job name) has the controller's own.
    longer = run(_billing(effects), {**env, "CRON_RUNNER_STARTING_DEADLINE": "2h"})
    assert (outcome(longer.stderr), longer.returncode) == ("ran", 0), longer.stderr
    minutes = int((time.time() - 3600) // 60)
    pod = run(
        ["exec", "--name", "pod", "--", "true"], {**env, "CRON_RUNNER_JOB_NAME": f"pod-{minutes}"}
    )
    assert (outcome(pod.stderr), pod.returncode) == ("ran", 0), pod.stderr


def test_a_crontab_line_read_in_the_wrong_zone_warns_naming_timezone(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # The README's line on a server in UTC+1: cron fires '0 2 * * *' at 02:00 local, 01:00
    # UTC, and the runner, reading the schedule in UTC, finds yesterday's slot. Exit 0 and
    # no run, every day: the log must say so as a warning, and point at --timezone.
    effects = tmp_path / "effects"
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE=_an_hour_ago_daily())
    del env["CRON_RUNNER_STARTING_DEADLINE"]
    late = run(_billing(effects), env)
    assert (outcome(late.stderr), late.returncode) == ("too_late", 0), late.stderr
    (finished,) = [e for e in events(late.stderr) if e.get("event") == "finished"]
    assert finished["level"] == "warning", finished
    assert "--timezone" in finished["msg"] and "UTC" in finished["msg"], finished
    assert not effects.exists()
