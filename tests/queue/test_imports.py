"""Dramatiq is imported only in queue mode: a CronJob pod in run mode starts cold every
time, and must not pay for a library it does not use (CONVENTIONS.md, Do this 13)."""

from __future__ import annotations

import subprocess
import sys

from runner.testing import RedisServer
from tests.helpers.proc import ROOT
from tests.queue.helpers import queue_env

PROBE = """
import sys
from runner.cli.main import main
code = main(sys.argv[1:])
print("dramatiq" in sys.modules, code)
"""


def loaded_after(env: dict[str, str], *args: str) -> tuple[bool, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    loaded, code = done.stdout.split()[-2:]
    return loaded == "True", int(code)


def test_run_mode_never_imports_dramatiq(redis_server: RedisServer) -> None:
    env = queue_env(redis_server, CRON_RUNNER_SCHEDULE="*/5 * * * *")
    assert loaded_after(env, "exec", "--name", "plain", "--", "true") == (False, 0)
    assert loaded_after(env, "run", "q-ok") == (False, 0)
    assert loaded_after(env, "tasks") == (False, 0)
    assert loaded_after(env, "check") == (False, 0)


def test_enqueue_mode_and_the_dlq_do(redis_server: RedisServer) -> None:
    env = queue_env(redis_server, CRON_RUNNER_SCHEDULE="*/5 * * * *")
    assert loaded_after(env, "run", "q-ok", "--mode", "enqueue") == (True, 0)
    assert loaded_after(env, "dlq", "retry", "q-ok", "--all") == (True, 0)
