"""Fixtures of the image tests (make test-image): podman with the private configuration."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image.kube import FIGURES, Podman


@pytest.fixture(scope="session")
def pause_image(tmp_path_factory: pytest.TempPathFactory) -> None:
    # A pod's first start builds podman's local pause image; build it once, before any test
    # starts pods concurrently.
    runner = Podman(tmp_path_factory.mktemp("pause"))
    runner("pod", "create", "--name", "cron-runner-warm-up")
    runner("pod", "rm", "--force", "cron-runner-warm-up")


@pytest.fixture
def podman(tmp_path: Path, pause_image: None) -> Iterator[Podman]:
    runner = Podman(tmp_path)
    yield runner
    runner.remove_pods()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("image figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
