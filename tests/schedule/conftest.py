"""The robfig/cron oracle, built from Debian's source package at test time, and the figures of
the differential test, printed at the end of the session."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROBFIG_SOURCE = Path(
    "/usr/share/gocode/src/github.com/robfig/cron"
)  # golang-github-robfig-cron-dev
GO_MOD = f"""module cronoracle

go 1.19

require github.com/robfig/cron/v3 v3.0.1

replace github.com/robfig/cron/v3 => {ROBFIG_SOURCE}
"""

FIGURES = pytest.StashKey[list[str]]()

Oracle = Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]]


@pytest.fixture(scope="session")
def robfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oracle]:
    """Answers batches of requests (see robfig_oracle.go) with one oracle process each."""
    go = shutil.which("go")
    if go is None or not (ROBFIG_SOURCE / "spec.go").is_file():
        pytest.skip("needs golang-go and golang-github-robfig-cron-dev (installed by .ci/run)")
    work = tmp_path_factory.mktemp("robfig")
    (work / "main.go").write_text((Path(__file__).parent / "robfig_oracle.go").read_text())
    (work / "go.mod").write_text(GO_MOD)
    # Offline: the module comes from the Debian path by the replace, never from a proxy.
    env = {
        **os.environ,
        "GOPROXY": "off",
        "GOFLAGS": "-mod=mod",
        "GOSUMDB": "off",
        "GOTOOLCHAIN": "local",
        "GOCACHE": str(work / "cache"),
        "GOPATH": str(work / "gopath"),
        "CGO_ENABLED": "0",
    }
    binary = work / "oracle"
    built = subprocess.run(
        [go, "build", "-o", str(binary), "."], cwd=work, env=env, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr

    def ask(requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        lines = "".join(json.dumps(r) + "\n" for r in requests)
        done = subprocess.run(
            [str(binary)], input=lines, capture_output=True, text=True, check=True, timeout=300
        )
        answers = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(answers) == len(requests)
        return answers

    yield ask


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[[str], None]:
    def add(line: str) -> None:
        request.config.stash.setdefault(FIGURES, []).append(line)

    return add


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = config.stash.get(FIGURES, [])
    if lines:
        terminalreporter.section("schedules against robfig/cron v3.0.1")
        for line in lines:
            terminalreporter.write_line(line)
