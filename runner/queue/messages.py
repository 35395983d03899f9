"""The message for a slot, and Dramatiq's own enqueue on a pipeline, so that a send can be
one transaction with its idempotency key (docs/design.md, Queue mode).

Dramatiq's Redis layout (dramatiq/brokers/redis/dispatch.lua), under the namespace
``{prefix}:queue:{scope}``: ``NS:Q`` (list of ids waiting), ``NS:Q.msgs`` (id -> message,
waiting and in flight), ``NS:Q.DQ``/``NS:Q.DQ.msgs`` (delayed: retries in their backoff),
``NS:Q.XQ``/``NS:Q.XQ.msgs`` (dead letters, scored by when), ``NS:__acks__.<worker>.<Q>``
(fetched, not yet acknowledged) and ``NS:__heartbeats__``.

Dramatiq is imported inside the functions that build or send a message, so that importing
this module (run mode, ``status``) does not pay for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from runner import clock
from runner.config.queue import QueueSettings
from runner.errors import ConfigError
from runner.keys import TaskKeys

if TYPE_CHECKING:
    from dramatiq import Message as _Message
    from dramatiq.brokers.redis import RedisBroker

    Message = _Message[Any]


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


def message_id_for(scope: str, task: str, slot: int | None, fence: int) -> str:
    """The same id for every replica and every retry of one slot's Job: a retried Job that
    already enqueued finds it taken. A manual run (no slot) gets one per acquisition."""
    which = str(slot) if slot is not None else f"manual:{fence}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"cron-runner:{scope}:{task}:{which}"))


def sent_key(keys: TaskKeys, message_id: str) -> str:
    """Set with the enqueue, in the same transaction: the send is idempotent per message id."""
    return f"{keys.base}:sent:{message_id}"


# The dispatch script unpacks at most this many ids at once; an enqueue unpacks none.
_UNPACK = 4000


def make_broker(
    client: Any, qs: QueueSettings, middleware: Sequence[Any] = (), *, checked: bool = False
) -> RedisBroker:
    """``checked``: a worker's, which dead-letters a message it cannot run (runner.queue.checked)."""
    from dramatiq.brokers.redis import RedisBroker  # noqa: PLC0415 - queue mode only

    broker_class = RedisBroker
    if checked:
        from runner.queue.checked import CheckedBroker  # noqa: PLC0415

        broker_class = CheckedBroker
    return broker_class(
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
    name: str | None = None,
) -> Message:
    """``name``: the run's own name when a run sends it (EnqueueTarget), which may differ from
    the actor's (``run TASK --name KEY``). The worker takes that name's lease around a job with
    a name or a slot (runner.queue.jobs); one with neither (a Producer's) is a piece of work,
    not a run of a slot, and takes none."""
    from dramatiq import Message as DramatiqMessage  # noqa: PLC0415
    from dramatiq.message import generate_unique_id  # noqa: PLC0415

    kwargs: dict[str, Any] = {"slot": slot, "fence": fence, "payload": dict(payload or {})}
    if name is not None:
        kwargs["name"] = name
    message: Message = DramatiqMessage(
        queue_name=queue,
        actor_name=task,
        args=(),
        kwargs=kwargs,
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
