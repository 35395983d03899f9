"""Run the installed ``cron-runner`` as a real subprocess, as a CronJob pod or a crontab would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.helpers.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
# RUNNER_BINARY runs the same tests against another build of the runner, such as the
# self-contained one the image carries for app images (tests/image/test_inject.py).
CRON_RUNNER = os.environ.get("RUNNER_BINARY") or str(Path(sys.executable).parent / "cron-runner")
# A task's lease key in the default scope: ``LEASE % name``.
LEASE = "cron-runner:{default:%s}:lease"


def runner_env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRON_RUNNER_", "OTEL_"))}
    env.update(
        CRON_RUNNER_REDIS_URL=redis_url,
        CRON_RUNNER_LOG_FORMAT="json",
        CRON_RUNNER_TASK_MODULES="tests.sample_tasks",
        CRON_RUNNER_CONNECT_TIMEOUT="3s",
        # Tests run daily and hourly schedules at any time of day, hours after their slot; the
        # default starting deadline (300 s) would make them too_late (test_definition.py).
        CRON_RUNNER_STARTING_DEADLINE="168h",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


def cronjob_env(
    redis_url: str, task: str, schedule: str, slot_s: int, **extra: str
) -> dict[str, str]:
    """The environment of the pod that CronJob ``release-<task>`` starts for slot ``slot_s``."""
    cronjob = f"release-{task}"
    return runner_env(
        redis_url,
        CRON_RUNNER_JOB_NAME=f"{cronjob}-{slot_s // 60}",
        CRON_RUNNER_CRONJOB_NAME=cronjob,
        CRON_RUNNER_SCHEDULE=schedule,
        CRON_RUNNER_SLOT_RETENTION="168h",  # tests use slots days old: older are not run
        **extra,
    )


def exec_args(name: str, holder: str, command: list[str]) -> list[str]:
    """``cron-runner exec`` of ``command`` as task ``name`` by ``holder`` (a pod's name)."""
    return ["exec", "--name", name, "--holder", holder, "--", *command]


def run(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CRON_RUNNER, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def run_at(at_s: int, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``run``, started at ``at_s`` as its clocks tell it, by libfaketime (Debian's faketime);
    the Redis server's clock is not moved."""
    stamp = datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return subprocess.run(
        ["faketime", "-f", f"@{stamp}", CRON_RUNNER, *args],
        env={**env, "TZ": "UTC"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def spawn(args: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [CRON_RUNNER, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def spawn_started(
    args: list[str], env: dict[str, str], effects: Path, what: str = "task start", **kwargs: Any
) -> subprocess.Popen[str]:
    """``spawn``, returned once its task has started: it wrote 'start' to ``effects`` (the
    SIDE_EFFECTS file of tests/sample_tasks.py and of the tests' commands)."""
    proc = spawn(args, env, **kwargs)
    wait_for(lambda: side_effects(effects, "start"), what=what)
    return proc


class LoggedRun(subprocess.Popen[str]):
    """Like ``spawn``, but stderr goes to ``log`` as it is written, so that a test can wait
    for a log line while the run goes on."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, **kwargs: Any) -> None:
        self.log = log
        with log.open("w") as err:
            super().__init__(
                [CRON_RUNNER, *args], env=env, stdout=subprocess.DEVNULL, stderr=err, text=True,
                **kwargs,
            )  # fmt: skip

    def logged(self, event: str) -> bool:
        """Whether the runner has logged ``event`` yet."""
        return any(e.get("event") == event for e in events(self.log.read_text()))

    def finish(self, timeout: float = 30) -> str:
        """Wait for the run to end; returns its stderr."""
        self.wait(timeout=timeout)
        return self.log.read_text()


def events(stderr: str) -> list[dict[str, Any]]:
    """The runner's JSON log lines (anything else on stderr is the task's own output)."""
    out = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def outcome(stderr: str) -> str | None:
    for e in reversed(events(stderr)):
        if e.get("outcome") is not None:  # every run line has the key, null until the end
            return str(e["outcome"])
    return None


def side_effects(path: Path, kind: str = "ran") -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line.split(" ", 1)[0] == kind]
