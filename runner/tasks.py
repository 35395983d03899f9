"""Tasks: the ``@task`` decorator, ``RunContext``, and the registry built from modules and entry points.

The decorator only marks a function; the registry is built by scanning modules, so
there is no global mutable registry for tests to reset.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from runner.errors import Cancelled, ConfigError, UnknownTask
from runner.keys import validate_name

ENTRY_POINT_GROUP = "cron_runner.tasks"
_MARK = "__cron_runner_task__"

TaskFn = Callable[["RunContext"], None]


def task(name: str) -> Callable[[TaskFn], TaskFn]:
    """Register ``fn(ctx: RunContext) -> None`` under ``name``."""
    validate_name("task name", name)

    def mark(fn: TaskFn) -> TaskFn:
        setattr(fn, _MARK, name)
        return fn

    return mark


@dataclass
class RunContext:
    """What a running task knows about its run. Loop with ``ctx.check()`` between units of work."""

    task: str
    slot: int | None
    fencing_token: int
    holder: str
    logger: logging.LoggerAdapter[logging.Logger]
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Consulted by check() on the caller's own thread, so a task resumed after a pause
    # sees its deadline even before the keeper thread has run.
    lease_valid: Callable[[], bool] = lambda: True
    cancel_reason: str = ""

    @property
    def slot_time(self) -> datetime | None:
        return None if self.slot is None else datetime.fromtimestamp(self.slot, UTC)

    def cancel(self, reason: str) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()

    def check(self) -> None:
        """Raise ``Cancelled`` if the lease is lost or shutdown was requested."""
        if not self.cancelled.is_set() and not self.lease_valid():
            self.cancel("lease lost")
        if self.cancelled.is_set():
            raise Cancelled(self.cancel_reason or "cancelled")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    fn: TaskFn
    source: str


def _marked(module: ModuleType) -> Iterable[tuple[str, TaskFn]]:
    for value in vars(module).values():
        name = getattr(value, _MARK, None)
        if isinstance(name, str) and callable(value):
            yield name, value


def _import(module_name: str, origin: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{origin}: cannot import module {module_name!r}: {exc}") from exc


def load_reference(ref: str, origin: str = "task reference") -> TaskFn:
    """Resolve ``package.module:function``."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{origin} {ref!r} is not valid: expected 'package.module:function'")
    target: Any = _import(module_name, origin)
    for part in attr.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise ConfigError(f"{origin} {ref!r}: no callable {attr!r} in module {module_name!r}")
    fn: TaskFn = target
    return fn


class Registry:
    def __init__(self) -> None:
        self._tasks: dict[str, TaskSpec] = {}

    def add(self, name: str, fn: TaskFn, source: str) -> None:
        existing = self._tasks.get(name)
        if existing is not None and existing.fn is not fn:
            raise ConfigError(
                f"task {name!r} is registered twice: by {existing.source} and by {source}"
            )
        self._tasks[name] = TaskSpec(name, fn, source)

    def add_module(self, module: ModuleType, source: str) -> None:
        for name, fn in _marked(module):
            self.add(name, fn, f"{source} ({module.__name__}.{fn.__name__})")

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def specs(self) -> list[TaskSpec]:
        return [self._tasks[n] for n in self.names()]

    def resolve(self, name: str) -> TaskSpec:
        """A registered name, or a ``package.module:function`` reference."""
        if name in self._tasks:
            return self._tasks[name]
        if ":" in name:
            fn = load_reference(name)
            task_name = getattr(fn, _MARK, None) or fn.__name__.replace("_", "-")
            return TaskSpec(task_name, fn, f"reference {name}")
        known = ", ".join(self.names()) or "none registered"
        raise UnknownTask(f"unknown task {name!r}; known tasks: {known}")

    @classmethod
    def discover(cls, modules: Iterable[str] = (), *, use_entry_points: bool = True) -> Registry:
        """Tasks from CRON_RUNNER_TASK_MODULES and from the ``cron_runner.tasks`` entry points."""
        registry = cls()
        for module_name in modules:
            registry.add_module(_import(module_name, "CRON_RUNNER_TASK_MODULES"), "module")
        if use_entry_points:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                origin = f"entry point {ep.name} = {ep.value}"
                if ":" in ep.value:
                    registry.add(ep.name, load_reference(ep.value, origin), origin)
                else:
                    registry.add_module(_import(ep.value, origin), origin)
        return registry
