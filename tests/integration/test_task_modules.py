"""CRON_RUNNER_TASK_MODULES finds a module in the working directory, as `python -m` would,
and a module it cannot find gets an error that says how to fix it (issue 14, item 5)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from runner.errors import ConfigError, StoreUnavailable
from tests.helpers.proc import CRON_RUNNER

HELLO = """
from runner import RunContext, task


@task("hello")
def hello(ctx: RunContext) -> None:
    print("hello from", ctx.task)
"""


def cron_runner(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRON_RUNNER_")}
    base.pop("PYTHONPATH", None)  # what a user's shell has: nothing pointing at the module
    return subprocess.run(
        [CRON_RUNNER, *args],
        cwd=cwd,
        env={**base, "CRON_RUNNER_LOG_FORMAT": "json", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_module_in_the_working_directory_is_found(tmp_path: Path) -> None:
    (tmp_path / "hello_tasks.py").write_text(HELLO)
    listed = cron_runner(["tasks"], tmp_path, CRON_RUNNER_TASK_MODULES="hello_tasks")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[:2] == ["hello", "module"]


def test_a_reference_in_the_working_directory_is_found(tmp_path: Path) -> None:
    (tmp_path / "hello_tasks.py").write_text(HELLO)
    # Found, it goes on to connect: to nothing on port 1, so it stops there (exit 69, not 78).
    ran = cron_runner(
        ["run", "hello_tasks:hello", "--connect-timeout", "1s"],
        tmp_path,
        CRON_RUNNER_REDIS_URL="redis://127.0.0.1:1/0",
    )
    assert ran.returncode == StoreUnavailable.exit_code, ran.stderr


def test_a_module_not_found_says_how_to_fix_it(tmp_path: Path) -> None:
    missing = cron_runner(["tasks"], tmp_path, CRON_RUNNER_TASK_MODULES="hello_tasks")
    assert missing.returncode == ConfigError.exit_code
    line = json.loads(missing.stderr.splitlines()[-1])
    assert line["msg"].startswith(
        "CRON_RUNNER_TASK_MODULES: cannot import module 'hello_tasks': No module named 'hello_tasks'"
    )
    assert f"searched the working directory {tmp_path}" in line["msg"]
    assert "set PYTHONPATH to that directory" in line["msg"]
    assert "Traceback" not in missing.stderr


def test_an_installed_module_wins_over_a_file_of_the_same_name(tmp_path: Path) -> None:
    # The working directory comes last on the path: a stray json.py cannot shadow the stdlib.
    (tmp_path / "json.py").write_text("raise SystemExit('the stray json.py was imported')\n")
    listed = cron_runner(["tasks"], tmp_path, CRON_RUNNER_TASK_MODULES="json")
    assert listed.returncode == 0, listed.stderr
