"""The start of a run the CLI asks for (run, exec, trigger): its observers, its Redis client
and its Execution, and what a command's definition is. Imported on every run's start: what
only some runs need is imported where it is used."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.config.settings import Settings
    from runner.run.execution import Asked
    from runner.run.observer import RunObserver
    from runner.run.targets import Target

log = logging.getLogger("runner")


def command_definition(argv: list[str]) -> str:
    """The program by name, not its arguments: a crontab line's `--date=$(date +%F)` must not
    change the definition every day, and arguments may hold secrets (the definition is stored
    in Redis and shown in errors). What can run a slot twice is the schedule and the zone."""
    return f"exec {os.path.basename(argv[0])}"  # noqa: PTH119


def execute(
    settings: Settings, task_name: str, target: Target, what: str, asked: Asked | None = None
) -> int:
    """One run of ``target`` under the task's lease, stopped by any stop signal: its exit code."""
    from runner.lease import store  # noqa: PLC0415
    from runner.run.execution import Execution  # noqa: PLC0415
    from runner.signals import Shutdown  # noqa: PLC0415

    shutdown = Shutdown().install()
    observer = run_observer(settings, task_name)
    client = store.connect(settings.redis, settings.lease.ttl_s)
    try:
        result = Execution(
            settings, client, task_name, target, shutdown, observer=observer, what=what,
            asked=asked,
        ).run()  # fmt: skip
    finally:
        client.close()
        observer.close()
    return result.exit_code


def run_observer(settings: Settings, task_name: str) -> RunObserver:
    """Telemetry and pings, each only when configured."""
    observer = _telemetry_observer(settings, task_name)
    if settings.run.ping_url is None:
        return observer
    from runner.run.observer import Observers, PingHook  # noqa: PLC0415

    return Observers(observer, PingHook(settings.run.ping_url, settings.run.ping_timeout_s))


def _telemetry_observer(settings: Settings, task_name: str) -> RunObserver:
    """Telemetry when an OTLP endpoint is set; otherwise nothing of OpenTelemetry is imported."""
    from runner.run.observer import NullObserver  # noqa: PLC0415

    if not settings.telemetry.enabled:
        return NullObserver()
    try:
        from runner.run.telemetry import RunTelemetry  # noqa: PLC0415 - heavy, and optional
    except ImportError as exc:
        log.warning(
            "telemetry: an OTLP endpoint is set but OpenTelemetry is not installed "
            "(pip install 'redis-cron-runner[telemetry]'); running without it: %s",
            exc,
            extra={"event": "telemetry_unavailable"},
        )
        return NullObserver()
    return RunTelemetry(settings.telemetry, task_name, settings.lease.holder)
