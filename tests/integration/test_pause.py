"""Pause fleet-wide (issue 17, item 3), through the real CLI on a real Redis: a pause from one
process stops the runs of others (crontab lines and CronJob pods), resume lets the next one
run, a pause with an end resumes by itself, pause_on_failures, what status, history and the
watchdog show, the protocol minimum a pause raises and puts back, and bad input (78)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from runner.config.settings import REPLACE
from runner.errors import ConfigError
from runner.keys import TaskKeys
from runner.lease.scripts import Lease, Paused, new_token
from runner.ops import pause as ops_pause
from runner.schedule.slots import Schedule
from runner.testing import RedisServer
from tests.helpers.lease_tools import counting_client
from tests.helpers.proc import (
    cronjob_env,
    events,
    outcome,
    run,
    run_at,
    runner_env,
    spawn,
)
from tests.helpers.wait import schedule_far_from_edges, wait_for

FIVE = "*/5 * * * *"
HOURLY = "0 * * * *"


def keys(task: str) -> TaskKeys:
    return TaskKeys("cron-runner", "default", task)


def meta(r: redis.Redis, task: str) -> dict[str, str]:
    return cast(dict[str, str], r.hgetall(keys(task).meta))


def runs(r: redis.Redis, task: str) -> list[dict[str, str]]:
    return [fields for _, fields in cast(list[Any], r.xrange(keys(task).runs))]


def status(env: dict[str, str], task: str) -> dict[str, Any]:
    res = run(["status", task, "-o", "json"], env)
    assert res.returncode == 0, res.stderr
    (doc,) = json.loads(res.stdout)["tasks"]
    return cast(dict[str, Any], doc)


def appender(effects: Path) -> list[str]:
    """A command that appends who ran it ($SIDE): one definition, whoever runs it."""
    return ["sh", "-c", f'echo "$SIDE" >> {effects}']


def ran(effects: Path) -> list[str]:
    return effects.read_text().split() if effects.exists() else []


def skipped_line(stderr: str) -> str:
    (line,) = [e["msg"] for e in events(stderr) if e.get("event") == "skipped"]
    return str(line)


# -- one process pauses, the others skip ---------------------------------------------------------


def test_a_pause_from_one_process_stops_the_runs_of_three_others_and_resume_lets_them_run(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    url, effects = redis_server.url, tmp_path / "effects"
    command = appender(effects)
    five = schedule_far_from_edges(300)  # the crontab runs below all compute now_slot
    now_slot = Schedule.parse(five, "UTC", 0).previous_at_or_before(time.time() + 30)

    def pod(slot: int, side: str) -> dict[str, str]:
        return cronjob_env(url, "maint", five, slot, SIDE=side)

    def server(side: str) -> list[str]:
        return ["exec", "--name", "maint", "--schedule", five, "--holder", side, "--", *command]

    first = run(["exec", "--name", "maint", "--", *command], pod(now_slot - 600, "pod-0"))
    assert (first.returncode, outcome(first.stderr)) == (0, "ran"), first.stderr

    ops = runner_env(url, CRON_RUNNER_HOLDER="ops@bastion")
    paused = run(["pause", "maint", "--note", "db migration"], ops)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("paused maint by ops@bastion since ")
    assert "until resumed: db migration" in paused.stdout

    procs = {
        "server-a": spawn(server("server-a"), runner_env(url, SIDE="server-a")),
        "server-b": spawn(server("server-b"), runner_env(url, SIDE="server-b")),
        "pod-1": spawn(["exec", "--name", "maint", "--", *command], pod(now_slot - 300, "pod-1")),
    }
    for side, proc in procs.items():
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, (side, stderr)
        assert outcome(stderr) == "paused", (side, stderr)
        assert skipped_line(stderr) == "skipped: the task is paused by ops@bastion: db migration"
        assert "Traceback" not in stderr
    assert ran(effects) == ["pod-0"]

    # One record per skipped slot, whatever the replicas; the pause itself recorded with its note.
    records = runs(r, "maint")
    pause_record = next(e for e in records if e["outcome"] == "pause")
    assert (pause_record["holder"], pause_record["note"]) == ("ops@bastion", "db migration")
    skips = [e for e in records if e["outcome"] == "paused"]
    assert sorted(int(e["slot"]) for e in skips) == [now_slot - 300, now_slot]
    assert {e["error"] for e in skips} == {"paused by ops@bastion: db migration"}

    doc = status(ops, "maint")
    assert doc["paused"]["by"] == "ops@bastion" and doc["paused"]["note"] == "db migration"
    assert doc["paused"]["until"] is None and doc["overdue"] is False
    history = run(["history", "maint"], ops)
    assert "pause" in history.stdout and "until resumed: db migration" in history.stdout

    resumed = run(["resume", "maint"], runner_env(url, CRON_RUNNER_HOLDER="ops@laptop"))
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("resumed maint: its next slot runs")
    # The slot skipped while paused was not run: a run of it after the resume runs it.
    again = run(server("server-b"), runner_env(url, SIDE="server-b"))
    assert (again.returncode, outcome(again.stderr)) == (0, "ran"), again.stderr
    assert ran(effects) == ["pod-0", "server-b"]
    assert status(ops, "maint")["paused"] is None
    resume_record = runs(r, "maint")[-2]
    assert (resume_record["outcome"], resume_record["holder"]) == ("resume", "ops@laptop")
    assert resume_record["note"] == "paused by ops@bastion: db migration"


def test_pausing_twice_updates_the_note_and_end_and_resuming_twice_is_harmless(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    env = runner_env(redis_server.url)
    assert run(["exec", "--name", "twice", "--", "true"], env).returncode == 0
    assert run(["pause", "twice", "--note", "first"], env).returncode == 0
    since = meta(r, "twice")["paused_at"]
    until = "2099-01-01T00:00:00+01:00"
    again = run(["pause", "twice", "--note", "second", "--until", until], env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("twice was paused already: updated")
    stored = meta(r, "twice")
    assert (stored["paused_at"], stored["paused_note"]) == (since, "second")
    assert float(stored["paused_until"]) == datetime.fromisoformat(until).timestamp()
    assert stored["protocol_min_before_pause"] == "1"  # the one before the first pause
    assert run(["resume", "twice"], env).returncode == 0
    second = run(["resume", "twice"], env)
    assert second.returncode == 0
    assert second.stdout == "twice is not paused: it runs; nothing to do\n"
    assert [e["outcome"] for e in runs(r, "twice")] == ["ran", "pause", "pause", "resume"]


def test_forget_refuses_a_paused_task(redis_server: RedisServer, r: redis.Redis) -> None:
    env = runner_env(redis_server.url)
    assert run(["exec", "--name", "gone", "--", "true"], env).returncode == 0
    assert run(["pause", "gone", "--note", "retired"], env).returncode == 0
    refused = run(["forget", "gone", "--force"], env)
    assert refused.returncode == 1
    assert "not forgotten: gone is paused" in refused.stdout
    assert "`cron-runner resume gone` first" in refused.stdout
    assert r.exists(keys("gone").state)
    assert run(["resume", "gone"], env).returncode == 0
    assert run(["forget", "gone", "--force"], env).returncode == 0


# -- a pause with an end -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("until", "says"),
    [
        ("2020-01-01T00:00:00Z", "is in the past"),
        ("1600000000", "is in the past"),
        ("2030-01-01T00:00:00", "names no time zone"),
        ("2030-01-01", "names no time zone"),
        ("tomorrow", "is not a time"),
        ("2030-13-01T00:00:00Z", "is not a time"),
        ("999999999999", "after the year 9999"),
    ],
)
def test_until_must_be_a_time_to_come_with_a_zone(
    redis_server: RedisServer, r: redis.Redis, until: str, says: str
) -> None:
    env = runner_env(redis_server.url)
    assert run(["exec", "--name", "later", "--", "true"], env).returncode == 0
    res = run(["pause", "later", "--until", until], env)
    assert res.returncode == ConfigError.exit_code, res.stderr
    assert f"--until={until!r}" in res.stderr and says in res.stderr
    assert "ISO 8601 with Z or an offset" in res.stderr and "epoch seconds" in res.stderr
    assert "Traceback" not in res.stderr
    assert "paused" not in meta(r, "later")


def test_a_pause_whose_end_comes_resumes_by_itself(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    url, effects = redis_server.url, tmp_path / "effects"
    five = schedule_far_from_edges(300)
    crontab = ["exec", "--name", "brief", "--schedule", five, "--", *appender(effects)]
    first = run(crontab, runner_env(url, SIDE="before"))
    assert outcome(first.stderr) == "ran"
    until = str(int(time.time()) + 60)
    paused = run(["pause", "brief", "--until", until, "--note", "short"], runner_env(url))
    assert paused.returncode == 0, paused.stderr
    assert meta(r, "brief")["protocol_min"] == "3"
    # The previous slot's Job, retried, skips while the pause lasts.
    slot = Schedule.parse(five, "UTC", 0).previous_at_or_before(time.time() + 30)
    pod = cronjob_env(url, "brief", five, slot - 300, SIDE="pod")
    during = run(["exec", "--name", "brief", "--", *appender(effects)], pod)
    assert (during.returncode, outcome(during.stderr)) == (0, "paused"), during.stderr
    assert "until " in skipped_line(during.stderr)
    # Brought forward by pausing again: its end comes in a few seconds.
    end = int(time.time()) + 5
    sooner = run(["pause", "brief", "--until", str(end), "--note", "short"], runner_env(url))
    assert sooner.returncode == 0, sooner.stderr
    wait_for(lambda: time.time() > end + 0.5, 20, "the pause's end")
    assert status(runner_env(url), "brief")["paused"] is None  # over, though not cleared yet
    after = run(["exec", "--name", "brief", "--", *appender(effects)], pod)
    assert (after.returncode, outcome(after.stderr)) == (0, "ran"), after.stderr
    assert ran(effects) == ["before", "pod"]
    stored = meta(r, "brief")
    assert not {k for k in stored if k.startswith("paused")}
    assert stored["protocol_min"] == "1"  # put back by the run that found the pause over


# -- pause after consecutive failures ------------------------------------------------------------


def test_pause_on_failures_counts_failed_runs_a_success_starts_again_and_resume_resets(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    url, effects = redis_server.url, tmp_path / "effects"
    first = Schedule.parse(FIVE, "UTC", 0).previous_at_or_before(time.time() - 3600)
    slots = iter(first + 300 * i for i in range(10))
    command = ["sh", "-c", f'echo "$SIDE" >> {effects}; test "$SIDE" = ok']

    def one(side: str) -> subprocess.CompletedProcess[str]:
        env = cronjob_env(url, "flaky", FIVE, next(slots), SIDE=side,
                          CRON_RUNNER_PAUSE_ON_FAILURES="2")  # fmt: skip
        return run(["exec", "--name", "flaky", "--", *command], env)

    assert [one(side).returncode for side in ("bad", "ok", "bad")] == [1, 0, 1]
    assert "paused" not in meta(r, "flaky")
    second = one("bad")
    assert second.returncode == 1
    (line,) = [e for e in events(second.stderr) if e.get("event") == "paused"]
    assert "after 2 consecutive failures" in line["msg"]
    skipped = one("ok")
    assert (skipped.returncode, outcome(skipped.stderr)) == (0, "paused")
    assert ran(effects) == ["bad", "ok", "bad", "bad"]
    doc = status(runner_env(url), "flaky")
    assert doc["paused"]["note"] == "paused after 2 consecutive failures"
    assert doc["paused"]["by"] == second_holder(second.stderr)

    assert run(["resume", "flaky"], runner_env(url)).returncode == 0
    assert r.hget(keys("flaky").state, "consecutive_failures") == "0"
    assert one("bad").returncode == 1  # one failure after the resume: not paused yet
    assert "paused" not in meta(r, "flaky")


def second_holder(stderr: str) -> str:
    return str(next(e["holder"] for e in events(stderr) if e.get("event") == "start"))


def test_only_failures_of_the_task_itself_count(redis_server: RedisServer, r: redis.Redis) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_PAUSE_ON_FAILURES="1")
    proc = spawn(["exec", "--name", "drained", "--", "sleep", "30"], env)
    wait_for(lambda: r.exists(keys("drained").lease), 10, "the lease")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert outcome(stderr) == "terminated"
    assert "paused" not in meta(r, "drained")  # a drained node does not pause a healthy task
    failed = run(["exec", "--name", "drained", "--", "false"], env)
    assert failed.returncode == 1
    assert meta(r, "drained")["paused"] == "1"


def test_task_option_and_the_flag_that_wins_over_it(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_TASK_MODULES="tests.pause_tasks")
    assert [run(["run", "fragile"], env).returncode for _ in range(2)] == [1, 1]
    assert meta(r, "fragile")["paused_note"] == "paused after 2 consecutive failures"
    assert outcome(run(["run", "fragile"], env).stderr) == "paused"
    for _ in range(3):
        res = run(["run", "fragile", "--name", "sturdy", "--pause-on-failures", "0"], env)
        assert res.returncode == 1
    assert "paused" not in meta(r, "sturdy")


# -- status, history and the watchdog -------------------------------------------------------------


def _day() -> datetime:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return datetime.fromtimestamp(today.timestamp() - 2 * 86_400, UTC)


def _at(hour: int, minute: int = 0) -> int:
    return int(_day().replace(hour=hour, minute=minute).timestamp())


def test_a_paused_task_is_not_overdue_and_the_slots_of_its_pause_are_never_missed(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    """Two hourly tasks two days back, both paused 10:30-13:30; the watchdog runs at 12:30 (for
    `logged` only: `quiet` has no watchdog run in its pause) and at 16:30. Their 14:00 runs
    fail: only 14:00, 15:00 and 16:00 are missed, never 11:00 to 13:00."""
    url = redis_server.url
    plain = runner_env(url, CRON_RUNNER_HOLDER="ops")
    tasks = ("logged", "quiet")

    def pod(task: str, hour: int, code: int = 0) -> subprocess.CompletedProcess[str]:
        env = cronjob_env(url, task, HOURLY, _at(hour), CODE=str(code))
        return run(["exec", "--name", task, "--", "sh", "-c", "exit $CODE"], env)

    for task in tasks:
        assert pod(task, 10).returncode == 0
        paused = run_at(_at(10, 30), ["pause", task, "--note", "vendor outage"], plain)
        assert paused.returncode == 0, paused.stderr

    dog = run_at(_at(12, 30), ["watchdog", "-o", "json", "--ignore", "quiet"], plain)
    assert dog.returncode == 0, dog.stdout + dog.stderr
    doc = json.loads(dog.stdout)
    assert doc["overdue"] == []
    # The faked clock starts at 10:30 and runs on: the CLI takes a moment to start.
    since = f"{_day().date()}T10:3"
    (shown,) = doc["paused"]
    assert shown["since"].startswith(since)
    assert {**shown, "since": ""} == {"task": "logged", "by": "ops", "since": "", "until": None,
                                      "note": "vendor outage"}  # fmt: skip
    text = run_at(_at(12, 30), ["watchdog", "--ignore", "quiet"], plain)
    assert "PAUSED  logged: by ops since" in text.stdout
    assert "1 paused (not overdue while paused)" in text.stdout
    table = run_at(_at(12, 30), ["status"], plain).stdout
    assert "no (paused)" in table and "PAUSED  quiet: by ops" in table
    assert r.zrange(keys("logged").missed, 0, -1) == []

    # The 12:00 pods find the task paused: exit 0, nothing run, the slot marked as paused.
    for task in tasks:
        skipped = pod(task, 12)
        assert (skipped.returncode, outcome(skipped.stderr)) == (0, "paused"), skipped.stderr
        assert run_at(_at(13, 30), ["resume", task], plain).returncode == 0
        assert pod(task, 14, 1).returncode == 1

    dog = run_at(_at(16, 30), ["watchdog", "-o", "json"], plain)
    assert dog.returncode == 1
    missed = {o["task"]: o["missed"]["slots"] for o in json.loads(dog.stdout)["overdue"]}
    assert missed == {task: [_at(14), _at(15), _at(16)] for task in tasks}
    assert json.loads(dog.stdout)["paused"] == []

    history = json.loads(run_at(_at(16, 30), ["history", "quiet", "-o", "json"], plain).stdout)
    outcomes = [(run_["outcome"], run_["holder"]) for run_ in reversed(history["runs"])]
    assert [o for o, _ in outcomes] == ["ran", "pause", "paused", "resume", "failed"]
    pause_run = next(x for x in history["runs"] if x["outcome"] == "pause")
    assert (pause_run["note"], pause_run["paused_until"], pause_run["slot"]) == (
        "vendor outage", None, None)  # fmt: skip
    assert pause_run["started_at"].startswith(since)


# -- the protocol minimum a pause raises, and older runners ---------------------------------------


def test_a_pause_raises_the_minimum_and_resume_puts_back_what_the_policy_needs(
    r: redis.Redis,
) -> None:
    def one(task: str, overlap: str = "skip") -> Lease:
        return Lease(r, keys(task), new_token("pod", 60), ttl_ms=60_000, overlap=overlap,
                     indexed=False)  # fmt: skip

    one("plain").acquire(60)
    ops_pause.pause(r, keys("plain"), by="ops", at_s=time.time(), note="", until_s=None)
    assert (meta(r, "plain")["protocol_min"], meta(r, "plain")["protocol_min_before_pause"]) == (
        "3", "1")  # fmt: skip
    assert ops_pause.resume(r, keys("plain"), by="ops", at_s=time.time()).protocol_min == "1"
    assert meta(r, "plain")["protocol_min"] == "1"

    # A replace task's runner, first seen while paused, keeps its own minimum through the resume.
    ops_pause.pause(r, keys("newpolicy"), by="ops", at_s=time.time(), note="", until_s=None)
    assert isinstance(one("newpolicy", REPLACE).acquire(60), Paused)
    done = ops_pause.resume(r, keys("newpolicy"), by="ops", at_s=time.time())
    assert (done.protocol_min, meta(r, "newpolicy")["protocol_min"]) == ("3", "3")

    # Fields written by hand, with no minimum saved: it is left as it is, not lowered.
    r.hset(keys("hand").meta, mapping={"paused": "1", "protocol_min": "3"})
    assert ops_pause.resume(r, keys("hand"), by="ops", at_s=time.time()).protocol_min == "3"
    assert meta(r, "hand") == {"protocol_min": "3"}


def test_a_paused_skip_is_one_round_trip_and_pause_and_resume_one_script_each(
    redis_server: RedisServer,
) -> None:
    client, conn = counting_client(redis_server.port)
    runner = Lease(client, keys("rt"), new_token("pod", 60), ttl_ms=60_000, indexed=False)

    def pause() -> None:
        ops_pause.pause(client, keys("rt"), by="ops", at_s=time.time(), note="", until_s=None)

    def resume() -> None:
        ops_pause.resume(client, keys("rt"), by="ops", at_s=time.time())

    # Each script's first call loads it.
    pause()
    runner.acquire(60)
    resume()
    for call in (pause, lambda: runner.acquire(60), resume):
        conn.reset()
        call()
        assert (conn.sent, conn.replies) == (["EVALSHA"], 1)
    client.close()


def test_a_pause_whose_end_is_past_by_redis_clock_is_refused(r: redis.Redis) -> None:
    now_s = float(cast(list[Any], r.time())[0])
    with pytest.raises(ConfigError, match="not after Redis's clock"):
        ops_pause.pause(r, keys("late"), by="ops", at_s=now_s, note="", until_s=now_s - 1)
    assert meta(r, "late") == {}


# -- bad input -----------------------------------------------------------------------------------


def test_an_unknown_task_is_refused_unless_forced(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    env = runner_env(redis_server.url)
    assert run(["exec", "--name", "report", "--", "true"], env).returncode == 0
    for command in ("pause", "resume"):
        res = run([command, "reprot"], env)
        assert res.returncode == ConfigError.exit_code, res.stderr
        assert f"{command}: no task 'reprot' in scope 'default'" in res.stderr
        assert "known there: report" in res.stderr and "Traceback" not in res.stderr
    assert r.keys("*reprot*") == []
    # A registered task is known before its first run; any name is, with --force.
    registered = run(["pause", "ok"], runner_env(redis_server.url))
    assert registered.returncode == 0, registered.stderr
    forced = run(["pause", "not-yet", "--force", "--note", "before its first run"], env)
    assert forced.returncode == 0, forced.stderr
    assert "warning" not in forced.stdout  # it never ran: no older runner to warn about
    listed = json.loads(run(["status", "-o", "json"], env).stdout)["tasks"]
    assert {t["task"]: bool(t["paused"]) for t in listed} == {
        "not-yet": True, "ok": True, "report": False}  # fmt: skip
    assert run(["resume", "not-yet"], env).returncode == 0


@pytest.mark.parametrize(
    ("args", "extra", "named"),
    [
        (["exec", "--name", "x", "--", "true"], {"CRON_RUNNER_PAUSE_ON_FAILURES": "two"},
         "CRON_RUNNER_PAUSE_ON_FAILURES='two'"),
        (["exec", "--name", "x", "--", "true"], {"CRON_RUNNER_PAUSE_ON_FAILURES": "-1"},
         "CRON_RUNNER_PAUSE_ON_FAILURES='-1'"),
        (["run", "ok", "--pause-on-failures", "1.5"], {}, "--pause-on-failures='1.5'"),
        (["exec", "--name", "x", "--pause-on-failures", "10001", "--", "true"], {},
         "--pause-on-failures='10001'"),
        (["pause", "x", "--note", "two\nlines"], {}, "printable characters on one line"),
    ],
)  # fmt: skip
def test_bad_values_exit_78_naming_the_setting(
    redis_server: RedisServer, r: redis.Redis, args: list[str], extra: dict[str, str], named: str
) -> None:
    res = run(args, runner_env(redis_server.url, **extra))
    assert res.returncode == ConfigError.exit_code, res.stderr
    assert named in res.stderr and "Traceback" not in res.stderr
    assert r.keys("*") == []
