"""Tasks: the ``@task`` decorator, ``RunContext``, and the registry built from modules and entry points.

The decorator only marks a function; the registry is built by scanning modules, so
there is no global mutable registry for tests to reset.
"""

# No `from __future__ import annotations` here: typing.NamedTuple turns each string
# annotation into a ForwardRef, compiling it, which made creating these classes take about
# twice as long at every start (bench/README.md, Cold start).

import importlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from runner.config.settings import CATCHUPS, OVERLAPS
from runner.config.sources import parse_duration
from runner.errors import Cancelled, ConfigError, UnknownTask
from runner.keys import validate_name

if TYPE_CHECKING:
    from runner.config.rates import RateLimit

ENTRY_POINT_GROUP = "cron_runner.tasks"
_MARK = "__cron_runner_task__"
_QUEUE_MARK = "__cron_runner_queue__"
_RUN_MARK = "__cron_runner_run__"
_CATCHUP_MARK = "__cron_runner_catchup__"
# Dramatiq's rule for queue names; the default queue is the task's own name.
QUEUE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,62}\Z")

TaskFn = Callable[["RunContext"], None]
Duration = str | float | int


class QueueOptions(NamedTuple):
    """How queue mode sends and retries a task (CRON_RUNNER_MODE=enqueue, ``cron-runner worker``).

    They live with the code because the CronJob that enqueues and the worker that runs
    both import it. ``None`` means the worker's default (runner/config/queue.py).
    """

    queue: str | None = None
    max_retries: int | None = None
    min_backoff_s: float | None = None
    max_backoff_s: float | None = None
    time_limit_s: float | None = None
    rate_limit: "RateLimit | None" = None


class RunOptions(NamedTuple):
    """How the task's runs share the lease, given to ``@task``: the defaults of settings that a
    flag or a ``CRON_RUNNER_*`` variable (the chart's per-task values) still overrides.
    ``None``: not given."""

    overlap: str | None = None
    overlap_wait_s: float | None = None
    pause_on_failures: int | None = None


class CatchupOptions(NamedTuple):
    """The task's catch-up, given to ``@task`` (docs/design.md, Catch-up, trigger and backfill):
    the defaults of settings that a flag or a ``CRON_RUNNER_*`` variable still overrides.
    ``None``: not given."""

    catchup: str | None = None
    catchup_window_s: float | None = None


def _seconds(what: str, value: Duration | None) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value, what) if isinstance(value, str) else float(value)
    if seconds <= 0:
        raise ConfigError(f"{what}={value!r} must be positive")
    return seconds


def _rate_limit(text: str, what: str) -> "RateLimit":
    # Queue mode's only: a run's start does not import the rate parser.
    from runner.config.rates import parse_rate_limit  # noqa: PLC0415

    return parse_rate_limit(text, what)


