"""A pause beside the previous release (bf4bd60, protocol 2), which does not read the pause: the
raised protocol minimum makes it refuse the paused task (78) and run nothing, and after the
resume it runs the task again. b170e33 (protocol 1) checks no minimum: docs/design.md, Pause."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from runner.errors import ConfigError
from runner.schedule.slots import Schedule
from runner.testing import RedisServer
from tests.helpers.proc import cronjob_env, outcome, run, runner_env
from tests.integration import test_upgrade

pytestmark = pytest.mark.upgrade
FIVE = "*/5 * * * *"
# test_upgrade's session fixture (a worktree and venv per release), here for bf4bd60 alone.
previous_runner = test_upgrade.previous_runner


def _pod(redis_url: str, slot: int, side: str) -> dict[str, str]:
    env = cronjob_env(redis_url, "mixed", FIVE, slot, SIDE=side)
    # The old venv imports its own runner package, not this checkout's.
    for name in ("PYTHONPATH", "CRON_RUNNER_TASK_MODULES"):
        env.pop(name, None)
    return env


@pytest.mark.parametrize("previous_runner", ["bf4bd60"], indirect=True)
def test_the_previous_release_refuses_a_paused_task_and_runs_it_again_after_resume(
    redis_server: RedisServer, previous_runner: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    command = ["exec", "--name", "mixed", "--", "sh", "-c", f'echo "$SIDE" >> {effects}']
    first = Schedule.parse(FIVE, "UTC", 0).previous_at_or_before(time.time() - 3600)
    url = redis_server.url

    def old(slot: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([previous_runner, *command], env=_pod(url, slot, "old"),
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    # Both releases run the task side by side while it is not paused.
    assert run(command, _pod(url, first, "new")).returncode == 0
    assert old(first + 300).returncode == 0
    assert run(["pause", "mixed", "--note", "upgrade window"], runner_env(url)).returncode == 0

    refused = old(first + 600)
    assert refused.returncode == ConfigError.exit_code, refused.stderr
    assert "protocol refused" in refused.stderr and "needing protocol 3" in refused.stderr
    skipped = run(command, _pod(url, first + 600, "new"))
    assert (skipped.returncode, outcome(skipped.stderr)) == (0, "paused")
    assert effects.read_text().split() == ["new", "old"]

    assert run(["resume", "mixed"], runner_env(url)).returncode == 0
    again = old(first + 600)
    assert again.returncode == 0, again.stderr
    assert effects.read_text().split() == ["new", "old", "old"]
    history = run(["history", "mixed"], runner_env(url))
    assert [line.split()[4] for line in history.stdout.splitlines()[1:]] == [
        "ran", "resume", "paused", "pause", "ran", "ran"]  # fmt: skip
