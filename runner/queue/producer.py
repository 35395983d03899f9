"""Queue mode (seed 001): the CronJob enqueues ONE message per slot, Dramatiq workers run it.

The enterprise shape: the distributed cron only decides *that* a slot fires, under the same
lease as a run; a pool of workers does the work with retries (exponential backoff with
jitter), a dead-letter queue and a graceful stop. Dramatiq's Redis broker is the queue; this
module is the integration: settings, the message for a slot, an idempotent send, the enqueue
target, queue statistics and the dead-letter queue.

Dramatiq is imported only inside the functions that send or retry messages, so that neither
`cron-runner run` in run mode nor `status` pays for it (a CronJob pod starts cold every time).

Dramatiq's Redis layout (dramatiq/brokers/redis/dispatch.lua), under the namespace
``{prefix}:queue:{scope}``: ``NS:Q`` (list of ids waiting), ``NS:Q.msgs`` (id -> message,
waiting and in flight), ``NS:Q.DQ``/``NS:Q.DQ.msgs`` (delayed: retries in their backoff),
``NS:Q.XQ``/``NS:Q.XQ.msgs`` (dead letters, scored by when), ``NS:__acks__.<worker>.<Q>``
(fetched, not yet acknowledged) and ``NS:__heartbeats__``.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError

from runner import clock
from runner.config.settings import Settings, _Source, _whole_number, parse_duration
from runner.errors import ConfigError, UnknownTask
from runner.keys import TaskKeys
from runner.outcomes import ENQUEUED
from runner.run.targets import PythonTarget
from runner.tasks import (
    QUEUE_NAME_RE,
    QueueOptions,
    Registry,
    RunContext,
    TaskSpec,
    queue_options,
)

if TYPE_CHECKING:
    from dramatiq import Message as _Message
    from dramatiq.brokers.redis import RedisBroker

    Message = _Message[Any]

log = logging.getLogger("runner.queue")

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


class MessageTooLarge(ConfigError):
    """A message over CRON_RUNNER_MAX_MESSAGE_SIZE: the payload should carry a reference."""

    def __init__(self, task: str, size: int, limit: int) -> None:
        super().__init__(
            f"the message for task {task!r} is {size:,} bytes, over the {limit:,}-byte limit "
            "(CRON_RUNNER_MAX_MESSAGE_SIZE): put a reference in the payload (an id, a key, a "
            "URL) and let the task load the data, instead of the data itself"
        )
        self.size = size
        self.limit = limit


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
    """Queue-mode settings, from flags then ``CRON_RUNNER_*`` then defaults (README, Queue mode)."""

    namespace: str = "cron-runner:queue:default"
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    maintenance_chance: float = DEFAULT_MAINTENANCE_CHANCE
    dead_message_ttl_s: float = DEFAULT_DEAD_MESSAGE_TTL_S
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    queues: tuple[str, ...] = ()
    processes: int = 1
    threads: int = DEFAULT_THREADS
    # The enqueueing CronJob's own queue, retries and time limit (the chart's per-task
    # `queue`, `retries`, `timeLimit`): they ride in the message and win over @task's.
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


def _count(src: _Source, name: str, minimum: int, maximum: int) -> int | None:
    value, origin = src.get(name)
    if value is None:
        return None
    if not _whole_number(value) or not minimum <= int(value) <= maximum:
        raise ConfigError(
            f"{origin}={value[:40]!r} is not valid: expected a whole number from {minimum} to "
            f"{maximum}"
        )
    return int(value)


def _whole(src: _Source, name: str, default: int, minimum: int, maximum: int) -> int:
    value = _count(src, name, minimum, maximum)
    return default if value is None else value


def _optional_duration(src: _Source, name: str) -> float | None:
    if src.get(name)[0] is None:
        return None
    return src.duration(name, 0.0, minimum_s=0.001)


def _overrides(src: _Source) -> QueueOptions:
    queue, queue_origin = src.get("QUEUE")
    if queue is not None and not QUEUE_NAME_RE.match(queue):
        raise ConfigError(
            f"{queue_origin}={queue[:70]!r} is not a queue name: expected a letter or '_' "
            "first, then letters, digits, '.', '_' or '-', at most 63 characters"
        )
    options = QueueOptions(
        queue=queue,
        max_retries=_count(src, "RETRIES_MAX", 0, MAX_RETRIES),
        min_backoff_s=_optional_duration(src, "RETRIES_MIN_BACKOFF"),
        max_backoff_s=_optional_duration(src, "RETRIES_MAX_BACKOFF"),
        time_limit_s=_optional_duration(src, "TIME_LIMIT"),
    )
    low, high = options.min_backoff_s, options.max_backoff_s
    if low is not None and high is not None and low > high:
        raise ConfigError(
            f"{src.get('RETRIES_MIN_BACKOFF')[1]} is above {src.get('RETRIES_MAX_BACKOFF')[1]}: "
            "the backoff grows from the minimum up to the maximum"
        )
    return options


def load_queue_settings(
    settings: Settings, env: Mapping[str, str], flags: Mapping[str, str | None] | None = None
) -> QueueSettings:
    """Flags are keyed like the variables without ``CRON_RUNNER_`` (``{"WORKER_THREADS": "4"}``)."""
    src = _Source(env, flags or {})
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
        metrics_port=_count(src, "WORKER_METRICS_PORT", 1, 65535),
    )


def refuse_cluster(settings: Settings) -> None:
    if settings.redis.cluster:
        raise ConfigError(
            "queue mode does not support Redis Cluster (CRON_RUNNER_REDIS_CLUSTER=true): "
            "Dramatiq's Redis broker keeps a queue's keys under no common hash tag and scans "
            "for dead workers' keys; point the queue at a single primary or a Sentinel setup"
        )


def queue_of(spec: TaskSpec) -> str:
    """The queue a task's messages go to: its ``@task(queue=...)``, else its own name."""
    queue = queue_options(spec.fn).queue or spec.name
    if not QUEUE_NAME_RE.match(queue):
        raise ConfigError(
            f"task {spec.name!r}: its name cannot be a queue name (it must start with a letter "
            "or '_'): give it one with @task(..., queue='name')"
        )
    return queue


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
    )


