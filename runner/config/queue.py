"""Queue-mode settings: from flags, then ``CRON_RUNNER_*``, then the defaults here (docs/queue.md,
docs/design.md).

Read only by queue mode's commands (an enqueueing run, ``worker``, ``dlq``); nothing here
imports Dramatiq.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from runner.config.rates import RateLimit, parse_rate_limit
from runner.config.settings import Settings
from runner.config.sources import Source, parse_duration
from runner.errors import ConfigError
from runner.tasks import QUEUE_NAME_RE, QueueOptions

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024
# Dramatiq's own defaults, except two. The poll interval bounds how late an idle worker
# notices a message or a due retry. The maintenance chance is the share of broker calls that
# also re-deliver the messages of workers dead for longer than the heartbeat timeout: at
# Dramatiq's 0.1%, an idle pool of two workers polling twice a second would take minutes to
# get to it; at 1% it takes seconds.
DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0
DEFAULT_MAINTENANCE_CHANCE = 0.01
DEFAULT_DEAD_MESSAGE_TTL_S = 7 * 24 * 3600.0
DEFAULT_POLL_INTERVAL_S = 0.5
DEFAULT_THREADS = 8
# Worker defaults for a task whose @task gives none. Dramatiq's own (20 retries, up to 7
# days apart, a 10-minute time limit) suit web jobs; a scheduled task that fails 3 times
# within an hour wants a person, and the dead-letter queue is where they look.
DEFAULT_RETRIES = 3
DEFAULT_MIN_BACKOFF_S = 15.0
DEFAULT_MAX_BACKOFF_S = 3600.0

_SIZE_RE = re.compile(r"^\s*([0-9]+)\s*(b|k|kb|kib|m|mb|mib)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {None: 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024,
               "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20}  # fmt: skip
SIZE_FORM = "a number of bytes, or with a unit: '65536', '64KiB', '1MiB'"
# Redis refuses a bulk string over 512 MiB (proto-max-bulk-len); no message can be larger.
MAX_MESSAGE_BYTES_LIMIT = 512 << 20
MAX_PROCESSES = 256
MAX_THREADS = 1024
MAX_RETRIES = 999_999_999
_NO_OVERRIDES = QueueOptions()


def parse_size(value: str, origin: str) -> int:
    match = _SIZE_RE.match(value)
    shown = value[:40]
    if not match:
        raise ConfigError(f"{origin}={shown!r} is not a size: expected {SIZE_FORM}")
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) > 12:  # over the limit in any unit; and int() refuses 4,300 digits or more
        raise ConfigError(f"{origin}={shown!r} is too large: expected at most 512MiB")
    size = int(digits) * _SIZE_UNITS[(match.group(2) or "").lower() or None]
    if size < 1024:
        raise ConfigError(f"{origin}={shown!r} is too small: expected at least 1KiB")
    if size > MAX_MESSAGE_BYTES_LIMIT:
        raise ConfigError(f"{origin}={shown!r} is too large: expected at most 512MiB")
    return size


@dataclass(frozen=True)
class QueueSettings:
    """Queue-mode settings, from flags then ``CRON_RUNNER_*`` then defaults (docs/queue.md)."""

    namespace: str = "cron-runner:queue:default"
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    maintenance_chance: float = DEFAULT_MAINTENANCE_CHANCE
    dead_message_ttl_s: float = DEFAULT_DEAD_MESSAGE_TTL_S
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    queues: tuple[str, ...] = ()
    processes: int = 1
    threads: int = DEFAULT_THREADS
    # The enqueueing CronJob's own queue, retries, time limit and rate limit (the chart's
    # per-task `queue`, `retries`, `timeLimit`, `rateLimit`): they ride in the message and win
    # over @task's.
    overrides: QueueOptions = _NO_OVERRIDES
    # A port for Dramatiq's own Prometheus metrics (its Prometheus middleware); None: off.
    metrics_port: int | None = None

    @property
    def heartbeat_timeout_ms(self) -> int:
        return int(self.heartbeat_timeout_s * 1000)

    @property
    def dead_message_ttl_ms(self) -> int:
        return int(self.dead_message_ttl_s * 1000)

    @property
    def maintenance_per_million(self) -> int:
        return round(self.maintenance_chance * 1_000_000)


def namespace_for(settings: Settings) -> str:
    """Dramatiq's key namespace: per key prefix and scope, like the task keys, so that two
    namespaces sharing a Redis never run each other's messages."""
    return f"{settings.lease.prefix}:queue:{settings.lease.scope}"


