"""Every exit code of the README's table, through the CLI as a real subprocess."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import cast

import pytest
import redis

from runner.errors import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND
from runner.testing import RedisServer, free_port
from tests.helpers.proc import (
    LEASE,
    LoggedRun,
    events,
    outcome,
    run,
    runner_env,
    side_effects,
    spawn,
    spawn_started,
)
from tests.helpers.wait import wait_for


@pytest.fixture
def effects(tmp_path: Path) -> Path:
    return tmp_path / "effects.log"


def test_ran_exit_0(redis_server: RedisServer, effects: Path) -> None:
    res = run(["run", "ok"], runner_env(redis_server.url, SIDE_EFFECTS=str(effects)))
    assert res.returncode == 0, res.stderr
    assert outcome(res.stderr) == "ran"
    assert len(side_effects(effects)) == 1
    names = [e.get("event") for e in events(res.stderr)]
    assert names[:2] == ["start", "acquired"]
    assert "released" in names


def test_skipped_when_held_exit_0(redis_server: RedisServer, r: redis.Redis, effects: Path) -> None:
    r.set(LEASE % "ok", "other-pod:abcd", px=60_000)
    res = run(["run", "ok"], runner_env(redis_server.url, SIDE_EFFECTS=str(effects)))
    assert res.returncode == 0, res.stderr
    assert outcome(res.stderr) == "skipped_held"
    skipped = next(e for e in events(res.stderr) if e.get("event") == "skipped")
    assert skipped["run_holder"] == "other-pod"
    assert side_effects(effects) == []


def test_skipped_when_slot_done_exit_0(redis_server: RedisServer, effects: Path) -> None:
    env = runner_env(redis_server.url, SIDE_EFFECTS=str(effects), CRON_RUNNER_SCHEDULE="0 0 * * *")
    first = run(["run", "ok"], {**env, "CRON_RUNNER_HOLDER": "first"})
    second = run(["run", "ok"], {**env, "CRON_RUNNER_HOLDER": "second"})
    assert (first.returncode, second.returncode) == (0, 0), second.stderr
    assert outcome(second.stderr) == "skipped_done"
    skipped = next(e for e in events(second.stderr) if e.get("event") == "skipped")
    assert skipped["run_holder"] == "first"
    assert len(side_effects(effects)) == 1


def test_task_raised_exit_1_and_slot_stays_open(redis_server: RedisServer, r: redis.Redis) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 0 * * *")
    res = run(["run", "boom"], env)
    assert res.returncode == 1
    assert outcome(res.stderr) == "failed"
    assert "boom: the task failed on purpose" in res.stderr
    assert r.get(LEASE % "boom") is None
    assert not r.keys("cron-runner:{default:boom}:slot:*")


def test_exec_passes_child_exit_code(redis_server: RedisServer, r: redis.Redis) -> None:
    res = run(["exec", "--name", "seven", "--", "sh", "-c", "exit 7"], runner_env(redis_server.url))
    assert res.returncode == 7
    assert outcome(res.stderr) == "failed"
    assert r.get(LEASE % "seven") is None


def test_exec_output_is_passed_through(redis_server: RedisServer) -> None:
    res = run(
        [
            "exec",
            "--name",
            "echo",
            "--",
            "sh",
            "-c",
            'echo "out $CRON_RUNNER_FENCING_TOKEN"; echo err >&2',
        ],
        runner_env(redis_server.url),
    )
    assert res.returncode == 0
    fence = next(e["fence"] for e in events(res.stderr) if e.get("event") == "acquired")
    assert res.stdout == f"out {fence}\n"
    assert "err" in res.stderr.splitlines()


@pytest.mark.parametrize(
    ("args", "extra_env", "named"),
    [
        (["run", "ok"], {"CRON_RUNNER_SCHEDULE": "61 * * * *"}, "CRON_RUNNER_SCHEDULE"),
        (["run", "ok", "--schedule", "not a cron"], {}, "--schedule"),
        (["run", "nope"], {}, "known tasks: boom, child-codes, ok, slow, stubborn"),
        (["run", "ok"], {"CRON_RUNNER_TIMEZONE": "Mars/Olympus"}, "CRON_RUNNER_TIMEZONE"),
        (["run", "ok"], {"CRON_RUNNER_REDIS_URL": "http://x"}, "CRON_RUNNER_REDIS_URL"),
        (["run", "ok"], {"CRON_RUNNER_LEASE_TTL": "thirty"}, "CRON_RUNNER_LEASE_TTL"),
        (["run", "ok", "--lease-ttl", "10x"], {}, "--lease-ttl"),
        (["run", "ok"], {"CRON_RUNNER_LEASE_TTL": "100ms"}, "at least 1s"),
        (["exec", "--name", "x"], {}, "no command given"),  # usage: 64
        (["exec", "--name", "bad{name}", "--", "true"], {}, "--name"),
        (["frobnicate"], {}, "invalid choice"),  # usage: 64
        (["run", "ok"], {"CRON_RUNNER_OVERLAP": "forbid"}, "CRON_RUNNER_OVERLAP='forbid'"),
        (["run", "ok", "--overlap", "all"], {}, "expected one of skip, buffer-one, replace"),
        (["run", "ok", "--overlap-wait", "soon"], {}, "--overlap-wait='soon'"),
    ],
)
def test_config_and_usage_errors_exit_78_or_64(
    redis_server: RedisServer, effects: Path, args: list[str], extra_env: dict[str, str], named: str
) -> None:
    env = runner_env(redis_server.url, SIDE_EFFECTS=str(effects), **extra_env)
    res = run(args, env)
    usage = named in ("no command given", "invalid choice")
    assert res.returncode == (64 if usage else 78), res.stderr
    assert named in res.stderr
    assert "Traceback" not in res.stderr
    assert side_effects(effects) == []


def test_unreachable_exit_69_within_deadline_and_never_runs(effects: Path) -> None:
    env = runner_env(
        f"redis://127.0.0.1:{free_port()}/0",
        SIDE_EFFECTS=str(effects),
        CRON_RUNNER_CONNECT_TIMEOUT="1500ms",
    )
    started = time.monotonic()
    res = run(["exec", "--name", "x", "--", "sh", "-c", f"echo ran >> {effects}"], env)
    elapsed = time.monotonic() - started
    assert res.returncode == 69, res.stderr
    assert outcome(res.stderr) == "unavailable"
    assert not effects.exists()
    # The deadline is kept: 1.5 s plus one bounded connect attempt, plus process start.
    assert 1.5 <= elapsed < 1.5 + 0.5 + 5


def test_sigterm_exit_143_and_lease_released(
    redis_server: RedisServer, r: redis.Redis, effects: Path
) -> None:
    env = runner_env(redis_server.url, SIDE_EFFECTS=str(effects), TASK_SECONDS="30")
    proc = spawn_started(["run", "slow"], env, effects)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert outcome(stderr) == "terminated"
    assert r.get(LEASE % "slow") is None
    assert "terminated" in [e.get("event") for e in events(stderr)]
    assert not side_effects(effects, "done")


def test_replaced_exit_79_the_newer_slot_runs(
    redis_server: RedisServer, r: redis.Redis, effects: Path
) -> None:
    minute = int(time.time() // 60) - 5

    def pod(m: int, seconds: str) -> dict[str, str]:
        return runner_env(redis_server.url, SIDE_EFFECTS=str(effects), TASK_SECONDS=seconds,
                          CRON_RUNNER_JOB_NAME=f"slow-{m}", CRON_RUNNER_CRONJOB_NAME="slow",
                          CRON_RUNNER_OVERLAP="replace")  # fmt: skip

    old = spawn(["run", "slow"], pod(minute, "30"))
    wait_for(lambda: side_effects(effects, "start"), what="the old slot's task")
    new = run(["run", "slow"], pod(minute + 1, "0.2"))
    _, old_err = old.communicate(timeout=30)
    assert (old.returncode, outcome(old_err)) == (79, "replaced"), old_err
    assert (new.returncode, outcome(new.stderr)) == (0, "ran"), new.stderr
    assert "preempted" in [e.get("event") for e in events(old_err)]
    assert len(side_effects(effects, "start")) == 2
    assert len(side_effects(effects, "done")) == 1
    assert r.hget(f"cron-runner:{{default:slow}}:slot:{minute * 60}", "outcome") == "replaced"


def test_every_minute_schedule_runs_with_default_tolerance(redis_server: RedisServer) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="* * * * *")
    assert run(["exec", "--name", "minutely", "--", "true"], env).returncode == 0
    explicit = run(["exec", "--name", "minutely", "--skew-tolerance", "30s", "--", "true"], env)
    assert explicit.returncode == 78
    assert "--skew-tolerance" in explicit.stderr


def _asleep(pid: int) -> bool:
    """The process's main thread is in a timed sleep (its kernel wait channel)."""
    return Path(f"/proc/{pid}/wchan").read_text() == "hrtimer_nanosleep"


