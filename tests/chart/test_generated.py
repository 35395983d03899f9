"""Files generated from the chart are committed up to date (CONVENTIONS.md, Do this 14)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.chart.helpers import ROOT


@pytest.mark.parametrize(
    ("script", "target"),
    [("render_manifests.py", "make manifests"), ("chart_readme.py", "make chart-docs")],
)
def test_generated_file_matches_the_chart(script: str, target: str) -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, f"out of date, run `{target}`:\n{check.stdout}{check.stderr}"
