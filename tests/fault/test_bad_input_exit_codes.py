"""Issue 12, items 18-22: bad input is a configuration error (exit 78, naming the setting),
never a traceback or a code that a Job would retry (1, 69, 75); the connect deadline holds
against a server that accepts and never answers. Real servers, the CLI as a subprocess."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.errors import ConfigError, StoreUnavailable
from runner.testing import RedisServer
from tests.helpers.proc import ROOT, events, outcome, run, runner_env

CONFIG = ConfigError.exit_code


def _refused(res: object, *says: str) -> None:
    stderr = getattr(res, "stderr", "")
    assert getattr(res, "returncode", None) == CONFIG, stderr
    assert "Traceback" not in stderr, stderr
    for text in says:
        assert text in stderr, (text, stderr)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Accepts connections, reads what it is sent, never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for conn in held:
        conn.close()


# -- 18: tracebacks ---------------------------------------------------------------------------


def test_bad_urls_and_counts_exit_78_without_a_traceback(redis_server: RedisServer) -> None:
    exec_true = ["exec", "--name", "x", "--", "true"]
    label = "a" * 64
    cases = {
        "url option": (exec_true, {"CRON_RUNNER_REDIS_URL": "redis://127.0.0.1/0?foo=bar"}),
        "long host label": (exec_true, {"CRON_RUNNER_REDIS_URL": f"redis://{label}.example/0"}),
        "long sentinel label": (exec_true, {"CRON_RUNNER_REDIS_SENTINELS": f"{label}.x:26379"}),
        "port 0": (exec_true, {"CRON_RUNNER_REDIS_URL": "redis://127.0.0.1:0/0"}),
        "history huge": (["history", "x", "-n", "99999999999999999999"], {}),
        "history arabic digits": (["history", "x", "-n", "\u0661\u0662"], {}),
    }
    for case, (args, extra) in cases.items():
        res = run(args, runner_env(redis_server.url, **extra))
        _refused(res)
        assert case and "expected" in res.stderr, (case, res.stderr)


@pytest.mark.parametrize(
    ("source", "says"),
    [("def broken(:\n", "syntax error"), ("raise RuntimeError('no db')\n", "RuntimeError: no db")],
    ids=["syntax-error", "raises-at-import"],
)
def test_a_task_module_that_cannot_import_is_a_configuration_error(
    redis_server: RedisServer, tmp_path: Path, source: str, says: str
) -> None:
    (tmp_path / "bad_tasks.py").write_text(source)
    env = runner_env(redis_server.url, CRON_RUNNER_TASK_MODULES="bad_tasks",
                     PYTHONPATH=f"{ROOT}:{tmp_path}")  # fmt: skip
    for args in (["run", "ok"], ["tasks"]):
        _refused(run(args, env), "CRON_RUNNER_TASK_MODULES", "bad_tasks", says)


# -- 19: configuration errors that exited 69 or 75 --------------------------------------------


def test_wrong_server_shapes_are_configuration_errors(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    touch = ["exec", "--name", "x", "--", "touch", str(effects)]
    db16 = redis_server.url.rsplit("/", 1)[0] + "/16"
    _refused(run(touch, runner_env(db16)), "databases")
    _refused(run(touch, runner_env(redis_server.url, CRON_RUNNER_REDIS_CLUSTER="true")),
             "CRON_RUNNER_REDIS_CLUSTER")  # fmt: skip
    sentinels = runner_env(redis_server.url,
                           CRON_RUNNER_REDIS_SENTINELS=f"127.0.0.1:{redis_server.port}")  # fmt: skip
    _refused(run(touch, sentinels), "CRON_RUNNER_REDIS_SENTINELS")
    assert not effects.exists()


def test_an_acl_without_pexpire_is_refused_before_the_task_starts(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    """Renewals would be refused until the lease ran out (exit 75, the task stopped midway):
    the acquisition itself proves the permission, at no extra round trip."""
    from tests.integration.test_redis_shapes import ACL_RULE  # noqa: PLC0415

    rule = ACL_RULE.replace(" +pexpire", "")
    r.execute_command("ACL", "SETUSER", "cron-runner", "reset", "on", ">s3cret", *rule.split())
    effects = tmp_path / "effects"
    env = runner_env(redis_server.url, CRON_RUNNER_REDIS_USERNAME="cron-runner",
                     CRON_RUNNER_REDIS_PASSWORD="s3cret", CRON_RUNNER_LEASE_TTL="1s")  # fmt: skip
    res = run(["exec", "--name", "renews", "--", "sh", "-c", f"touch {effects}; sleep 1"], env)
    _refused(res, "ACL user lacks")
    assert not effects.exists()
    assert r.get("cron-runner:{default:renews}:lease") is None


# -- 20: the connect deadline -----------------------------------------------------------------


def test_the_connect_deadline_holds_against_a_server_that_never_answers(
    silent_server: int,
) -> None:
    env = runner_env(f"redis://127.0.0.1:{silent_server}/0", CRON_RUNNER_CONNECT_TIMEOUT="1s")
    for args in (["exec", "--name", "x", "--", "true"], ["status"]):
        res = run(args, env)
        assert res.returncode == StoreUnavailable.exit_code, res.stderr
    finished = [e for e in events(run(["exec", "--name", "x", "--", "true"], env).stderr)
                if e.get("event") == "finished"]  # fmt: skip
    # One attempt used to wait out the 5 s socket timeout (ttl/4) whatever the deadline.
    assert finished and finished[0]["duration_ms"] < 2500, finished


def test_rediss_to_a_plain_server_is_a_configuration_error(redis_server: RedisServer) -> None:
    env = runner_env(f"rediss://127.0.0.1:{redis_server.port}/0", CRON_RUNNER_CONNECT_TIMEOUT="3s")
    res = run(["exec", "--name", "x", "--", "true"], env)
    _refused(res, "answers plain Redis", "redis://")


# -- 22: smaller ones -------------------------------------------------------------------------


# Arabic-Indic and fullwidth digits, which a \\d regex and float() both accept.
@pytest.mark.parametrize("value", ["\u0661\u0662s", "\uff11\uff12", "12\u0661", "\u0663\u0660"])
def test_non_ascii_digits_are_not_durations(redis_server: RedisServer, value: str) -> None:
    for variable in ("CRON_RUNNER_LEASE_TTL", "CRON_RUNNER_CONNECT_TIMEOUT"):
        res = run(
            ["exec", "--name", "x", "--", "true"], runner_env(redis_server.url, **{variable: value})
        )
        _refused(res, variable)


def test_skew_tolerance_0_is_accepted(redis_server: RedisServer) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="* * * * *")
    res = run(["exec", "--name", "exact", "--skew-tolerance", "0", "--", "true"], env)
    assert (res.returncode, outcome(res.stderr)) == (0, "ran"), res.stderr


def test_watchdog_ignore_and_dlq_task_are_validated(redis_server: RedisServer) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_TASK_MODULES="tests.queue.queue_tasks")
    _refused(run(["watchdog", "--ignore", "{x}"], env), "--ignore")
    _refused(run(["watchdog", "--ignore", "a\nb"], env), "--ignore")
    _refused(run(["dlq", "list", "no-such-task"], env), "unknown task", "--queue")
    named = run(["dlq", "list", "no-such-task", "--queue", "old"], env)
    assert named.returncode == 0, named.stderr
