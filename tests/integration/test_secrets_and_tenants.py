"""Issue 12, items 13-16: the task gets none of the runner's credentials, no password is shown,
nothing a holder wrote can drive the operator's terminal, and one team's ACL user reaches only
its own scope. Real Redis, real ACL users, the CLI as a subprocess."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import NoPermissionError

from runner.errors import ConfigError
from runner.testing import RedisServer
from tests.helpers.proc import ROOT, events, outcome, run, runner_env

SECRET = "s3cr3t-Pa55"
SENTINEL_SECRET = "sentinel-Pa55"

DUMP_ENV = ["sh", "-c", 'env > "$DUMP"']


@pytest.fixture
def locked() -> Iterator[RedisServer]:
    with RedisServer(extra_args=["--requirepass", SECRET]) as server:
        yield server


def _dumped(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


# -- 13: the task's environment ----------------------------------------------------------


def test_the_task_inherits_none_of_the_runners_credentials(
    locked: RedisServer, tmp_path: Path
) -> None:
    """A command (exec) and a Python task (run) each see the URL without credentials and no
    password variable; a task asked for them (TASK_SHARES_CREDENTIALS) gets them."""
    port = locked.port
    module = tmp_path / "env_tasks.py"
    module.write_text(
        "import json, os\nfrom runner import task\n\n@task('dump-env')\n"
        "def dump(ctx):\n    open(os.environ['DUMP'], 'w').write("
        "'\\n'.join(f'{k}={v}' for k, v in os.environ.items()))\n"
    )
    shapes = {
        "password variable": runner_env(f"redis://127.0.0.1:{port}/0",
                                        CRON_RUNNER_REDIS_PASSWORD=SECRET),
        "credentials in the URL": runner_env(f"redis://:{SECRET}@127.0.0.1:{port}/0"),
        "password in the query": runner_env(f"redis://127.0.0.1:{port}/0?password={SECRET}"),
    }  # fmt: skip
    for shape, env in shapes.items():
        env.update(CRON_RUNNER_REDIS_SENTINEL_PASSWORD=SENTINEL_SECRET,
                   PYTHONPATH=f"{ROOT}:{tmp_path}",
                   CRON_RUNNER_TASK_MODULES="env_tasks")  # fmt: skip
        for args in (["exec", "--name", "dump", "--", *DUMP_ENV], ["run", "dump-env"]):
            dump = tmp_path / "env.txt"
            res = run(args, {**env, "DUMP": str(dump)})
            assert res.returncode == 0, (shape, res.stderr)
            seen = _dumped(dump)
            text = dump.read_text()
            assert SECRET not in text and SENTINEL_SECRET not in text, (shape, args)
            assert "CRON_RUNNER_REDIS_PASSWORD" not in seen
            assert "CRON_RUNNER_REDIS_SENTINEL_PASSWORD" not in seen
            assert seen["CRON_RUNNER_REDIS_URL"] == f"redis://127.0.0.1:{port}/0", shape
            dump.unlink()
    shared = {**shapes["password variable"], "CRON_RUNNER_TASK_SHARES_CREDENTIALS": "true"}
    dump = tmp_path / "env.txt"
    assert (
        run(["exec", "--name", "dump", "--", *DUMP_ENV], {**shared, "DUMP": str(dump)}).returncode
        == 0
    )
    assert _dumped(dump)["CRON_RUNNER_REDIS_PASSWORD"] == SECRET


def test_the_password_can_come_from_a_file_the_task_is_not_told_of(
    locked: RedisServer, tmp_path: Path
) -> None:
    secret_file = tmp_path / "password"
    secret_file.write_text(SECRET + "\n")  # a Secret's file often ends in a newline
    env = runner_env(locked.url, CRON_RUNNER_REDIS_PASSWORD_FILE=str(secret_file))
    dump = tmp_path / "env.txt"
    res = run(["exec", "--name", "from-file", "--", *DUMP_ENV], {**env, "DUMP": str(dump)})
    assert (res.returncode, outcome(res.stderr)) == (0, "ran"), res.stderr
    assert "CRON_RUNNER_REDIS_PASSWORD_FILE" not in _dumped(dump)

    both = run(["status"], {**env, "CRON_RUNNER_REDIS_PASSWORD": SECRET})
    missing = run(["status"], {**env, "CRON_RUNNER_REDIS_PASSWORD_FILE": str(tmp_path / "no")})
    for res in (both, missing):
        assert res.returncode == ConfigError.exit_code, res.stderr
        assert "CRON_RUNNER_REDIS_PASSWORD_FILE" in res.stderr
        assert "Traceback" not in res.stderr


def test_authentication_required_names_the_password_variable(locked: RedisServer) -> None:
    res = run(["exec", "--name", "noauth", "--", "true"], runner_env(locked.url))
    assert res.returncode == ConfigError.exit_code, res.stderr
    # "Authentication required", or, for a command too long to read before AUTH,
    # "unauthenticated multibulk length": either way, the variable to set.
    assert "uthenticat" in res.stderr
    assert "CRON_RUNNER_REDIS_PASSWORD" in res.stderr


# -- 14: a password in the URL's query ----------------------------------------------------


def test_a_password_in_the_query_is_masked_in_logs_status_and_check(
    locked: RedisServer, tmp_path: Path
) -> None:
    url = f"redis://127.0.0.1:{locked.port}/0?password={SECRET}"
    env = runner_env(url, CRON_RUNNER_SCHEDULE="0 0 * * *")
    outputs = {
        "run": run(["exec", "--name", "q", "--", "true"], env),
        "status": run(["status"], env),
        "status json": run(["status", "-o", "json"], env),
        "check": run(["check"], env),
        "unreachable": run(["exec", "--name", "q", "--", "true"],
                           runner_env(f"redis://127.0.0.1:1/0?password={SECRET}",
                                      CRON_RUNNER_CONNECT_TIMEOUT="200ms")),
        "bad port": run(["status"], runner_env(f"redis://127.0.0.1:x/0?password={SECRET}")),
    }  # fmt: skip
    for what, res in outputs.items():
        assert SECRET not in res.stdout + res.stderr, what
    assert outputs["run"].returncode == 0, outputs["run"].stderr
    assert outputs["check"].returncode == 0, outputs["check"].stdout
    assert "127.0.0.1***" in outputs["bad port"].stderr  # what follows a bad host is masked


def test_a_password_on_the_command_line_is_warned_about(locked: RedisServer) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{locked.port}/0"
    res = run(["status", "--redis-url", url], runner_env("redis://127.0.0.1:1/0"))
    assert res.returncode == 0, res.stderr
    warned = [e for e in events(res.stderr) if e.get("event") == "password_on_command_line"]
    assert warned and "CRON_RUNNER_REDIS_PASSWORD_FILE" in warned[0]["msg"]
    assert SECRET not in res.stderr


def test_an_unknown_url_option_is_a_configuration_error() -> None:
    res = run(["exec", "--name", "x", "--", "true"], runner_env("redis://127.0.0.1:1/0?foo=bar"))
    assert res.returncode == ConfigError.exit_code, res.stderr
    assert "URL option 'foo' is not supported" in res.stderr
    assert "Traceback" not in res.stderr


# -- 15: what a holder wrote reaches the status table escaped --------------------------------


def test_control_characters_in_a_holder_are_escaped_in_status(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    evil = "pod\x1b]0;owned\x07\x1b[2J\r\u202e:abc123"
    r.set("cron-runner:{default:victim}:lease", evil, px=60_000)
    env = runner_env(redis_server.url)
    for args in (["status"], ["status", "victim"], ["forget", "victim", "--force"]):
        res = run(args, env)
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", res.stdout), (args, res.stdout)
        assert "\\x1b" in res.stdout, args
    refused = run(["exec", "--name", "x", "--", "true"],
                  {**env, "CRON_RUNNER_HOLDER": "pod\x1b[2J"})  # fmt: skip
    assert refused.returncode == ConfigError.exit_code, refused.stderr
    assert "CRON_RUNNER_HOLDER" in refused.stderr


# -- 16: teams on one Redis -------------------------------------------------------------------

# The per-scope rule docs/reliability.md publishes (SCOPE and the password changed), checked
# word for word by test_docs_publish_the_per_scope_rule.
SCOPE_RULE = (
    "resetkeys ~cron-runner:{SCOPE:* resetchannels -@all "
    "+evalsha +eval +get +set +pexpire +pttl +incr +time +hmget +hget +del +xadd +hset +sadd +ping "
    "+smembers +hgetall +xrange +xrevrange +hsetnx +hincrby +srem +hdel"
)


def _team(admin: redis.Redis, scope: str) -> None:
    rule = SCOPE_RULE.replace("SCOPE", scope)
    admin.execute_command("ACL", "SETUSER", scope, "reset", "on", f">{scope}-pw", *rule.split())


def test_a_team_reaches_only_its_own_scope(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    for team in ("team-a", "team-b"):
        _team(r, team)

    # Daily at an hour twelve hours away: no run of the test comes near a fire time, so the
    # watchdog's answer is exact: the slot twelve hours ago, run by billing-fails, failed.
    hour = (time.gmtime().tm_hour + 12) % 24

    def env(user: str, scope: str, **extra: str) -> dict[str, str]:
        return runner_env(redis_server.url, CRON_RUNNER_REDIS_USERNAME=user,
                          CRON_RUNNER_REDIS_PASSWORD=f"{user}-pw", CRON_RUNNER_SCOPE=scope,
                          CRON_RUNNER_SCHEDULE=f"0 {hour} * * *", **extra)  # fmt: skip

    a, b = env("team-a", "team-a"), env("team-b", "team-b")
    # Every command of a run, as the team's own user.
    assert run(["exec", "--name", "billing", "--", "true"], a).returncode == 0
    assert run(["exec", "--name", "billing-fails", "--", "false"], a).returncode == 1
    assert run(["run", "ok"], a).returncode == 0
    assert run(["check"], a).returncode == 0
    assert run(["exec", "--name", "payroll", "--", "true"], b).returncode == 0
    # A slot run twice: the second run skips it, and the skip is counted on its marker.
    minutes = int(time.time() // 60) - 1
    slot_env = {**a, "CRON_RUNNER_JOB_NAME": f"billing-{minutes}"}
    for _ in range(2):
        assert run(["exec", "--name", "billing", "--", "true"], slot_env).returncode == 0
    assert r.hget(f"cron-runner:{{team-a:billing}}:slot:{minutes * 60}", "skips") == "1"
    r.set("cron-runner:{team-b:payroll}:lease", "pod-b:1", px=60_000)

    # status and the watchdog list the team's tasks, and only them, with no SCAN allowed.
    status = run(["status", "-o", "json"], a)
    assert status.returncode == 0, status.stderr
    assert [t["task"] for t in json.loads(status.stdout)["tasks"]] == [
        "billing", "billing-fails", "ok"
    ]  # fmt: skip
    expect = f"new-one=0 {(hour + 1) % 24} * * *"
    watchdog = run(["watchdog", "--expect", expect, "-o", "json"], a)
    assert watchdog.returncode == 1, watchdog.stderr
    report = json.loads(watchdog.stdout)
    assert report["checked"] == 4
    assert [t["task"] for t in report["overdue"]] == ["billing-fails"]
    assert run(["history", "billing"], a).returncode == 0
    assert run(["forget", "billing-fails", "--force"], a).returncode == 0
    assert "billing-fails" not in run(["status"], a).stdout
    r.set("cron-runner:{team-a:held}:lease", "pod-a:1", px=60_000)
    assert run(["unlock", "held", "--force"], a).returncode == 0

    # team-a's user, pointed at team-b's scope, can neither read nor change it.
    intruder = env("team-a", "team-b")
    for args in (["unlock", "payroll", "--force"], ["forget", "payroll", "--force"],
                 ["status", "payroll"], ["exec", "--name", "payroll", "--", "true"]):  # fmt: skip
        res = run(args, intruder)
        assert res.returncode == ConfigError.exit_code, (args, res.stderr)
        assert "Traceback" not in res.stderr
    assert r.get("cron-runner:{team-b:payroll}:lease") == "pod-b:1"
    assert r.exists("cron-runner:{team-b:payroll}:state")

    # Nor list other teams' key names: SCAN and KEYS are not in the rule.
    raw = redis.Redis(port=redis_server.port, username="team-a", password="team-a-pw")
    for command in (("SCAN", "0"), ("KEYS", "*")):
        with pytest.raises(NoPermissionError):
            raw.execute_command(*command)
    raw.close()


def test_docs_publish_the_per_scope_rule() -> None:
    docs = re.sub(r"\s*\\\n\s*", " ", (ROOT / "docs" / "reliability.md").read_text())
    assert f"ACL SETUSER team-a on >PASSWORD {SCOPE_RULE.replace('SCOPE', 'team-a')}" in docs
    readme = (ROOT / "docs" / "configuration.md").read_text()
    assert "~cron-runner:{team-a:*" in readme


def test_check_scratch_name_leaves_tasks_named_like_it_visible(
    redis_server: RedisServer,
) -> None:
    """A task may be called cron-runner-check-anything: status and the watchdog show it."""
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 3 * * *")
    assert run(["exec", "--name", "cron-runner-check-db", "--", "true"], env).returncode == 0
    assert run(["check"], env).returncode == 0
    status = json.loads(run(["status", "-o", "json"], env).stdout)
    assert [t["task"] for t in status["tasks"]] == ["cron-runner-check-db"]
    watchdog = json.loads(run(["watchdog", "-o", "json"], env).stdout)
    assert watchdog["checked"] == 1
