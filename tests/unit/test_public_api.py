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


def test_run_context_is_compared_and_shown_by_its_fields() -> None:
    import logging  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from runner import RunContext  # noqa: PLC0415

    logger = logging.LoggerAdapter(logging.getLogger("runner"))
    event = threading.Event()
    ctx = RunContext("report", 60, 7, "pod-a", logger, event)
    assert ctx == RunContext(task="report", slot=60, fencing_token=7, holder="pod-a",
                             logger=logger, cancelled=event, lease_valid=ctx.lease_valid)  # fmt: skip
    assert ctx != RunContext("report", 120, 7, "pod-a", logger, event)
    assert ctx.payload == {} and ctx.cancel_reason == "" and ctx.lease_valid()
    assert repr(ctx).startswith(
        "RunContext(task='report', slot=60, fencing_token=7, holder='pod-a',"
    )
    assert RunContext.__hash__ is None
    ctx.cancel("lease lost")
    assert (ctx.cancelled.is_set(), ctx.cancel_reason) == (True, "lease lost")


def test_importing_a_submodule_does_not_load_the_task_registry() -> None:
    code = "import sys, runner.cli.main; print('runner.tasks' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
