"""What the CLI promises beyond exit codes: round trips, secrets, help."""

from __future__ import annotations

from pathlib import Path

from runner.testing import RedisServer
from tests.helpers.monitor import client_commands
from tests.helpers.proc import outcome, run, runner_env


def test_round_trips_per_run_and_per_skip(redis_server: RedisServer) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 0 * * *")
    # Caches the scripts, and puts the task in its scope's index: only a task's first run
    # does that, in one more round trip (lease.Lease.index).
    unscheduled = {k: v for k, v in env.items() if k != "CRON_RUNNER_SCHEDULE"}
    with client_commands(redis_server) as first_ever:
        warm = run(["exec", "--name", "counted", "--", "true"], unscheduled)
        assert warm.returncode == 0
        assert [line.split('"')[1] for line in first_ever()][-2:] == ["SADD", "HSET"]

    with client_commands(redis_server) as seen:
        ran = run(["exec", "--name", "counted", "--", "true"], env)
        after_run = seen()
        skipped = run(["exec", "--name", "counted", "--", "true"], env)
        after_skip = seen()

    assert (outcome(ran.stderr), outcome(skipped.stderr)) == ("ran", "skipped_done")
    assert len(after_run) == 2, after_run
    assert len(after_skip) - len(after_run) == 1, after_skip
    assert all('"EVALSHA"' in line for line in after_skip)


def test_password_never_appears_in_logs_or_errors(tmp_path: Path) -> None:
    secret = "s3cr3t-Pa55word"
    with RedisServer(extra_args=["--requirepass", secret]) as server:
        base = f"redis://127.0.0.1:{server.port}/0"
        by_env = run(
            ["exec", "--name", "pw", "--", "true"],
            runner_env(base, CRON_RUNNER_REDIS_PASSWORD=secret),
        )
        by_url = run(
            ["exec", "--name", "pw", "--", "true"],
            runner_env(
                f"redis://:{secret}@127.0.0.1:{server.port}/0", CRON_RUNNER_LOG_LEVEL="debug"
            ),
        )
        wrong = run(
            ["exec", "--name", "pw", "--", "true"],
            runner_env(f"redis://user:{secret}x@127.0.0.1:{server.port}/0"),
        )
        bad_url = run(
            ["exec", "--name", "pw", "--", "true"],
            runner_env(f"http://u:{secret}@127.0.0.1:{server.port}/0"),
        )
    assert (by_env.returncode, by_url.returncode) == (0, 0), by_env.stderr + by_url.stderr
    assert wrong.returncode == 78
    assert bad_url.returncode == 78
    for res in (by_env, by_url, wrong, bad_url):
        assert secret not in res.stderr + res.stdout
    help_text = run(["exec", "--help"], runner_env(base, CRON_RUNNER_REDIS_PASSWORD=secret)).stdout
    assert secret not in help_text


def test_help_explains_exit_codes_and_environment(redis_server: RedisServer) -> None:
    res = run(["--help"], runner_env(redis_server.url))
    assert res.returncode == 0
    for needle in ("exit codes:", "143", "CRON_RUNNER_REDIS_URL", "CRON_RUNNER_LEASE_TTL", "exec"):
        assert needle in res.stdout


def test_tasks_lists_names_and_origins(redis_server: RedisServer) -> None:
    res = run(["tasks"], runner_env(redis_server.url))
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["boom", "child-codes", "ok", "slow", "stubborn"]
    assert "tests.sample_tasks.ok" in res.stdout


def test_every_run_line_carries_every_run_field(redis_server: RedisServer) -> None:
    """One crontab log file holds every task's lines: each line of a run has the task, slot,
    holder, fencing token, outcome, duration and exit code (null until known), the keeper's
    'lease lost' line included."""
    import redis  # noqa: PLC0415

    from runner.logs import RUN_FIELDS  # noqa: PLC0415
    from tests.helpers.proc import events, spawn  # noqa: PLC0415
    from tests.helpers.wait import wait_for  # noqa: PLC0415

    env = runner_env(redis_server.url, CRON_RUNNER_LEASE_TTL="1500ms")
    proc = spawn(["exec", "--name", "fields", "--holder", "pod-f", "--", "sleep", "30"], env)
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    lease = "cron-runner:{default:fields}:lease"
    wait_for(lambda: client.get(lease), what="the lease")
    client.delete(lease)  # the next renewal is refused: the keeper declares the loss
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 75, stderr
    lines = events(stderr)
    assert {e["event"] for e in lines} >= {"start", "acquired", "lease_lost", "finished"}
    for line in lines:
        assert set(RUN_FIELDS) <= set(line), line
        assert (line["task"], line["holder"], line["slot"]) == ("fields", "pod-f", "manual")
    (lost,) = [e for e in lines if e["event"] == "lease_lost"]
    assert lost["logger"] == "runner.keeper"
    (acquired,) = [e for e in lines if e["event"] == "acquired"]
    assert lost["fence"] == acquired["fence"] > 0
    assert lines[-1]["outcome"] == "lease_lost" and lines[-1]["exit_code"] == 75