def message_options(overrides: QueueOptions) -> dict[str, int]:
    """Per-message options in Dramatiq's units, read by its Retries and TimeLimit middleware
    before the actor's own (dramatiq/middleware/retries.py, time_limit.py)."""
    options: dict[str, int] = {}
    if overrides.max_retries is not None:
        options["max_retries"] = overrides.max_retries
    for key, seconds in (("min_backoff", overrides.min_backoff_s),
                         ("max_backoff", overrides.max_backoff_s),
                         ("time_limit", overrides.time_limit_s)):  # fmt: skip
        if seconds is not None:
            options[key] = max(1, round(seconds * 1000))
    return options


def message_id_for(scope: str, task: str, slot: int | None, fence: int) -> str:
    """The same id for every replica and every retry of one slot's Job: a retried Job that
    already enqueued finds it taken. A manual run (no slot) gets one per acquisition."""
    which = str(slot) if slot is not None else f"manual:{fence}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"cron-runner:{scope}:{task}:{which}"))


def sent_key(keys: TaskKeys, message_id: str) -> str:
    """Set with the enqueue, in the same transaction: the send is idempotent per message id."""
    return f"{keys.base}:sent:{message_id}"


# -- sending (Dramatiq imported lazily) -----------------------------------------------------

# The dispatch script unpacks at most this many ids at once; an enqueue unpacks none.
_UNPACK = 4000


def make_broker(client: Any, qs: QueueSettings, middleware: Sequence[Any] = ()) -> RedisBroker:
    from dramatiq.brokers.redis import RedisBroker  # noqa: PLC0415 - queue mode only

    return RedisBroker(
        client=client,
        namespace=qs.namespace,
        middleware=list(middleware),
        heartbeat_timeout=qs.heartbeat_timeout_ms,
        dead_message_ttl=qs.dead_message_ttl_ms,
        maintenance_chance=qs.maintenance_per_million,
    )


def build_message(
    task: str,
    queue: str,
    *,
    slot: int | None,
    fence: int,
    payload: Mapping[str, Any] | None,
    message_id: str | None,
    limit_bytes: int | None,
    options: Mapping[str, Any] | None = None,
) -> Message:
    from dramatiq import Message as DramatiqMessage  # noqa: PLC0415
    from dramatiq.message import generate_unique_id  # noqa: PLC0415

    message: Message = DramatiqMessage(
        queue_name=queue,
        actor_name=task,
        args=(),
        kwargs={"slot": slot, "fence": fence, "payload": dict(payload or {})},
        options=dict(options or {}),
        message_id=message_id or generate_unique_id(),
        message_timestamp=int(clock.wall() * 1000),
    )
    if limit_bytes is not None:
        _check_size(message, message.encode(), limit_bytes)
    return message


