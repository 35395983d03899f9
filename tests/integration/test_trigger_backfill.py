"""`cron-runner trigger` and `cron-runner backfill` as real processes on a real Redis
(docs/design.md, Catch-up, trigger and backfill): what runs, in which order, what is recorded,
what is waited for, and each refusal naming its flag."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import redis

from runner.keys import TaskKeys
from runner.lease.scripts import Acquired, Lease, new_token
from runner.testing import RedisServer
from tests.helpers.lease_tools import stream_entries
from tests.helpers.proc import LoggedRun, events, outcome, run, runner_env
from tests.helpers.wait import wait_for

HOUR = 3600
HOURLY = "0 * * * *"


def keys(task: str) -> TaskKeys:
    return TaskKeys("cron-runner", "default", task)


def last_slots(n: int) -> list[int]:
    """The last ``n`` hourly slots, oldest first (the current hour's included)."""
    now = int(time.time())
    return [now - now % HOUR - i * HOUR for i in reversed(range(n))]


def backfill_cmd(
    name: str, start: int | str, end: int | str, effects: Path, *extra: str
) -> list[str]:
    script = f'echo "$CRON_RUNNER_SLOT" >> {effects}'
    return ["backfill", "--name", name, "--schedule", HOURLY, "--from", str(start),
            "--to", str(end), *extra, "--", "sh", "-c", script]  # fmt: skip


def holding(
    r: redis.Redis, task: str, holder: str, slot: int, ttl_ms: int, *, indexed: bool = True
) -> Lease:
    """A run of ``slot`` by ``holder`` that holds the task's lease."""
    lease = Lease(r, keys(task), new_token(holder, slot), ttl_ms=ttl_ms, indexed=indexed)
    assert isinstance(lease.acquire(slot), Acquired)
    return lease


def mark_done(r: redis.Redis, task: str, slot: int, holder: str = "earlier") -> None:
    """A run of ``slot`` that happened (the real lease scripts, as a run leaves them)."""
    lease = holding(r, task, holder, slot, ttl_ms=10_000, indexed=False)
    lease.complete(slot, {"slot": slot, "outcome": "ran"}, {"last_success_slot": slot})


def records(r: redis.Redis, task: str) -> list[dict[str, str]]:
    return stream_entries(r, keys(task).runs)


def summary(stdout: str) -> str:
    (line,) = [x for x in stdout.splitlines() if x.startswith("backfill ")]
    return line


@pytest.fixture
def env(redis_server: RedisServer) -> dict[str, str]:
    # Slots hours old: kept a week, as a task that says so would keep them.
    return runner_env(redis_server.url, CRON_RUNNER_SLOT_RETENTION="168h")


# -- backfill ---------------------------------------------------------------------------------


def test_backfill_runs_each_undone_slot_once_oldest_first_and_again_none(
    env: dict[str, str], r: redis.Redis, tmp_path: Path
) -> None:
    slots = last_slots(7)[:-1]  # six past hours
    for done in (slots[1], slots[4]):
        mark_done(r, "bf", done)
    effects = tmp_path / "effects"
    first = run(backfill_cmd("bf", slots[0], slots[-1], effects), env)

    assert first.returncode == 0, first.stderr
    assert summary(first.stdout) == "backfill bf: 6 slots: 4 ran, 2 skipped (done), 0 failed"
    undone = [s for s in slots if s not in (slots[1], slots[4])]
    assert effects.read_text().split() == [str(s) for s in undone]
    ran = [x for x in records(r, "bf") if x.get("backfill")]
    assert [x["slot"] for x in ran] == [str(s) for s in undone]
    assert {x["outcome"] for x in ran} == {"ran"}
    assert len({x["fence"] for x in ran}) == 4  # each slot its own acquire
    for slot in slots:
        assert r.hget(keys("bf").slot(slot), "holder") is not None
    # The state stays the latest slot's: a backfill never moves the last success back.
    assert r.hget(keys("bf").state, "last_success_slot") == str(slots[4])

    again = run(backfill_cmd("bf", slots[0], slots[-1], effects), env)
    assert again.returncode == 0, again.stderr
    assert summary(again.stdout) == "backfill bf: 6 slots: 0 ran, 6 skipped (done), 0 failed"
    assert len(effects.read_text().split()) == 4
    # Done slots are read, not acquired: their markers count no skips.
    assert r.hget(keys("bf").slot(slots[0]), "skips") is None


def test_a_registered_task_is_backfilled_in_iso_times_and_each_slot_told(
    env: dict[str, str], tmp_path: Path
) -> None:
    slots = last_slots(4)[:-1]
    effects = tmp_path / "effects"
    # The last slot as a time an hour east of UTC: the same instant.
    east = time.strftime("%Y-%m-%dT%H:%M:%S+01:00", time.gmtime(slots[-1] + HOUR))
    done = run(
        ["backfill", "ok", "--schedule", HOURLY, "--from", _iso(slots[0]), "--to", east],
        {**env, "SIDE_EFFECTS": str(effects)},
    )
    assert done.returncode == 0, done.stderr
    assert [line.split()[3] for line in effects.read_text().splitlines()] == [str(s) for s in slots]


def test_a_failed_slot_gives_the_exit_code_the_rest_still_run_and_a_rerun_runs_it(
    env: dict[str, str], r: redis.Redis, tmp_path: Path
) -> None:
    slots = last_slots(4)[:-1]
    effects, failing = tmp_path / "effects", tmp_path / "failing"
    failing.write_text(str(slots[1]))
    script = (f'if [ "$CRON_RUNNER_SLOT" = "$(cat {failing})" ]; then exit 3; fi; '
              f'echo "$CRON_RUNNER_SLOT" >> {effects}')  # fmt: skip
    args = ["backfill", "--name", "bf", "--schedule", HOURLY, "--from", str(slots[0]),
            "--to", str(slots[-1]), "--", "sh", "-c", script]  # fmt: skip
    first = run(args, env)

    assert first.returncode == 3, first.stderr
    assert summary(first.stdout) == "backfill bf: 3 slots: 2 ran, 0 skipped (done), 1 failed"
    assert effects.read_text().split() == [str(slots[0]), str(slots[2])]
    assert r.exists(keys("bf").slot(slots[1])) == 0

    failing.write_text("none")
    second = run(args, env)
    assert second.returncode == 0, second.stderr
    assert summary(second.stdout) == "backfill bf: 3 slots: 1 ran, 2 skipped (done), 0 failed"
    assert effects.read_text().split() == [str(slots[0]), str(slots[2]), str(slots[1])]


def test_a_held_lease_is_waited_for_not_skipped(
    env: dict[str, str], r: redis.Redis, tmp_path: Path
) -> None:
    slots = last_slots(3)
    # The current slot's run holds the lease while the backfill starts.
    held = holding(r, "bf", "scheduled", slots[-1], ttl_ms=30_000)
    effects = tmp_path / "effects"
    backfill = LoggedRun(
        backfill_cmd("bf", slots[0], slots[1], effects, "--wait", "60s"), env, tmp_path / "log"
    )
    try:
        wait_for(lambda: backfill.logged("waiting"), 20, "the backfill to wait for the lease")
        assert not effects.exists()
        held.release({}, {})  # that run ends
        stderr = backfill.finish()
    finally:
        if backfill.poll() is None:
            backfill.kill()

    assert backfill.returncode == 0, stderr
    assert effects.read_text().split() == [str(slots[0]), str(slots[1])]
    (wait,) = [e for e in events(stderr) if e.get("event") == "waiting"]
    assert wait["run_holder"] == "scheduled"
    # Waited, so never recorded as skipped.
    assert all(x.get("outcome") != "skipped_held" for x in records(r, "bf"))


def test_a_lease_held_past_the_wait_stops_the_backfill_with_75(
    env: dict[str, str], r: redis.Redis, tmp_path: Path
) -> None:
    slots = last_slots(3)
    holding(r, "bf", "long-run", slots[-1], ttl_ms=60_000)
    effects = tmp_path / "effects"
    done = run(backfill_cmd("bf", slots[0], slots[1], effects, "--wait", "1s"), env)

    assert done.returncode == 75, done.stderr
    assert summary(done.stdout).startswith(
        "backfill bf: 2 slots: 0 ran, 0 skipped (done), 0 failed; stopped, 2 not run: "
        "skipped_held: long-run held the lease past the wait of 1s (--wait)"
    )
    assert not effects.exists()


def test_force_runs_slots_older_than_the_markers_are_kept(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    env = runner_env(redis_server.url)  # hourly: markers kept 2 h
    slots = last_slots(6)[:-1]
    effects = tmp_path / "effects"
    refused = run(backfill_cmd("old", slots[0], slots[-1], effects), env)
    assert refused.returncode == 78
    assert "--from " in refused.stderr
    assert "cannot be proven unrun: a marker may have expired" in refused.stderr
    assert "--force runs such slots" in refused.stderr
    assert not effects.exists()

    forced = run(backfill_cmd("old", slots[0], slots[-1], effects, "--force"), env)
    assert forced.returncode == 0, forced.stderr
    assert effects.read_text().split() == [str(s) for s in slots]


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--from", "{now}", "--to", "{hour_ago}"], 78, "--to .* is before --from"),
        (["--from", "2026-01-01T10:00:00", "--to", "{now}"], 78,
         r"--from='2026-01-01T10:00:00' names no time zone: add Z or an offset"),
        (["--from", "yesterday", "--to", "{now}"], 78, r"--from='yesterday' is not a time"),
        (["--from", "{hour_ago}", "--to", "{in_an_hour}"], 78, r"--to .* is after now"),
        (["--from", "{nine_days_ago}", "--to", "{now}", "--schedule", "* * * * *"], 78,
         "holds more than 10000 slots"),
        (["--from", "{hour_ago}", "--to", "{now}", "--wait", "soon"], 78, "--wait='soon'"),
    ],
)  # fmt: skip
def test_bad_ranges_are_refused_naming_the_flag(
    env: dict[str, str], tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    now = time.time()
    times = {"now": _iso(now), "hour_ago": _iso(now - HOUR), "in_an_hour": _iso(now + HOUR),
             "nine_days_ago": _iso(now - 9 * 86_400)}  # fmt: skip
    argv = ["backfill", "--name", "bf", "--schedule", HOURLY,
            *(a.format(**times) for a in args), "--", "true"]  # fmt: skip
    done = run(argv, env)
    assert done.returncode == code, done.stderr
    assert any(re.search(message, str(e.get("msg", ""))) for e in events(done.stderr)), done.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["backfill", "--from", "0", "--to", "1"], 64, "expected TASK, or --name NAME -- CMD"),
        (["backfill", "ok", "--name", "x", "--from", "0", "--to", "1", "--", "true"], 64,
         "give TASK or -- CMD ARGS, not both"),
        (["backfill", "--from", "0", "--to", "1", "--", "true"], 64, "a command needs --name"),
        (["trigger", "--name", "x", "--"], 64, "a command needs --name and the command after --"),
        (["backfill", "--name", "x", "--from", "0", "--to", "1", "--", "true"], 78,
         "backfill needs the task's schedule"),
    ],
)  # fmt: skip
def test_bad_command_lines(
    redis_server: RedisServer, args: list[str], code: int, message: str
) -> None:
    done = run(args, runner_env(redis_server.url))
    assert done.returncode == code, done.stderr
    assert message in done.stderr


