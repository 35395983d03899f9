"""The import paths the README gives users survive the package layout (issue 15)."""

from __future__ import annotations

import subprocess
import sys


def test_the_documented_imports_resolve() -> None:
    from runner import RunContext, task  # noqa: PLC0415
    from runner.queue import Producer  # noqa: PLC0415

    assert callable(task)
    assert RunContext.__name__ == "RunContext"
    assert Producer.__module__ == "runner.queue.producer"


def test_importing_the_queue_package_does_not_load_the_producer() -> None:
    code = "import sys, runner.queue.stats; print('runner.queue.producer' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
