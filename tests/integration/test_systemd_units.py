"""The unit files of examples/systemd/ are ones systemd accepts, and the worker's is kept
alive and stopped gracefully (issue 14, item 4).

`systemd-analyze verify` (Debian's systemd package) loads each unit as systemd would: unknown
keys, bad values and an ExecStart that is not executable fail it. It runs on a root of its own
that holds the host's system units and a stand-in `cron-runner` at the path the units name.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from runner.cli.main import build_parser
from runner.config.sources import parse_duration

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted(
    p for p in (ROOT / "examples" / "systemd").iterdir() if p.suffix in (".service", ".timer")
)
WORKER = ROOT / "examples" / "systemd" / "cron-runner-worker.service"


def settings_of(unit: Path) -> dict[str, list[str]]:
    """KEY -> every value it is given, over all sections (systemd allows repeated keys)."""
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def exec_start(unit: Path) -> list[str]:
    return shlex.split(settings_of(unit)["ExecStart"][0])


@pytest.fixture(scope="module")
def unit_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("systemd-root")
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(unit, units / unit.name)
        if unit.suffix == ".service":
            binary = root / exec_start(unit)[0].lstrip("/")
            binary.parent.mkdir(parents=True, exist_ok=True)
            binary.write_text("#!/bin/sh\n")
            binary.chmod(0o755)
    return root


def test_every_example_is_checked() -> None:
    assert {u.name for u in UNITS} >= {"billing.service", "billing.timer", WORKER.name}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verify_accepts_the_unit(unit_root: Path, unit: Path) -> None:
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", f"--root={unit_root}", unit.name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stderr == "", verify.stderr


def test_verify_has_teeth(unit_root: Path) -> None:
    bad = unit_root / "etc/systemd/system/broken.service"
    bad.write_text(WORKER.read_text().replace("Restart=always", "Restart=whenever"))
    try:
        verify = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", f"--root={unit_root}", bad.name],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        bad.unlink()
    assert "restart specifier, ignoring: whenever" in verify.stderr


@pytest.mark.parametrize("unit", [u for u in UNITS if u.suffix == ".service"], ids=lambda p: p.name)
def test_the_command_line_is_one_cron_runner_accepts(unit: Path) -> None:
    argv = exec_start(unit)
    assert Path(argv[0]).name == "cron-runner"
    build_parser(argv[1]).parse_args(argv[1:])  # a bad flag raises ConfigError


def test_the_worker_is_kept_alive_and_stops_within_its_timeout() -> None:
    unit = settings_of(WORKER)
    assert exec_start(WORKER)[1] == "worker"
    assert unit["Restart"] == ["always"]
    assert unit["KillMode"] == ["mixed"]  # SIGTERM to the worker, which passes it on
    grace = next(e for e in unit["Environment"] if e.startswith("CRON_RUNNER_SHUTDOWN_GRACE="))
    grace_s = parse_duration(grace.partition("=")[2], "CRON_RUNNER_SHUTDOWN_GRACE")
    # systemd's SIGKILL must come after the worker has put back what still runs.
    assert parse_duration(unit["TimeoutStopSec"][0], "TimeoutStopSec") > grace_s
    assert "143" in unit["SuccessExitStatus"][0].split()
