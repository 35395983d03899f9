"""The worker's middleware: which message each worker thread runs, its time limit, and putting
back what did not finish (runner.queue.worker installs it, runner.queue.actors reads it).

It knows each running job's message and context, so that shutdown can cancel the contexts and
put back the messages, and a time limit can cancel a context as well as raise in its thread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name
from dramatiq.middleware import Middleware
from redis.exceptions import RedisError

from runner.tasks import RunContext

log = logging.getLogger("runner.worker")
TIME_LIMIT = "time limit"
#: How often the time limits of running jobs are checked.
LIMIT_POLL_S = 0.1

# KEYS: the dead-letter hash   ARGV: id, message. Only while it is still there (not purged).
_REFRESH_DEAD = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
"""


@dataclass
class _Running:
    message: MessageProxy
    ctx: RunContext | None = None
    limit_s: float | None = None  # the job's time limit
    deadline: float | None = None  # monotonic; None once passed (its context cancelled)


def time_limit_reason(limit_s: float) -> str:
    """What a job stopped by its time limit is told (ctx.cancel_reason) and records."""
    return f"{TIME_LIMIT} of {limit_s:g}s exceeded"


class Runtime(Middleware):
    """Knows which message each worker thread runs, so that shutdown can cancel its context
    and put back what did not finish; logs retries and dead letters."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.running: dict[int, _Running] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.requeued = 0
        self._putting_back = threading.local()

    # Dramatiq's hooks, on the worker threads.
    def after_process_boot(self, broker: Broker) -> None:
        threading.Thread(target=self._watch_limits, name="time-limits", daemon=True).start()

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        # The limit as Dramatiq's TimeLimit reads it: the message's, else the actor's.
        actor_limit = broker.get_actor(message.actor_name).options.get("time_limit")
        limit_ms = message.options.get("time_limit") or actor_limit
        item = _Running(message)
        if limit_ms:
            item.limit_s = limit_ms / 1000
            item.deadline = time.monotonic() + item.limit_s
        with self.lock:
            self.running[threading.get_ident()] = item

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        with self.lock:
            self.running.pop(threading.get_ident(), None)

    after_skip_message = after_process_message

    def before_enqueue(self, broker: Broker, message: Any, delay: int | None) -> None:
        if getattr(self._putting_back, "active", False):
            return
        if delay is not None and "retries" in message.options:
            log.info(
                f"retry {message.options['retries']} of {message.actor_name} in {delay} ms",
                extra={"event": "retry_scheduled", "task": message.actor_name,
                       "message_id": message.message_id, "attempt": message.options["retries"],
                       "delay_ms": delay, "queue": message.queue_name, "holder": self.worker_id},
            )  # fmt: skip

    def before_nack(self, broker: Broker, message: MessageProxy) -> None:
        error = message._exception  # Dramatiq's own record of why it failed
        why = "retries exhausted"
        if error is not None and "traceback" not in message.options:
            # Failed without a run (a task this worker does not have): the reason is all there is.
            why = f"{type(error).__name__}: {error}"
            message.options["traceback"] = why
        log.error(
            f"{message.actor_name}: {why}; moved to the dead-letter queue "
            f"(cron-runner dlq list {message.actor_name})",
            extra={"event": "dead_lettered", "task": message.actor_name,
                   "message_id": message.message_id, "attempt": message.options.get("retries", 0),
                   "queue": message.queue_name, "holder": self.worker_id},
        )  # fmt: skip

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        """Dramatiq dead-letters the message as it was last enqueued, one failure behind: write
        the final attempt count and traceback over it, so ``dlq`` shows the error that ended it."""
        client: Any = broker.client  # type: ignore[attr-defined]
        dead = f"{broker.namespace}:{q_name(message.queue_name)}.XQ.msgs"  # type: ignore[attr-defined]
        try:
            client.eval(
                _REFRESH_DEAD, 1, dead, message.options["redis_message_id"], message.encode()
            )
        except RedisError as exc:
            log.warning(
                f"could not record the final error: {exc}", extra={"event": "record_failed"}
            )

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        """Whatever still runs after the grace goes back to its queue before the process exits."""
        with self.lock:
            left = list(self.running.values())
            self.running.clear()
        for item in left:
            message = item.message
            try:
                broker.do_requeue(message.queue_name, message.options["redis_message_id"])  # type: ignore[attr-defined]
            except RedisError as exc:
                log.error(
                    f"could not put back {message.message_id}; it is re-delivered once this "
                    f"worker's heartbeat expires: {exc}",
                    extra={"event": "requeue_failed", "message_id": message.message_id},
                )
                continue
            self.requeued += 1
            log.warning(
                f"{message.actor_name}: still running at the end of the shutdown grace; put "
                "back on its queue",
                extra={"event": "requeued", "task": message.actor_name,
                       "message_id": message.message_id, "holder": self.worker_id},
            )  # fmt: skip

    # Ours.
    def _watch_limits(self) -> None:
        """At a job's time limit, cancel its context as well as Dramatiq's TimeLimit raises in
        its thread: that exception only comes at the task's next Python instruction, while a
        task waiting on its context (ctx.check(), ctx.cancelled.wait()) stops at once."""
        while True:
            time.sleep(LIMIT_POLL_S)
            now = time.monotonic()
            due: list[tuple[RunContext, float, MessageProxy]] = []
            with self.lock:
                for item in self.running.values():
                    if item.deadline is not None and now >= item.deadline and item.ctx:
                        item.deadline = None
                        due.append((item.ctx, item.limit_s or 0.0, item.message))
            for ctx, limit_s, message in due:
                reason = time_limit_reason(limit_s)
                ctx.cancel(reason)
                ctx.logger.warning(
                    f"{reason}: stopping it; a task blocked in a call (time.sleep, a socket "
                    "read) stops only when that call returns",
                    extra={"event": "time_limit", "message_id": message.message_id},
                )

    def current(self) -> MessageProxy | None:
        """The message this worker thread runs."""
        with self.lock:
            item = self.running.get(threading.get_ident())
        return item.message if item is not None else None

    def put_back(
        self,
        broker: Broker,
        message: MessageProxy,
        delay_ms: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        """A copy of ``message`` goes back on its queue (after ``delay_ms``), its retries
        untouched; this one is then acknowledged. A crash in between delivers it twice, never
        zero times (the lease keeps a slot's job from running twice)."""
        self._putting_back.active = True
        try:
            broker.enqueue(message.copy(options=options or {}), delay=delay_ms)
        finally:
            self._putting_back.active = False

    def attach(self, ctx: RunContext) -> MessageProxy | None:
        with self.lock:
            item = self.running.get(threading.get_ident())
            if item is None:
                return None
            item.ctx = ctx
            message = item.message
        if self.stopping.is_set():
            ctx.cancel("worker shutting down")
        return message

    def cancel_all(self, reason: str) -> None:
        self.stopping.set()
        with self.lock:
            contexts = [i.ctx for i in self.running.values() if i.ctx is not None]
        for ctx in contexts:
            ctx.cancel(reason)
