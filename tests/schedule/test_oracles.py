"""How the schedule oracles are built (tests/schedule/oracles.py): with a Go 1.26 or later even
when an older Go is first on PATH, a clear failure when there is none, and from the cache the
second time."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.schedule import oracles


def _fake_go(directory: Path, version: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    go = directory / "go"
    go.write_text(f"#!/bin/sh\necho {version}\n")
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    return go


def test_an_older_go_first_on_path_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian's golang-go (1.19) as /usr/bin/go first on PATH: /usr/local/go's is used."""
    old = _fake_go(tmp_path / "debian", "go1.19.8")
    new = _fake_go(tmp_path / "local", "go1.26.8")
    monkeypatch.setenv("PATH", f"{old.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(oracles, "GO_INSTALL", str(new))
    assert oracles.find_go() == (str(new), "go1.26.8")


def test_no_suitable_go_fails_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = _fake_go(tmp_path / "debian", "go1.19.8")
    monkeypatch.setenv("PATH", str(old.parent))
    monkeypatch.setattr(oracles, "GO_INSTALL", str(tmp_path / "none" / "go"))
    with pytest.raises(oracles.OracleBuildError) as raised:
        oracles.find_go()
    assert str(raised.value) == (
        f"the schedule oracles need Go 1.26 or later, found {old} (go1.19.8): "
        "install Go at /usr/local/go (or first on PATH)"
    )


@pytest.mark.timeout(600)
def test_a_second_build_comes_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRON_RUNNER_ORACLE_CACHE", str(tmp_path / "cache"))
    binary, how = oracles.oracle("robfig")
    assert how.startswith("built in "), how
    assert oracles.oracle("robfig") == (binary, f"cached ({binary.parent})")
    # Another source is another key: the build runs again, and the stale binary goes.
    module = tmp_path / "oracles"
    shutil.copytree(oracles.ORACLES, module)
    with (module / "robfig" / "main.go").open("a") as main:
        main.write("\n// another version\n")
    monkeypatch.setattr(oracles, "ORACLES", module)
    rebuilt, how = oracles.oracle("robfig")
    assert how.startswith("built in "), how
    assert rebuilt != binary
    assert not binary.parent.exists()
