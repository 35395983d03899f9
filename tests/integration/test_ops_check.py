"""`cron-runner check` against real servers: healthy, evicting, without persistence, and ACL
users that lack what the lease scripts need."""

from __future__ import annotations

import pytest
import redis

from runner.errors import ConfigError
from runner.testing import RedisServer, free_port
from tests.helpers.proc import run, runner_env


def _levels(stdout: str) -> list[str]:
    return [line.split()[0] for line in stdout.splitlines()]


def test_healthy_server_passes_and_leaves_no_keys() -> None:
    with RedisServer(appendonly=True) as server:
        client = server.client()
        res = run(["check", "--strict"], runner_env(server.url))
        assert res.returncode == 0, res.stdout + res.stderr
        assert _levels(res.stdout) == ["ok"] * 5
        assert "configuration parses" in res.stdout
        assert "PING" in res.stdout
        assert "lease scripts run (acquire, renew, complete)" in res.stdout
        assert "noeviction" in res.stdout
        assert "AOF is on" in res.stdout
        assert client.keys("*") == []  # the scratch keys are gone
        client.close()


def test_evicting_policy_warns_and_fails_with_strict() -> None:
    with RedisServer(
        appendonly=True, extra_args=["--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb"]
    ) as server:
        env = runner_env(server.url)
        lenient = run(["check"], env)
        strict = run(["check", "--strict"], env)
    assert lenient.returncode == 0, lenient.stdout
    warning = next(line for line in lenient.stdout.splitlines() if line.startswith("warn"))
    assert "maxmemory-policy is allkeys-lru" in warning
    assert "noeviction" in warning
    assert strict.returncode == 1
    assert any(
        line.startswith("FAIL") and "allkeys-lru" in line for line in strict.stdout.splitlines()
    )


def test_volatile_policy_counts_as_evicting_too() -> None:
    # Leases carry a TTL, so volatile-* policies evict exactly them.
    with RedisServer(appendonly=True, extra_args=["--maxmemory-policy", "volatile-ttl"]) as server:
        res = run(["check", "--strict"], runner_env(server.url))
    assert res.returncode == 1
    assert "volatile-ttl" in res.stdout


def test_no_persistence_is_a_warning_only(redis_server: RedisServer) -> None:
    res = run(["check", "--strict"], runner_env(redis_server.url))
    assert res.returncode == 0
    (warning,) = [line for line in res.stdout.splitlines() if line.startswith("warn")]
    assert "AOF is off" in warning


@pytest.mark.parametrize(
    ("rules", "named"),
    [
        (["+@all", "-evalsha"], "may not run EVALSHA"),
        (["+@all", "-xadd"], "may not run XADD inside them"),
        (["+@all", "-incr", "-hset"], "may not run INCR, HSET inside them"),
    ],
)
def test_acl_user_lacking_a_permission_fails_naming_it(
    redis_server: RedisServer, r: redis.Redis, rules: list[str], named: str
) -> None:
    r.execute_command("ACL", "SETUSER", "jobs", "on", ">jobs-pw", "~cron-runner:*", *rules)
    env = runner_env(
        redis_server.url, CRON_RUNNER_REDIS_USERNAME="jobs", CRON_RUNNER_REDIS_PASSWORD="jobs-pw"
    )
    res = run(["check"], env)
    assert res.returncode == 1, res.stdout
    (failure,) = [line for line in res.stdout.splitlines() if line.startswith("FAIL")]
    assert named in failure
    assert "'jobs'" in failure
    assert "jobs-pw" not in res.stdout + res.stderr


def test_acl_user_outside_the_task_keyspace_fails(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    r.execute_command("ACL", "SETUSER", "jobs", "on", ">pw", "~other:*", "+@all")
    env = runner_env(
        redis_server.url, CRON_RUNNER_REDIS_USERNAME="jobs", CRON_RUNNER_REDIS_PASSWORD="pw"
    )
    res = run(["check"], env)
    assert res.returncode == 1
    assert "may not access the keys cron-runner:{default:_cron-runner-check-" in res.stdout


def test_acl_user_that_may_not_read_info_gets_warnings(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    r.execute_command(
        "ACL", "SETUSER", "jobs", "on", ">pw", "~cron-runner:*", "+@all", "-info", "-config"
    )
    env = runner_env(
        redis_server.url, CRON_RUNNER_REDIS_USERNAME="jobs", CRON_RUNNER_REDIS_PASSWORD="pw"
    )
    res = run(["check", "--strict"], env)
    assert res.returncode == 0, res.stdout
    assert _levels(res.stdout) == ["ok", "ok", "ok", "warn", "warn"]
    assert "could not read maxmemory-policy" in res.stdout


def test_unreachable_exits_3() -> None:
    env = runner_env(f"redis://127.0.0.1:{free_port()}/0", CRON_RUNNER_CONNECT_TIMEOUT="300ms")
    res = run(["check"], env)
    assert res.returncode == 69
    assert _levels(res.stdout) == ["ok", "FAIL"]
    assert "unreachable" in res.stdout


def test_wrong_password_fails() -> None:
    with RedisServer(extra_args=["--requirepass", "right"]) as server:
        res = run(["check"], runner_env(server.url, CRON_RUNNER_REDIS_PASSWORD="wrong"))
    assert res.returncode == ConfigError.exit_code  # as a run's: a setting to fix
    assert _levels(res.stdout) == ["ok", "FAIL"]
    assert "wrong" not in res.stdout
