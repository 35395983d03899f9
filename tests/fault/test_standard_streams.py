"""A runner whose standard streams are closed, pipes whose other end is gone, or /dev/full:
the run goes on and is recorded, and no file or socket of the runner becomes fd 0, 1 or 2.
Real processes through the CLI, a real Redis (docs/reliability.md, Standard streams)."""

from __future__ import annotations

import os
import subprocess
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from runner.testing import RedisServer
from tests.helpers.proc import CRON_RUNNER, LEASE, runner_env

STREAMS = (0, 1, 2)
FAULTS = ("closed", "broken-pipe", "dev-full")
COMMANDS = ("exec", "run", "status", "--version")
RUNS = "cron-runner:{default:%s}:runs"


def _spawn(
    args: list[str], env: dict[str, str], fd: int, fault: str, tmp_path: Path
) -> tuple[int, str]:
    """Run ``cron-runner args`` with standard descriptor ``fd`` in state ``fault``; the others
    are /dev/null (stdin) and files. Returns the exit code and stderr (empty when fd 2 is the
    faulty one)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    argv = [CRON_RUNNER, *args]
    with ExitStack() as stack:
        streams: dict[int, Any] = {
            0: subprocess.DEVNULL,
            1: stack.enter_context(out.open("w")),
            2: stack.enter_context(err.open("w")),
        }
        if fault == "closed":
            # As a shell does for `2>&-`: the runner starts without the descriptor.
            argv = ["sh", "-c", f'exec "$@" {fd}>&-', "sh", *argv]
        elif fault == "broken-pipe":
            read_end, write_end = os.pipe()
            # stdin: a pipe whose writer is gone (end of file); stdout, stderr: whose reader is.
            os.close(write_end if fd == 0 else read_end)
            streams[fd] = stack.enter_context(open(read_end if fd == 0 else write_end, "rb"))
        else:
            streams[fd] = stack.enter_context(Path("/dev/full").open("r+b"))
        proc = subprocess.run(
            argv, env=env, stdin=streams[0], stdout=streams[1], stderr=streams[2], timeout=60,
            check=False,
        )  # fmt: skip
    return proc.returncode, "" if fd == 2 else err.read_text()


def _no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert "Exception ignored" not in stderr, stderr


def _runner_fds_not_redis(line: str, fd: int, fault: str) -> None:
    """The runner's fds 0, 1 and 2, as /proc shows them: none is its Redis socket."""
    targets = line.split()
    assert len(targets) == 3, line
    assert not [t for t in targets if t.startswith("socket:")], targets
    if fault == "closed":
        assert targets[fd] == "/dev/null", targets


def _recorded_ran(r: redis.Redis, name: str) -> None:
    entries = cast(list[tuple[str, dict[str, str]]], r.xrange(RUNS % name))
    assert [e[1]["outcome"] for e in entries] == ["ran"], entries
    assert r.get(LEASE % name) is None


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "stream", [(fd, fault) for fd in STREAMS for fault in FAULTS], ids=lambda s: f"fd{s[0]}-{s[1]}"
)
def test_a_faulty_standard_stream_never_stops_a_run_nor_becomes_the_redis_socket(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path, stream: tuple[int, str], command: str
) -> None:
    fd, fault = stream
    effects = tmp_path / "effects"
    env = runner_env(
        redis_server.url, CRON_RUNNER_TASK_MODULES="tests.stream_tasks", SIDE_EFFECTS=str(effects)
    )
    if command == "exec":
        script = (
            f"readlink /proc/$PPID/fd/0 /proc/$PPID/fd/1 /proc/$PPID/fd/2 | tr '\\n' ' ' "
            f"| sed 's/^/fds /' >> {effects}; echo >> {effects}; echo ran >> {effects}"
        )
        code, stderr = _spawn(
            ["exec", "--name", "streams", "--", "sh", "-c", script], env, fd, fault, tmp_path
        )
    elif command == "run":
        code, stderr = _spawn(["run", "streams"], env, fd, fault, tmp_path)
    else:
        if command == "status":
            setup = subprocess.run(
                [CRON_RUNNER, "run", "streams"], env=env, capture_output=True, text=True, timeout=60
            )
            assert setup.returncode == 0, setup.stderr
        code, stderr = _spawn([command], env, fd, fault, tmp_path)
        _no_traceback(stderr)
        if fd == 1 and fault == "dev-full":
            # Its output is its result, and it was lost: said, and not a success.
            assert code == 1, stderr
            assert "could not write the output to stdout" in stderr
        else:
            assert code == 0, stderr
        if fd != 1:
            shown = (tmp_path / "stdout").read_text()
            assert ("streams" if command == "status" else "cron-runner") in shown
        return
    assert code == 0, stderr
    _no_traceback(stderr)
    lines = effects.read_text().splitlines()
    assert "ran" in lines, lines
    (fds,) = [line.removeprefix("fds ") for line in lines if line.startswith("fds ")]
    _runner_fds_not_redis(fds, fd, fault)
    _recorded_ran(r, "streams")