def refuse_cluster(settings: Settings) -> None:
    if settings.redis.cluster:
        raise ConfigError(
            "queue mode does not support Redis Cluster (CRON_RUNNER_REDIS_CLUSTER=true): "
            "Dramatiq's Redis broker keeps a queue's keys under no common hash tag and scans "
            "for dead workers' keys; point the queue at a single primary or a Sentinel setup"
        )


def _overrides(src: Source) -> QueueOptions:
    queue, queue_origin = src.get("QUEUE")
    if queue is not None and not QUEUE_NAME_RE.match(queue):
        raise ConfigError(
            f"{queue_origin}={queue[:70]!r} is not a queue name: expected a letter or '_' "
            "first, then letters, digits, '.', '_' or '-', at most 63 characters"
        )
    options = QueueOptions(
        queue=queue,
        max_retries=src.count("RETRIES_MAX", 0, MAX_RETRIES),
        min_backoff_s=src.optional_duration("RETRIES_MIN_BACKOFF", minimum_s=0.001),
        max_backoff_s=src.optional_duration("RETRIES_MAX_BACKOFF", minimum_s=0.001),
        time_limit_s=src.optional_duration("TIME_LIMIT", minimum_s=0.001),
        rate_limit=_rate_limit(src),
    )
    low, high = options.min_backoff_s, options.max_backoff_s
    if low is not None and high is not None and low > high:
        raise ConfigError(
            f"{src.get('RETRIES_MIN_BACKOFF')[1]} is above {src.get('RETRIES_MAX_BACKOFF')[1]}: "
            "the backoff grows from the minimum up to the maximum"
        )
    return options


def _rate_limit(src: Source) -> RateLimit | None:
    value, origin = src.get("RATE_LIMIT")
    return None if value is None else parse_rate_limit(value, origin)


def _whole(src: Source, name: str, default: int, minimum: int, maximum: int) -> int:
    value = src.count(name, minimum, maximum)
    return default if value is None else value


def load_queue_settings(
    settings: Settings, env: Mapping[str, str], flags: Mapping[str, str | None] | None = None
) -> QueueSettings:
    """Flags are keyed like the variables without ``CRON_RUNNER_`` (``{"WORKER_THREADS": "4"}``)."""
    src = Source(env, flags or {})
    size_raw, size_origin = src.get("MAX_MESSAGE_SIZE")
    chance_raw, chance_origin = src.get("QUEUE_MAINTENANCE_CHANCE")
    chance = DEFAULT_MAINTENANCE_CHANCE
    if chance_raw is not None:
        try:
            chance = float(chance_raw)
        except ValueError:
            chance = -1.0
        if not 0 < chance <= 1:
            raise ConfigError(
                f"{chance_origin}={chance_raw!r} is not valid: expected a probability in (0, 1], "
                "e.g. 0.001"
            )
    queues_raw, queues_origin = src.get("WORKER_QUEUES")
    queues = tuple(q.strip() for q in (queues_raw or "").replace(" ", ",").split(",") if q.strip())
    for queue in queues:
        if not QUEUE_NAME_RE.match(queue):
            raise ConfigError(
                f"{queues_origin}: queue {queue!r} is not valid: expected a letter or '_' first, "
                "then letters, digits, '.', '_' or '-'"
            )
    dead_ttl_raw, dead_ttl_origin = src.get("QUEUE_DEAD_MESSAGE_TTL")
    return QueueSettings(
        namespace=namespace_for(settings),
        max_message_bytes=(
            parse_size(size_raw, size_origin) if size_raw is not None else DEFAULT_MAX_MESSAGE_BYTES
        ),
        heartbeat_timeout_s=src.duration(
            "QUEUE_HEARTBEAT_TIMEOUT", DEFAULT_HEARTBEAT_TIMEOUT_S, minimum_s=1.0
        ),
        maintenance_chance=chance,
        dead_message_ttl_s=(
            parse_duration(dead_ttl_raw, dead_ttl_origin)
            if dead_ttl_raw is not None
            else DEFAULT_DEAD_MESSAGE_TTL_S
        ),
        poll_interval_s=src.duration("WORKER_POLL_INTERVAL", DEFAULT_POLL_INTERVAL_S),
        queues=queues,
        processes=_whole(src, "WORKER_PROCESSES", 1, 1, MAX_PROCESSES),
        threads=_whole(src, "WORKER_THREADS", DEFAULT_THREADS, 1, MAX_THREADS),
        overrides=_overrides(src),
        metrics_port=src.count("WORKER_METRICS_PORT", 1, 65535),
    )
