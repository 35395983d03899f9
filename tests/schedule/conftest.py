"""The schedule oracles (tests/schedule/oracles.py), built at test time or taken from their
cache, and the figures of the differential tests, printed at the end of the session."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.schedule.oracles import OracleBuildError, oracle

FIGURES = pytest.StashKey[list[str]]()

Oracle = Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]]


def _asker(binary: Path) -> Oracle:
    def ask(requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        lines = "".join(json.dumps(r) + "\n" for r in requests)
        done = subprocess.run(
            [str(binary)],
            input=lines,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
            env={"TZ": "UTC"},  # the controller's zone for a CronJob without timeZone
        )
        answers = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(answers) == len(requests)
        return answers

    return ask


def _built(name: str, config: pytest.Config) -> Oracle:
    """Fails (never skips) when Go is missing or the build fails, saying why."""
    try:
        binary, how = oracle(name)
    except OracleBuildError as exc:
        pytest.fail(f"the {name} oracle: {exc}", pytrace=False)
    config.stash.setdefault(FIGURES, []).append(f"oracle {name}: {how}")
    return _asker(binary)


@pytest.fixture(scope="session")
def robfig(request: pytest.FixtureRequest) -> Oracle:
    """Answers batches of requests (see oracles/robfig/main.go) with one process each."""
    return _built("robfig", request.config)


@pytest.fixture(scope="session")
def controller(request: pytest.FixtureRequest) -> Oracle:
    """The CronJob controller's own code (see oracles/cronjob/main.go): one process a batch."""
    return _built("cronjob", request.config)


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[[str], None]:
    def add(line: str) -> None:
        request.config.stash.setdefault(FIGURES, []).append(line)

    return add


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = config.stash.get(FIGURES, [])
    if lines:
        terminalreporter.section(
            "schedules against robfig/cron v3.0.1 and the Kubernetes v1.36.3 CronJob controller"
        )
        for line in lines:
            terminalreporter.write_line(line)