def _check_size(message: Message, data: bytes, limit_bytes: int) -> None:
    if len(data) > limit_bytes:
        raise MessageTooLarge(message.actor_name, len(data), limit_bytes)


def enqueue_on(
    pipe: Any,
    broker: RedisBroker,
    message: Message,
    *,
    limit_bytes: int | None = None,
    leave: bool = True,
) -> Message:
    """Queue Dramatiq's own enqueue (its dispatch script, its key layout) on a pipeline, so a
    caller can make it part of a transaction. Mirrors ``RedisBroker.enqueue`` without delay."""
    from dramatiq.common import current_millis  # noqa: PLC0415

    message = message.copy(options={"redis_message_id": str(uuid.uuid4())})
    data = message.encode()
    if limit_bytes is not None:
        _check_size(message, data, limit_bytes)
    args = ["enqueue", current_millis(), message.queue_name, broker.broker_id,
            broker.heartbeat_timeout, broker.dead_message_ttl, 0, _UNPACK,
            message.options["redis_message_id"], data]  # fmt: skip
    broker.scripts["dispatch"](keys=[broker.namespace], args=args, client=pipe)
    if leave:
        leave_heartbeats(pipe, broker)
    return message


def leave_heartbeats(pipe: Any, broker: RedisBroker) -> None:
    """The dispatch script also records the sender as a live worker. A sender never fetches,
    so it would only look dead later, and each dead entry costs a KEYS scan in maintenance."""
    pipe.zrem(f"{broker.namespace}:__heartbeats__", broker.broker_id)


def send_once(
    client: Any, broker: RedisBroker, message: Message, dedup_key: str, retention_ms: int
) -> bool:
    """Enqueue ``message`` unless ``dedup_key`` says it was, in one transaction. False when it
    was already sent (a retried Job, or a retried call whose reply was lost)."""
    from redis.exceptions import WatchError  # noqa: PLC0415

    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(dedup_key)
                if pipe.exists(dedup_key):
                    pipe.unwatch()
                    return False
                pipe.multi()
                enqueue_on(pipe, broker, message)
                pipe.set(dedup_key, message.message_id, px=retention_ms)
                pipe.execute()
                return True
            except WatchError:
                continue


class Producer:
    """Send messages to the workers from Python: ``Producer(settings).send("report", {...})``.

    A payload is a JSON object of references (ids, keys), kept under the message size limit.
    A message goes to its task's queue, the one its workers consume: the ``queues`` given
    here, else the registered task's ``@task(queue=...)`` (default: its name). The registry is
    ``registry``, or the tasks of ``CRON_RUNNER_TASK_MODULES`` and the entry points. A task
    neither registered nor in ``queues`` is refused: its queue is unknown, and a guess would
    leave the message where no worker looks.
    """

    def __init__(
        self,
        settings: Settings,
        queue_settings: QueueSettings | None = None,
        *,
        queues: Mapping[str, str] | None = None,
        registry: Registry | None = None,
        client: Any = None,
    ) -> None:
        from runner.lease import store  # noqa: PLC0415

        refuse_cluster(settings)
        self.settings = settings
        self.qs = queue_settings or QueueSettings(namespace=namespace_for(settings))
        self.queues = dict(queues or {})
        for task, queue in self.queues.items():
            if not QUEUE_NAME_RE.match(queue):
                raise ConfigError(f"Producer: queues[{task!r}]={queue!r} is not a queue name")
        self._registry = registry
        self._own_client = client is None
        self.client = client or store.connect(settings.redis, settings.lease.ttl_s)
        self.broker = make_broker(self.client, self.qs)

    def queue_for(self, task: str) -> str:
        queue = self.queues.get(task)
        if queue is not None:
            return queue
        if self._registry is None:
            self._registry = Registry.discover(self.settings.run.task_modules)
        queue = registered_queue(self._registry, task)
        if queue is None:
            raise UnknownTask(
                f"Producer: task {task!r} is not registered in this process (@task in "
                "CRON_RUNNER_TASK_MODULES or an entry point), so its queue is unknown: register "
                f"it here, or name its queue with Producer(..., queues={{{task!r}: 'QUEUE'}}); "
                f"known tasks: {', '.join(self._registry.names()) or 'none'}"
            )
        self.queues[task] = queue
        return queue

    def message(
        self,
        task: str,
        payload: Mapping[str, Any] | None = None,
        *,
        message_id: str | None = None,
        slot: int | None = None,
        fence: int = 0,
    ) -> Message:
        return build_message(
            task,
            self.queue_for(task),
            slot=slot,
            fence=fence,
            payload=payload,
            message_id=message_id,
            limit_bytes=self.qs.max_message_bytes,
        )

    def send(
        self,
        task: str,
        payload: Mapping[str, Any] | None = None,
        *,
        message_id: str | None = None,
        retention_s: float = 24 * 3600.0,
    ) -> str:
        """Enqueue one message; with a ``message_id``, at most once per id within ``retention_s``."""
        message = self.message(task, payload, message_id=message_id)
        if message_id is None:
            with self.client.pipeline(transaction=False) as pipe:
                enqueue_on(pipe, self.broker, message)
                pipe.execute()
        else:
            keys = TaskKeys(self.settings.lease.prefix, self.settings.lease.scope, task)
            send_once(
                self.client,
                self.broker,
                message,
                sent_key(keys, message_id),
                int(retention_s * 1000),
            )
        return message.message_id

    def send_many(
        self, task: str, payloads: Iterable[Mapping[str, Any]], *, batch: int = 1000
    ) -> list[str]:
        """Enqueue many messages, ``batch`` per round trip (no transaction across batches)."""
        ids: list[str] = []
        pending: list[Message] = []

        limit = self.qs.max_message_bytes

        def flush() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                for message in pending:
                    enqueue_on(pipe, self.broker, message, limit_bytes=limit, leave=False)
                leave_heartbeats(pipe, self.broker)
                pipe.execute()
            pending.clear()

        queue = self.queue_for(task)
        for payload in payloads:
            message = build_message(task, queue, slot=None, fence=0, payload=payload,
                                    message_id=None, limit_bytes=None)  # fmt: skip
            pending.append(message)
            ids.append(message.message_id)
            if len(pending) >= batch:
                flush()
        if pending:
            flush()
        return ids

    def close(self) -> None:
        if self._own_client:
            self.client.close()