def task(
    name: str,
    *,
    queue: str | None = None,
    retries: int | None = None,
    min_backoff: Duration | None = None,
    max_backoff: Duration | None = None,
    time_limit: Duration | None = None,
    overlap: str | None = None,
    overlap_wait: Duration | None = None,
    catchup: str | None = None,
    catchup_window: Duration | None = None,
    rate_limit: str | None = None,
    pause_on_failures: int | None = None,
) -> Callable[[TaskFn], TaskFn]:
    """Register ``fn(ctx: RunContext) -> None`` under ``name``.

    The keyword options matter only in queue mode: the queue its messages go to (default:
    the task name), how often a failed run is retried (``retries``) with exponential backoff
    and jitter between ``min_backoff`` and ``max_backoff``, and the worker's ``time_limit``
    for one run. Durations are seconds or strings such as ``'30s'``, ``'5m'``. ``rate_limit``
    (``'10/1m'``): at most that many starts of the task in any such window, across all workers.

    ``overlap`` is what a run does when an earlier slot still holds the lease (skip,
    buffer-one, replace, allow-other-slots; docs/design.md, Overlap policies), and
    ``overlap_wait`` how long buffer-one and replace wait; CRON_RUNNER_OVERLAP and
    CRON_RUNNER_OVERLAP_WAIT (or --overlap, --overlap-wait) win over them.

    ``catchup`` (none, latest, all) and ``catchup_window``: what a run does with earlier slots
    of its schedule that never ran, within the window (docs/design.md, Catch-up, trigger and
    backfill); CRON_RUNNER_CATCHUP and CRON_RUNNER_CATCHUP_WINDOW (or --catchup, --catchup-window) win.

    ``pause_on_failures``: pause the task everywhere after this many consecutive failures
    (0: never; docs/design.md, Pause); CRON_RUNNER_PAUSE_ON_FAILURES (or --pause-on-failures)
    wins over it.
    """
    validate_name("task name", name)
    if queue is not None and not QUEUE_NAME_RE.match(queue):
        raise ConfigError(
            f"task {name!r}: queue={queue!r} is not valid: expected a letter or '_' first, "
            "then letters, digits, '.', '_' or '-'"
        )
    if retries is not None and retries < 0:
        raise ConfigError(f"task {name!r}: retries={retries!r} must be 0 or more")
    options = QueueOptions(
        queue=queue,
        max_retries=retries,
        min_backoff_s=_seconds(f"task {name!r}: min_backoff", min_backoff),
        max_backoff_s=_seconds(f"task {name!r}: max_backoff", max_backoff),
        time_limit_s=_seconds(f"task {name!r}: time_limit", time_limit),
        rate_limit=None
        if rate_limit is None
        else _rate_limit(rate_limit, f"task {name!r}: rate_limit"),
    )
    low, high = options.min_backoff_s, options.max_backoff_s
    if low is not None and high is not None and low > high:
        raise ConfigError(f"task {name!r}: min_backoff is above max_backoff")
    if overlap is not None and overlap not in OVERLAPS:
        raise ConfigError(
            f"task {name!r}: overlap={overlap!r} is not valid: expected one of {', '.join(OVERLAPS)}"
        )
    catching_up = _catchup_options(name, catchup, catchup_window)
    if pause_on_failures is not None and (
        isinstance(pause_on_failures, bool)
        or not isinstance(pause_on_failures, int)
        or pause_on_failures < 0
    ):
        raise ConfigError(
            f"task {name!r}: pause_on_failures={pause_on_failures!r} is not valid: expected how "
            "many consecutive failures pause the task, a whole number, or 0 for never"
        )
    run = RunOptions(
        overlap, _seconds(f"task {name!r}: overlap_wait", overlap_wait), pause_on_failures
    )

    def mark(fn: TaskFn) -> TaskFn:
        setattr(fn, _MARK, name)
        setattr(fn, _QUEUE_MARK, options)
        setattr(fn, _RUN_MARK, run)
        setattr(fn, _CATCHUP_MARK, catching_up)
        return fn

    return mark


def queue_options(fn: TaskFn) -> QueueOptions:
    """The queue options given to ``@task``, or the defaults for an undecorated function."""
    options = getattr(fn, _QUEUE_MARK, None)
    return options if isinstance(options, QueueOptions) else QueueOptions()


def run_options(fn: TaskFn) -> RunOptions:
    """The run options given to ``@task``, or none for an undecorated function."""
    options = getattr(fn, _RUN_MARK, None)
    return options if isinstance(options, RunOptions) else RunOptions()


def _catchup_options(name: str, catchup: str | None, window: Duration | None) -> CatchupOptions:
    if catchup is not None and catchup not in CATCHUPS:
        raise ConfigError(
            f"task {name!r}: catchup={catchup!r} is not valid: expected one of {', '.join(CATCHUPS)}"
        )
    window_s = None
    if window is not None:
        what = f"task {name!r}: catchup_window"
        window_s = parse_duration(window, what) if isinstance(window, str) else float(window)
        if window_s < 0:
            raise ConfigError(f"{what}={window!r} is negative: expected a duration >= 0")
    return CatchupOptions(catchup, window_s)


def catchup_options(fn: TaskFn) -> CatchupOptions:
    """The catch-up given to ``@task``, or none for an undecorated function."""
    options = getattr(fn, _CATCHUP_MARK, None)
    return options if isinstance(options, CatchupOptions) else CatchupOptions()


