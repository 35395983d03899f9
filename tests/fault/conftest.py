"""Fault-matrix figures: each test records what it saw (duplicates, overlap, exit codes), and
the session prints them as one table at the end (and writes them as JSON to the file named
by CRON_RUNNER_FAULT_FIGURES, when set). docs/reliability.md quotes these figures."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.ticker import children

FIGURES = pytest.StashKey[list[dict[str, Any]]]()

Figure = Callable[..., None]


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Figure:
    """``figure(row, duplicates=0, overlap_ms=..., exit_codes=[...], **more)``."""

    def record(row: str, **values: Any) -> None:
        rows = request.config.stash.setdefault(FIGURES, [])
        rows.append({"row": row, "test": request.node.name, **values})

    return record


def _descendants(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        found += [child, *_descendants(child)]
    return found


@pytest.fixture(autouse=True)
def _no_process_left_behind() -> Iterator[None]:
    """A failing fault test can leave a runner or its endless task running: stop them, so that
    they do not load the machine under the tests that follow."""
    yield
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    rows = config.stash.get(FIGURES, [])
    if not rows:
        return
    terminalreporter.section("fault matrix figures")
    for row in sorted(rows, key=lambda r: str(r["row"])):
        fields = " ".join(f"{k}={v}" for k, v in row.items() if k not in ("row", "test"))
        terminalreporter.write_line(f"{row['row']:<4} {row['test']}: {fields}")
    path = os.environ.get("CRON_RUNNER_FAULT_FIGURES")
    if path:
        Path(path).write_text(json.dumps(rows, indent=1, default=str) + "\n")
