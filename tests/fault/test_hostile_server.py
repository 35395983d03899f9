"""A server at the URL that is not Redis, or answers what Redis never would, is never trusted.

Each shape of tests/helpers/hostile_server.py, against each command: the task never runs (a
marker file stays absent), no traceback, and the exit code says which: 78 when the server does
not answer as Redis does at all (PING not answered with PONG, bytes that are not RESP), 69 for
a RESP reply its command never gives, an error answer, or a server that closes at once. serve
answers /metrics with cron_runner_up 0 and the page with 503, never 500.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.hostile_server import SHAPES, hostile_server
from tests.helpers.proc import run, runner_env
from tests.serve.conftest import serving

# The ops commands' handshake is a PING: anything but PONG is the wrong kind of server (78).
# exec and run send nothing before their acquire: its reply is checked for its shape (69).
NOT_RESP = {"garbage", "http"}
ANSWERS_RESP = {"int_1", "int_minus_1", "ok", "null_array", "string_array", "int_array",
                "nested_arrays", "resp3_map", "null_bulk"}  # fmt: skip
AWAY_OR_REFUSING = {"error", "close"}
assert set(SHAPES) == NOT_RESP | ANSWERS_RESP | AWAY_OR_REFUSING

COMMANDS = {
    "exec": lambda mark: ["exec", "--name", "t", "--", "sh", "-c", f"echo ran >> {mark}"],
    "run": lambda mark: ["run", "ok"],
    "status": lambda mark: ["status"],
    "history": lambda mark: ["history", "t"],
    "check": lambda mark: ["check"],
    "watchdog": lambda mark: ["watchdog"],
}
RUNS_A_TASK = {"exec", "run"}


def expected_exit(shape: str, command: str) -> int:
    if shape in NOT_RESP:
        return 78
    if shape in ANSWERS_RESP:
        return 69 if command in RUNS_A_TASK else 78
    return 69


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_server_that_is_not_redis_runs_nothing_and_exits_78_or_69(
    tmp_path: Path, shape: str, command: str
) -> None:
    mark = tmp_path / "mark"
    with hostile_server(shape) as url:
        env = runner_env(url, SIDE_EFFECTS=str(mark), CRON_RUNNER_CONNECT_TIMEOUT="1s")
        res = run(COMMANDS[command](mark), env)
    assert not mark.exists(), f"the task ran on a {shape} reply"
    assert "skipped_done" not in res.stderr, "a slot reported done that never ran"
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == expected_exit(shape, command), res.stderr
    said = res.stderr + res.stdout  # check reports on stdout
    if shape in NOT_RESP or (shape in ANSWERS_RESP and command not in RUNS_A_TASK):
        assert "is not Redis" in said, said
    elif shape in ANSWERS_RESP:
        assert "is not one Redis gives" in said, said


@pytest.mark.parametrize("shape", list(SHAPES))
def test_serve_answers_a_server_that_is_not_redis_with_503_and_up_0(
    tmp_path: Path, shape: str
) -> None:
    log = tmp_path / "serve.log"
    with hostile_server(shape) as url:
        env = runner_env(url, CRON_RUNNER_CONNECT_TIMEOUT="1s")
        with serving(env, log) as served:
            code, metrics = served.get("/metrics")
            assert code == 200 and "cron_runner_up 0" in metrics, metrics
            for route in ("/", "/tasks/t", "/readyz"):
                code, body = served.get(route)
                assert code == 503, (route, code, body)
                assert "Redis" in body
    assert "Traceback" not in log.read_text()
