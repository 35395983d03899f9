"""Fixtures of the image tests (make test-image): podman with the private configuration."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image.kube import FIGURES, Podman


@pytest.fixture
def podman(tmp_path: Path) -> Iterator[Podman]:
    runner = Podman(tmp_path)
    yield runner
    runner.remove_pods()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("image figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