class EnqueueTarget(PythonTarget):
    """The work of an enqueue-mode run: send the slot's one message. It runs inside the usual
    execution flow (slot, acquire, keeper, complete with the slot marker, record), so the
    exclusion and the marker are the run's own; only the task body differs.

    The send is idempotent per message id (task + slot), so the crash window between the
    send and the marker costs a retried Job nothing: it finds the message sent and completes.
    """

    outcome = ENQUEUED

    def __init__(
        self, settings: Settings, queue_settings: QueueSettings, spec: TaskSpec, retention_s: float
    ) -> None:
        refuse_cluster(settings)
        super().__init__(self._send)
        self.settings = settings
        self.qs = queue_settings
        self.spec = spec
        # Checked even when CRON_RUNNER_QUEUE names another queue: a task the workers cannot
        # place (a name that is no queue name, no @task queue) would only be dead-lettered.
        self.queue = queue_settings.overrides.queue or queue_of(spec)
        self.options = message_options(queue_settings.overrides)
        self.retention_ms = int(retention_s * 1000)
        self.message_id: str | None = None
        _check_backoff(spec, queue_settings.overrides)
        # Fail at start-up, before taking the lease, on a message that can never be sent.
        build_message(spec.name, self.queue, slot=2**40, fence=2**40, payload=None,
                      message_id=message_id_for(settings.lease.scope, spec.name, 0, 0),
                      limit_bytes=queue_settings.max_message_bytes,
                      options=self.options)  # fmt: skip

    def _send(self, ctx: RunContext) -> None:
        from runner.lease import store  # noqa: PLC0415

        scope = self.settings.lease.scope
        self.message_id = message_id_for(scope, ctx.task, ctx.slot, ctx.fencing_token)
        message = build_message(
            # The actor is the registered task; the lease, slot and message id are the run's
            # name, which `run --name` may set apart (two jobs of one task).
            self.spec.name,
            self.queue,
            slot=ctx.slot,
            fence=ctx.fencing_token,
            payload=ctx.payload,
            message_id=self.message_id,
            limit_bytes=self.qs.max_message_bytes,
            options=self.options,
        )
        keys = TaskKeys(self.settings.lease.prefix, scope, ctx.task)
        client = store.connect(self.settings.redis, self.settings.lease.ttl_s)
        try:
            broker = make_broker(client, self.qs)
            deadline = clock.monotonic() + self.settings.redis.connect_timeout_s
            sent = store.with_deadline(
                lambda: send_once(
                    client, broker, message, sent_key(keys, message.message_id), self.retention_ms
                ),
                deadline_s=deadline,
                what="enqueue",
                where=self.settings.redis.display_target,
            )
        finally:
            client.close()
        ctx.logger.info(
            f"enqueued on queue {self.queue!r}"
            + "".join(f", {k} {v}" for k, v in sorted(self.options.items()))
            if sent
            else "already enqueued by an earlier "
            f"attempt of this slot on queue {self.queue!r}: not sent again",
            extra={"event": "enqueued", "message_id": message.message_id, "queue": self.queue},
        )