class RunContext:
    """What a running task knows about its run. Loop with ``ctx.check()`` between units of work.

    ``lease_valid`` is consulted by ``check()`` on the caller's own thread, so a task resumed
    after a pause sees its deadline even before the keeper thread has run. ``payload``: in
    queue mode, the JSON object the message carried (references, not big objects).

    Compared and shown field by field, like the dataclass it was: a plain class because every
    run builds one, and creating a dataclass costs ~1 ms of start-up (bench/README.md).
    """

    __hash__ = None  # type: ignore[assignment]  # mutable and compared by value

    def __init__(  # noqa: PLR0917 - the dataclass's signature, positional fields included
        self,
        task: str,
        slot: int | None,
        fencing_token: int,
        holder: str,
        logger: logging.LoggerAdapter[logging.Logger],
        cancelled: threading.Event | None = None,
        lease_valid: Callable[[], bool] = lambda: True,
        cancel_reason: str = "",
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        self.task = task
        self.slot = slot
        self.fencing_token = fencing_token
        self.holder = holder
        self.logger = logger
        self.cancelled = threading.Event() if cancelled is None else cancelled
        self.lease_valid = lease_valid
        self.cancel_reason = cancel_reason
        self.payload: Mapping[str, Any] = {} if payload is None else payload

    _FIELDS = ("task", "slot", "fencing_token", "holder", "logger", "cancelled", "lease_valid",
               "cancel_reason", "payload")  # fmt: skip

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunContext) or other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._FIELDS)
        return f"{type(self).__qualname__}({shown})"

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


class TaskSpec(NamedTuple):
    name: str
    fn: TaskFn
    source: str


def _marked(module: ModuleType) -> Iterable[tuple[str, TaskFn]]:
    for value in vars(module).values():
        name = getattr(value, _MARK, None)
        if isinstance(name, str) and callable(value):
            yield name, value


def _working_directory_on_path() -> str | None:
    """Make the working directory importable, as ``python -m`` does: a console script's
    ``sys.path`` starts at its own bin/, so ``./hello_tasks.py`` was not found. Last, not
    first as with ``python -m``: an installed package of the same name still wins."""
    try:
        cwd = os.getcwd()  # noqa: PTH109 - a str for sys.path, and Path adds an import
    except OSError:  # the directory was removed under us
        return None
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    return cwd


def _import(module_name: str, origin: str) -> ModuleType:
    cwd = _working_directory_on_path()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        hint = ""
        if exc.name == module_name.partition(".")[0]:
            hint = (
                f" (searched the working directory {cwd} and sys.path: run from the directory "
                "that holds it, or set PYTHONPATH to that directory, or install its package)"
            )
        raise ConfigError(f"{origin}: cannot import module {module_name!r}: {exc}{hint}") from exc
    except (ImportError, TypeError, ValueError) as exc:  # '..' is a relative import: TypeError
        raise ConfigError(f"{origin}: cannot import module {module_name!r}: {exc}") from exc
    except SyntaxError as exc:
        raise ConfigError(
            f"{origin}: module {module_name!r} has a syntax error: {exc.msg} "
            f"({exc.filename}, line {exc.lineno})"
        ) from exc
    except Exception as exc:
        raise ConfigError(
            f"{origin}: module {module_name!r} raised while being imported: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


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
    def discover(cls, modules: Iterable[str] = (), *, use_entry_points: bool = True) -> "Registry":
        """Tasks from CRON_RUNNER_TASK_MODULES and from the ``cron_runner.tasks`` entry points."""
        registry = cls()
        for module_name in modules:
            registry.add_module(_import(module_name, "CRON_RUNNER_TASK_MODULES"), "module")
        if use_entry_points:
            from importlib.metadata import entry_points  # noqa: PLC0415 - `run` and `tasks` only

            for ep in entry_points(group=ENTRY_POINT_GROUP):
                origin = f"entry point {ep.name} = {ep.value}"
                if ":" in ep.value:
                    registry.add(ep.name, load_reference(ep.value, origin), origin)
                else:
                    registry.add_module(_import(ep.value, origin), origin)
        return registry