def test_help_says_the_exit_codes(redis_server: RedisServer) -> None:
    text = run(["backfill", "--help"], runner_env(redis_server.url)).stdout
    assert "0    every slot of the range ran, or had already run" in text
    assert "otherwise the first failed slot's code" in text
    assert "cron-runner backfill --name NAME --schedule CRON" in text
    assert "--force" in text
    assert (
        "cron-runner trigger --name NAME"
        in run(["trigger", "--help"], runner_env(redis_server.url)).stdout
    )


# -- trigger ------------------------------------------------------------------------------------


def test_trigger_runs_once_now_without_a_slot_and_records_who_triggered(
    env: dict[str, str], r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    # The chart's environment names the schedule: a trigger still runs outside it.
    done = run(
        ["trigger", "ok", "--holder", "operator"],
        {**env, "SIDE_EFFECTS": str(effects), "CRON_RUNNER_SCHEDULE": HOURLY},
    )
    assert (done.returncode, outcome(done.stderr)) == (0, "ran"), done.stderr
    (line,) = effects.read_text().splitlines()
    assert line.split()[3] == "None"
    (record,) = records(r, "ok")
    assert (record["slot"], record["trigger"], record["outcome"]) == ("", "operator", "ran")
    assert r.keys("cron-runner:{default:ok}:slot:*") == []

    command = run(
        ["trigger", "--name", "cmd", "--", "sh", "-c", f'echo "[$CRON_RUNNER_SLOT]" >> {effects}'],
        env,
    )
    assert command.returncode == 0, command.stderr
    assert effects.read_text().splitlines()[-1] == "[]"
    assert records(r, "cmd")[0]["trigger"]


def test_a_second_trigger_while_the_first_holds_the_lease_skips(
    env: dict[str, str], r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    slow_env = {**env, "SIDE_EFFECTS": str(effects), "TASK_SECONDS": "8"}
    first = LoggedRun(["trigger", "slow", "--holder", "first"], slow_env, tmp_path / "first.log")
    try:
        wait_for(lambda: first.logged("acquired"), 20, "the first trigger to take the lease")
        second = run(["trigger", "slow", "--holder", "second"], slow_env)
        assert (second.returncode, outcome(second.stderr)) == (0, "skipped_held"), second.stderr
        assert outcome(first.finish()) == "ran"
    finally:
        if first.poll() is None:
            first.kill()
    starts = [line for line in effects.read_text().splitlines() if line.startswith("start ")]
    assert [line.split()[1] for line in starts] == ["first"]
    assert [x["trigger"] for x in records(r, "slow")] == ["first"]


def test_trigger_and_backfill_enqueue_in_queue_mode(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    from tests.queue.helpers import queue_env, stats  # noqa: PLC0415

    env = queue_env(redis_server, CRON_RUNNER_MODE="enqueue", CRON_RUNNER_SLOT_RETENTION="168h")
    triggered = run(["trigger", "q-ok"], env)
    assert (triggered.returncode, outcome(triggered.stderr)) == (0, "enqueued"), triggered.stderr
    assert stats(r, "q-ok").ready == 1

    slots = last_slots(4)[:-1]
    args = [
        "backfill",
        "q-ok",
        "--schedule",
        HOURLY,
        "--from",
        str(slots[0]),
        "--to",
        str(slots[-1]),
    ]
    done = run(args, env)
    assert done.returncode == 0, done.stderr
    assert summary(done.stdout) == (
        "backfill q-ok: 3 slots: 3 sent to the workers, 0 skipped (already sent), 0 failed"
    )
    assert stats(r, "q-ok").ready == 4
    sent = [e["message_id"] for e in events(done.stderr) if e.get("event") == "enqueued"]
    assert len(set(sent)) == 3
    assert run(args, env).returncode == 0
    assert stats(r, "q-ok").ready == 4


def test_run_and_exec_do_not_build_the_trigger_and_backfill_parsers() -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = (
        "import sys; from runner.cli.main import build_parser;"
        "build_parser('exec'); build_parser('run');"
        "print([m for m in ('runner.cli.manual', 'runner.run.backfill') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