def _check_backoff(spec: TaskSpec, overrides: QueueOptions) -> None:
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


# -- statistics (plain Redis reads; no Dramatiq) -----------------------------------------------


@dataclass(frozen=True)
class QueueStats:
    queue: str
    ready: int  # waiting for a worker
    in_flight: int  # fetched by a worker, not yet acknowledged
    delayed: int  # retries waiting out their backoff
    dead: int  # in the dead-letter queue


_SUFFIXES = (".DQ.msgs", ".XQ.msgs", ".msgs", ".DQ", ".XQ")


def discover_queues(client: Any, namespace: str) -> set[str]:
    """Queues that have keys now: an empty queue leaves none, so add the tasks' own."""
    found: set[str] = set()
    prefix = f"{namespace}:"
    for key in client.scan_iter(match=f"{namespace}:*", count=500):
        name = key.decode() if isinstance(key, bytes) else str(key)
        name = name[len(prefix) :]
        if name.startswith("__"):
            continue
        for suffix in _SUFFIXES:
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        found.add(name)
    return found


def queue_stats(client: Any, namespace: str, queues: Iterable[str]) -> list[QueueStats]:
    """Depth, in-flight, delayed and dead-letter counts per queue, in one round trip."""
    names = sorted(set(queues))
    with client.pipeline(transaction=False) as pipe:
        for q in names:
            base = f"{namespace}:{q}"
            pipe.llen(base)
            pipe.hlen(f"{base}.msgs")
            pipe.hlen(f"{base}.DQ.msgs")
            pipe.zcard(f"{base}.XQ")
        replies = pipe.execute()
    out = []
    for i, q in enumerate(names):
        ready, total, delayed, dead = (int(v) for v in replies[4 * i : 4 * i + 4])
        out.append(QueueStats(q, ready, max(0, total - ready), delayed, dead))
    return out


def registered_queue(registry: Registry, task: str) -> str | None:
    """The queue of a registered task (``queue_of``); None when it is not registered."""
    return queue_of(registry.resolve(task)) if task in registry.names() else None


def status_for(client: Any, settings: Settings, task: str | None = None) -> list[QueueStats]:
    """For ``cron-runner status``: every queue that has keys, or the queue ``task`` is on.
    Empty when queue mode is not in use, so run-mode users see nothing new."""
    namespace = namespace_for(settings)
    try:
        queues = discover_queues(client, namespace)
    except NoPermissionError:
        # A per-scope ACL has no SCAN (docs/reliability.md): the queues of the tasks known
        # here, shown when they hold messages, as SCAN would have found them.
        queues = {_status_queue(settings, t) for t in _known_tasks(settings)}
        if task is not None:
            queues &= {_status_queue(settings, task)}
        try:
            rows = queue_stats(client, namespace, queues) if queues else []
        except NoPermissionError:  # a run-mode team's rule has no queue keys: no queues
            return []
        return [q for q in rows if q.ready or q.in_flight or q.delayed or q.dead]
    if task is not None:
        queues &= {_status_queue(settings, task)}
    return queue_stats(client, namespace, queues) if queues else []


def _known_tasks(settings: Settings) -> list[str]:
    try:
        return Registry.discover(settings.run.task_modules).names()
    except ConfigError:
        return []


def _status_queue(settings: Settings, task: str) -> str:
    """A status is a read: tasks that cannot be imported here cost the queue's name, not the
    status. A task that cannot be on a queue gets its own name, which no queue has."""
    try:
        registry = Registry.discover(settings.run.task_modules)
    except ConfigError as exc:
        log.warning(
            f"status: cannot load the tasks to find the queue of {task!r}, so showing the queue "
            f"named after it: {exc}",
            extra={"event": "tasks_unavailable", "task": task},
        )
        return task
    try:
        return registered_queue(registry, task) or task
    except ConfigError:
        return task