def test_sigterm_while_redis_is_away_exits_143_without_running(
    effects: Path, tmp_path: Path
) -> None:
    # A pod evicted while Redis is down must not wait out the connect deadline, then take the
    # lease and start the task only to stop it.
    env = runner_env(
        f"redis://127.0.0.1:{free_port()}/0",
        SIDE_EFFECTS=str(effects),
        CRON_RUNNER_CONNECT_TIMEOUT="60s",
    )
    log = tmp_path / "stderr.log"
    proc = LoggedRun(["exec", "--name", "x", "--", "sh", "-c", f"echo ran >> {effects}"],
                        env, log)  # fmt: skip
    # "start" is logged with the signal handlers in place, just before connecting; every
    # attempt is then refused at once and retried with backoff: the signal lands in a backoff.
    wait_for(lambda: proc.logged("start"), what="the run to start")
    wait_for(lambda: _asleep(proc.pid), what="the runner to back off between attempts")
    proc.send_signal(signal.SIGTERM)
    stderr = proc.finish(20)  # far below the 60 s deadline
    assert proc.returncode == 143, stderr
    assert outcome(stderr) == "terminated"
    assert "stopped while Redis" in stderr
    assert not effects.exists()


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # Kubernetes accepts `@every 1h`: no slots the runner can compute, but a delay.
        ("@every 1h", (7000, 7200, False)),
        # One the runner cannot read at all (it never fires): the marker is kept 7 days.
        ("0 0 30 2 *", (6 * 86_400, 7 * 86_400, True)),
    ],
)
def test_a_schedule_the_runner_cannot_read_does_not_fail_a_run_that_ran(
    redis_server: RedisServer,
    r: redis.Redis,
    effects: Path,
    schedule: str,
    expected: tuple[int, int, bool],
) -> None:
    low_s, high_s, fallback = expected
    # With a Job name the runner needs the schedule only for the marker's retention, after the
    # task ran: it keeps the marker and exits 0.
    minutes = int(time.time() // 60)
    env = runner_env(
        redis_server.url,
        SIDE_EFFECTS=str(effects),
        CRON_RUNNER_JOB_NAME=f"every-{minutes}",
        CRON_RUNNER_CRONJOB_NAME="every",
        CRON_RUNNER_SCHEDULE=schedule,
    )
    res = run(["run", "ok"], env)
    assert (res.returncode, outcome(res.stderr)) == (0, "ran"), res.stderr
    assert any(e.get("event") == "retention_fallback" for e in events(res.stderr)) == fallback
    marker = f"cron-runner:{{default:ok}}:slot:{minutes * 60}"
    assert low_s < cast(int, r.ttl(marker)) <= high_s
    assert r.get(LEASE % "ok") is None
    again = run(["run", "ok"], env)
    assert (again.returncode, outcome(again.stderr)) == (0, "skipped_done")


def _not_runnable(tmp_path: Path, kind: str) -> tuple[list[str], int]:
    if kind == "missing-path":
        return [str(tmp_path / "no" / "such" / "binary")], EXIT_NOT_FOUND
    if kind == "missing-on-path":
        return ["cron-runner-no-such-command"], EXIT_NOT_FOUND
    script = tmp_path / "job.sh"
    if kind == "no-execute-bit":
        script.write_text("#!/bin/sh\necho ran\n")
        script.chmod(0o644)
    else:  # a #! interpreter that does not exist
        script.write_text(f"#!{tmp_path}/no-such-interpreter\necho ran\n")
        script.chmod(0o755)
    return [str(script)], EXIT_CANNOT_EXECUTE


@pytest.mark.parametrize(
    "kind", ["missing-path", "missing-on-path", "no-execute-bit", "missing-interpreter"]
)
def test_a_command_that_cannot_start_fails_the_run_releases_and_a_retry_runs(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path, kind: str
) -> None:
    # Before: a traceback, exit 1, the lease left held for its TTL, no run recorded, and the
    # Job's retry skipped ("another holder has the lease"): the slot was lost.
    argv, code = _not_runnable(tmp_path, kind)
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 0 * * *")
    args = ["exec", "--name", "nb", "--", *argv]
    first = run(args, env)
    assert first.returncode == code, first.stderr
    assert "Traceback" not in first.stderr
    assert outcome(first.stderr) == "failed"
    assert r.get(LEASE % "nb") is None
    assert not r.keys("cron-runner:{default:nb}:slot:*")
    (entry,) = r.xrange("cron-runner:{default:nb}:runs")  # type: ignore[misc]
    fields = entry[1]
    assert (fields["outcome"], fields["exit_code"]) == ("failed", str(code))
    assert argv[0] in fields["error"]
    state = cast(dict[str, str], r.hgetall("cron-runner:{default:nb}:state"))
    assert state["last_failure_exit_code"] == str(code)

    retry = run(args, env)  # at once: the lease is free and the slot still open
    assert retry.returncode == code, retry.stderr
    assert outcome(retry.stderr) == "failed"
    assert r.xlen("cron-runner:{default:nb}:runs") == 2
