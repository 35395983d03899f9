"""The producer: messages sent to the workers from Python code (docs/queue.md;
docs/design.md).

Dramatiq is imported when the first message is built, not with this module. The client is
the caller's, or one of its own that holds no lease (closed by ``close``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from runner.config.queue import QueueSettings, namespace_for, refuse_cluster
from runner.config.settings import Settings
from runner.errors import ConfigError, UnknownTask
from runner.keys import TaskKeys
from runner.lease import store
from runner.queue.messages import (
    build_message,
    enqueue_on,
    leave_heartbeats,
    make_broker,
    send_once,
    sent_key,
)
from runner.queue.options import registered_queue
from runner.tasks import QUEUE_NAME_RE, Registry

if TYPE_CHECKING:
    from runner.queue.messages import Message


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
        refuse_cluster(settings)
        self.settings = settings
        self.qs = queue_settings or QueueSettings(namespace=namespace_for(settings))
        self.queues = dict(queues or {})
        for task, queue in self.queues.items():
            if not QUEUE_NAME_RE.match(queue):
                raise ConfigError(f"Producer: queues[{task!r}]={queue!r} is not a queue name")
        self._registry = registry
        self._own_client = client is None
        self.client = client or store.connect(settings.redis)
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