def format_status(rows: Sequence[QueueStats]) -> str:
    if not rows:
        return "queues: none (no task is in queue mode yet)\n"
    width = max(len("QUEUE"), *(len(r.queue) for r in rows))
    lines = [f"{'QUEUE':<{width}}  {'READY':>7}  {'IN FLIGHT':>9}  {'DELAYED':>7}  {'DEAD':>6}"]
    lines += [f"{r.queue:<{width}}  {r.ready:>7}  {r.in_flight:>9}  {r.delayed:>7}  {r.dead:>6}"
              for r in rows]  # fmt: skip
    return "\n".join(lines) + "\n"


# -- the dead-letter queue -----------------------------------------------------------------------


@dataclass(frozen=True)
class DeadLetter:
    redis_id: str  # Dramatiq's per-enqueue id, the DLQ's key
    message_id: str
    task: str
    queue: str
    dead_at: float
    attempts: int  # runs that failed: the first and every retry
    slot: int | None
    error: str
    raw: dict[str, Any] = field(repr=False)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _last_line(traceback: str) -> str:
    lines = [line for line in traceback.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def dead_letters(
    client: Any, namespace: str, queue: str, task: str | None = None
) -> list[DeadLetter]:
    """Dead letters of ``queue`` (of ``task`` only, when given), oldest first."""
    xq = f"{namespace}:{queue}.XQ"
    scored = client.zrange(xq, 0, -1, withscores=True)
    if not scored:
        return []
    ids = [_text(member) for member, _ in scored]
    bodies = client.hmget(f"{xq}.msgs", ids)
    out = []
    for (redis_id, (_, score)), body in zip(zip(ids, scored, strict=True), bodies, strict=True):
        if body is None:
            continue
        data = json.loads(body)
        if task is not None and data.get("actor_name") != task:
            continue
        options = data.get("options") or {}
        kwargs = data.get("kwargs") or {}
        out.append(
            DeadLetter(
                redis_id=redis_id,
                message_id=str(data.get("message_id", "")),
                task=str(data.get("actor_name", "")),
                queue=queue,
                dead_at=float(score) / 1000,
                attempts=int(options.get("retries", 0)),
                slot=kwargs.get("slot"),
                error=_last_line(str(options.get("traceback", ""))),
                raw=data,
            )
        )
    return out


def find_dead(letters: Sequence[DeadLetter], message_id: str) -> DeadLetter:
    for letter in letters:
        if message_id in (letter.message_id, letter.redis_id):
            return letter
    raise ConfigError(f"no dead letter with id {message_id!r}")


def retry_dead(client: Any, qs: QueueSettings, letters: Sequence[DeadLetter]) -> list[str]:
    """Send dead letters back to their queue with a fresh retry budget, each in one
    transaction with its removal from the dead-letter queue. Returns the message ids sent."""
    from dramatiq import Message as DramatiqMessage  # noqa: PLC0415
    from redis.exceptions import WatchError  # noqa: PLC0415

    broker = make_broker(client, qs)
    sent = []
    for letter in letters:
        xq = f"{qs.namespace}:{letter.queue}.XQ"
        fields = dict(letter.raw)
        options = {k: v for k, v in (fields.get("options") or {}).items()
                   if k not in ("retries", "traceback", "eta", "redis_message_id",
                                "requeue_timestamp")}  # fmt: skip
        options["dlq_retries"] = int(options.get("dlq_retries", 0)) + 1
        fields.update(options=options, queue_name=letter.queue, args=tuple(fields.get("args", ())))
        message: Message = DramatiqMessage(**fields)
        with client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(f"{xq}.msgs")
                    if not pipe.hexists(f"{xq}.msgs", letter.redis_id):
                        pipe.unwatch()
                        break  # retried or purged by someone else meanwhile
                    pipe.multi()
                    enqueue_on(pipe, broker, message)
                    pipe.zrem(xq, letter.redis_id)
                    pipe.hdel(f"{xq}.msgs", letter.redis_id)
                    pipe.execute()
                    sent.append(letter.message_id)
                    break
                except WatchError:
                    continue
    return sent


def purge_dead(client: Any, namespace: str, letters: Sequence[DeadLetter]) -> int:
    removed = 0
    for letter in letters:
        xq = f"{namespace}:{letter.queue}.XQ"
        with client.pipeline(transaction=True) as pipe:
            pipe.zrem(xq, letter.redis_id)
            pipe.hdel(f"{xq}.msgs", letter.redis_id)
            removed += int(pipe.execute()[1])
    return removed


def utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
