"""Which queue a task's messages go to, and which options they carry: the enqueueing
CronJob's (CRON_RUNNER_QUEUE, _RETRIES_*, _TIME_LIMIT, _RATE_LIMIT, and its run's overlap
policy and pause on failures), else the task's ``@task(...)``, else the worker's defaults
(docs/design.md, Queue mode).

Plain functions over the registry and settings; no Dramatiq, no Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from runner.config.queue import DEFAULT_MAX_BACKOFF_S, DEFAULT_MIN_BACKOFF_S, DEFAULT_RETRIES
from runner.config.rates import RateLimit, parse_rate_limit
from runner.config.settings import OVERLAPS, SKIP
from runner.errors import ConfigError
from runner.tasks import QUEUE_NAME_RE, QueueOptions, Registry, TaskSpec, queue_options

# The message options a worker reads besides Dramatiq's own: Dramatiq keeps options it does
# not know, and a worker of an earlier release ignores them.
OVERLAP = "overlap"
OVERLAP_WAIT_MS = "overlap_wait"
RATE_LIMIT = "rate_limit"
PAUSE_ON_FAILURES = "pause_on_failures"
# A slot the user asked for (backfilled, or caught up): a worker waits for its turn at the
# lease (the message goes back with a delay) instead of skipping it while another slot runs.
WAIT_TURN = "wait_turn"


def queue_of(spec: TaskSpec) -> str:
    """The queue a task's messages go to: its ``@task(queue=...)``, else its own name."""
    queue = queue_options(spec.fn).queue or spec.name
    if not QUEUE_NAME_RE.match(queue):
        raise ConfigError(
            f"task {spec.name!r}: its name cannot be a queue name (it must start with a letter "
            "or '_'): give it one with @task(..., queue='name')"
        )
    return queue


def registered_queue(registry: Registry, task: str) -> str | None:
    """The queue of a registered task (``queue_of``); None when it is not registered."""
    return queue_of(registry.resolve(task)) if task in registry.names() else None


def effective_options(spec: TaskSpec, overrides: QueueOptions) -> QueueOptions:
    """What the worker applies to ``spec``'s message: the enqueueing CronJob's settings, else
    the task's ``@task`` options, else the worker's defaults (no time limit)."""
    declared = queue_options(spec.fn)

    def first(*values: float | None) -> float | None:
        return next((v for v in values if v is not None), None)

    retries = first(overrides.max_retries, declared.max_retries, DEFAULT_RETRIES)
    return QueueOptions(
        queue=overrides.queue or declared.queue or spec.name,
        max_retries=None if retries is None else int(retries),
        min_backoff_s=first(overrides.min_backoff_s, declared.min_backoff_s, DEFAULT_MIN_BACKOFF_S),
        max_backoff_s=first(overrides.max_backoff_s, declared.max_backoff_s, DEFAULT_MAX_BACKOFF_S),
        time_limit_s=first(overrides.time_limit_s, declared.time_limit_s),
        rate_limit=overrides.rate_limit or declared.rate_limit,
    )


def check_backoff(spec: TaskSpec, overrides: QueueOptions) -> None:
    """One bound from the environment and the other from @task or the worker's default can
    cross: refuse that here rather than let Dramatiq quietly cap every delay at the maximum."""
    applied = effective_options(spec, overrides)
    assert applied.min_backoff_s is not None and applied.max_backoff_s is not None
    if applied.min_backoff_s > applied.max_backoff_s:
        raise ConfigError(
            f"task {spec.name!r}: the minimum retry backoff ({applied.min_backoff_s:g}s) is above "
            f"the maximum ({applied.max_backoff_s:g}s): set CRON_RUNNER_RETRIES_MIN_BACKOFF and "
            "CRON_RUNNER_RETRIES_MAX_BACKOFF together (the chart's retries.minBackoff and "
            "retries.maxBackoff)"
        )


def message_options(
    overrides: QueueOptions,
    *,
    overlap: str = SKIP,
    overlap_wait_s: float | None = None,
    pause_on_failures: int = 0,
) -> dict[str, int | str]:
    """Per-message options in Dramatiq's units, read by its Retries and TimeLimit middleware
    before the actor's own (dramatiq/middleware/retries.py, time_limit.py); and ours, read by
    the worker (``job_policy``): the rate limit, the overlap policy unless it is skip, and the
    pause after consecutive failures when there is one, so a default task's message is what
    it was."""
    options: dict[str, int | str] = {}
    if overrides.max_retries is not None:
        options["max_retries"] = overrides.max_retries
    for key, seconds in (("min_backoff", overrides.min_backoff_s),
                         ("max_backoff", overrides.max_backoff_s),
                         ("time_limit", overrides.time_limit_s),
                         (OVERLAP_WAIT_MS, overlap_wait_s if overlap != SKIP else None)):  # fmt: skip
        if seconds is not None:
            options[key] = max(1, round(seconds * 1000))
    if overrides.rate_limit is not None:
        options[RATE_LIMIT] = str(overrides.rate_limit)
    if overlap != SKIP:
        options[OVERLAP] = overlap
    if pause_on_failures > 0:
        options[PAUSE_ON_FAILURES] = pause_on_failures
    return options


class JobPolicy(NamedTuple):
    """How a worker runs one message of a task: the overlap policy of the task's lease, how
    long buffer-one and replace wait (None: the worker's default), the rate limit, and after
    how many consecutive failures the task is paused (0: never)."""

    overlap: str = SKIP
    overlap_wait_s: float | None = None
    rate_limit: RateLimit | None = None
    pause_on_failures: int = 0
    wait_turn: bool = False


def job_policy(options: Mapping[str, Any], spec: TaskSpec) -> JobPolicy:
    """The message's own options (the enqueueing CronJob's), else the task's ``@task``'s.

    A message from a newer release may name a policy this worker does not know: it is refused
    rather than run under another one."""
    overlap = options.get(OVERLAP, SKIP)
    if overlap not in OVERLAPS:
        raise ConfigError(
            f"message option {OVERLAP}={str(overlap)[:40]!r} is not a policy this worker knows "
            f"({', '.join(OVERLAPS)}): upgrade the workers"
        )
    wait_ms = options.get(OVERLAP_WAIT_MS)
    rate = options.get(RATE_LIMIT)
    return JobPolicy(
        overlap=str(overlap),
        overlap_wait_s=int(wait_ms) / 1000 if wait_ms is not None else None,
        rate_limit=parse_rate_limit(str(rate), f"message option {RATE_LIMIT}")
        if rate is not None
        else queue_options(spec.fn).rate_limit,
        pause_on_failures=int(options.get(PAUSE_ON_FAILURES, 0)),
        wait_turn=bool(options.get(WAIT_TURN)),
    )
