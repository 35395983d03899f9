"""``cron-runner worker``: a Dramatiq worker whose actors are the registered tasks
(docs/design.md, Queue mode).

Imported only by the worker command: it imports Dramatiq at the top. ``--processes N`` forks
N of these (runner.queue.supervisor); each job's run is recorded as a run's is, in the run
stream and the state hash (runner.lease.journal).

Each task becomes an actor named after it, on its queue (``@task(queue=...)``, default its
name), with its retry and time-limit options. A message runs the task with a ``RunContext``
like a run's: the slot and fencing token taken when the CronJob enqueued it, the worker's id
as holder, the message's payload. Dramatiq does the rest: exponential backoff with jitter
between retries, the dead-letter queue after the last one, re-delivery of a dead worker's
messages once its heartbeat is older than the heartbeat timeout.

Graceful stop. SIGTERM stops fetching; running jobs may finish within the shutdown grace
(``CRON_RUNNER_SHUTDOWN_GRACE``, kept below the pod's terminationGracePeriodSeconds). Near its
end (the last fifth, at most 5 s) their contexts are cancelled, so ``ctx.check()`` raises and
a task that stops that way is put back on its queue, its retry budget untouched. A job still
running when the grace is up is put back too, and the process exits. Nothing is lost; a job
cut off mid-way runs again (at least once).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import q_name
from dramatiq.middleware import Middleware, Retries, TimeLimit
from redis.exceptions import RedisError

from runner import clock
from runner.config.queue import (
    DEFAULT_MAX_BACKOFF_S,
    DEFAULT_MIN_BACKOFF_S,
    DEFAULT_RETRIES,
    QueueSettings,
)
from runner.config.settings import Settings
from runner.errors import EXIT_TERMINATED, Cancelled, ConfigError
from runner.keys import TaskKeys
from runner.lease import journal, store
from runner.logs import RunLogger, run_logger
from runner.outcomes import FAILED, RAN, REQUEUED
from runner.queue.messages import make_broker
from runner.queue.options import queue_of
from runner.signals import Shutdown
from runner.tasks import Registry, RunContext, TaskSpec, queue_options

log = logging.getLogger("runner.worker")

# KEYS: the dead-letter hash   ARGV: id, message. Only while it is still there (not purged).
_REFRESH_DEAD = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
"""


def cancel_after_s(grace_s: float) -> float:
    """When, after SIGTERM, running jobs are asked to stop: late in the grace, leaving the
    last fifth (at most 5 s) for them to unwind and be put back."""
    return grace_s - min(5.0, grace_s / 5)


@dataclass(frozen=True)
class _Run:
    ctx: RunContext
    logger: RunLogger
    message_id: str
    started_wall: float
    started_mono: float


@dataclass
class _Running:
    message: MessageProxy
    ctx: RunContext | None = None


class Runtime(Middleware):
    """Knows which message each worker thread runs, so that shutdown can cancel its context
    and put back what did not finish; logs retries and dead letters."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.running: dict[int, _Running] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.requeued = 0

    # Dramatiq's hooks, on the worker threads.
    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        with self.lock:
            self.running[threading.get_ident()] = _Running(message)

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
        if delay is not None and "retries" in message.options:
            log.info(
                f"retry {message.options['retries']} of {message.actor_name} in {delay} ms",
                extra={"event": "retry_scheduled", "task": message.actor_name,
                       "message_id": message.message_id, "attempt": message.options["retries"],
                       "delay_ms": delay, "queue": message.queue_name, "holder": self.worker_id},
            )  # fmt: skip

    def before_nack(self, broker: Broker, message: MessageProxy) -> None:
        log.error(
            f"{message.actor_name}: retries exhausted; moved to the dead-letter queue "
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


class Actors:
    """Builds one actor per registered task and runs a message as a task run."""

    def __init__(
        self, settings: Settings, broker: RedisBroker, runtime: Runtime, record_client: Any
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.runtime = runtime
        self.record_client = record_client

    def declare(self, spec: TaskSpec, queue: str) -> None:
        opts = queue_options(spec.fn)
        options: dict[str, Any] = {}
        if opts.max_retries is not None:
            options["max_retries"] = opts.max_retries
        if opts.min_backoff_s is not None:
            options["min_backoff"] = int(opts.min_backoff_s * 1000)
        if opts.max_backoff_s is not None:
            options["max_backoff"] = int(opts.max_backoff_s * 1000)
        if opts.time_limit_s is not None:
            options["time_limit"] = int(opts.time_limit_s * 1000)
        dramatiq.Actor(
            self._runner(spec),
            broker=self.broker,
            actor_name=spec.name,
            queue_name=queue,
            priority=0,
            options=options,
        )

    def _runner(self, spec: TaskSpec) -> Callable[..., None]:
        def run(
            slot: int | None = None,
            fence: int = 0,
            payload: dict[str, Any] | None = None,
            **_unknown: Any,
        ) -> None:
            self._run(spec, slot, fence, payload or {})

        run.__name__ = run.__qualname__ = spec.fn.__name__
        run.__module__ = spec.fn.__module__
        return run

    def _run(self, spec: TaskSpec, slot: int | None, fence: int, payload: dict[str, Any]) -> None:
        holder = self.runtime.worker_id
        logger = run_logger(spec.name, holder)
        logger.bind(slot=slot if slot is not None else "manual", fence=fence)
        ctx = RunContext(
            task=spec.name, slot=slot, fencing_token=fence, holder=holder, logger=logger,
            payload=payload,
        )  # fmt: skip
        message = self.runtime.attach(ctx)
        attempt = int(message.options.get("retries", 0)) if message is not None else 0
        message_id = message.message_id if message is not None else ""
        logger.bind(message_id=message_id, attempt=attempt)
        run = _Run(ctx, logger, message_id, clock.wall(), clock.monotonic())
        logger.debug("start", extra={"event": "start"})
        try:
            spec.fn(ctx)
        except Cancelled:
            if not self.runtime.stopping.is_set() or message is None:
                self._finish(run, FAILED, "cancelled")
                raise
            # Stopped for the shutdown: a copy goes back with the same retry count, then this
            # one is acknowledged. A crash in between runs it twice, never zero times.
            self.broker.enqueue(message.copy())
            self.runtime.requeued += 1
            self._finish(run, REQUEUED, None)
            return
        except BaseException as exc:
            self._finish(run, FAILED, f"{type(exc).__name__}: {exc}")
            raise
        self._finish(run, RAN, None)

    def _finish(self, run: _Run, outcome: str, error: str | None) -> None:
        logger = run.logger
        duration_ms = int((clock.monotonic() - run.started_mono) * 1000)
        code = 1 if outcome == FAILED else 0
        level = logging.WARNING if outcome != RAN else logging.INFO
        logger.log(
            level,
            f"finished: {outcome}" + (f" ({error})" if error else ""),
            extra={"event": "finished", "outcome": outcome, "exit_code": code,
                   "duration_ms": duration_ms},
        )  # fmt: skip
        if outcome == REQUEUED:
            return
        self._record(run, outcome, code, duration_ms, error)

    def _record(
        self, run: _Run, outcome: str, code: int, duration_ms: int, error: str | None
    ) -> None:
        """The same run stream and state hash a run writes (runner.lease.journal), so history,
        status and the watchdog see what the workers did."""
        ctx = run.ctx
        lease_settings = self.settings.lease
        record = journal.run_record(
            slot=ctx.slot,
            holder=ctx.holder,
            fence=ctx.fencing_token,
            outcome=outcome,
            exit_code=code,
            started_at_s=run.started_wall,
            duration_ms=duration_ms,
            error=error,
            message_id=run.message_id,
        )
        state = journal.state(
            outcome=outcome,
            exit_code=code,
            fence=ctx.fencing_token,
            holder=ctx.holder,
            slot=ctx.slot,
            at_s=clock.wall(),
            duration_ms=duration_ms,
        )
        keys = TaskKeys(lease_settings.prefix, lease_settings.scope, ctx.task)
        try:
            journal.record_unleased(
                self.record_client, keys, record, state, runs_maxlen=lease_settings.history_length
            )
        except RedisError as exc:
            run.logger.warning(f"could not record the run: {exc}", extra={"event": "record_failed"})


class Plan(NamedTuple):
    """What a worker serves: each task with its queue, and the queues it consumes."""

    actors: tuple[tuple[TaskSpec, str], ...]
    queues: frozenset[str]


def plan(registry: Registry, qs: QueueSettings) -> Plan:
    """Every registered task whose queue is known becomes an actor, whichever queues this
    worker consumes: a CronJob may send a task to another queue (CRON_RUNNER_QUEUE), and the
    worker there must know it. A task whose name cannot be a queue name and that names no
    queue is left out: it cannot be enqueued either (enqueue mode refuses it), so it is a
    run-mode task, and it must not keep the worker from starting."""
    specs = registry.specs()
    if not specs:
        raise ConfigError(
            "worker: no tasks registered: set CRON_RUNNER_TASK_MODULES or install a package with "
            "a cron_runner.tasks entry point"
        )
    actors: list[tuple[TaskSpec, str]] = []
    left_out: list[str] = []
    for spec in specs:
        try:
            actors.append((spec, queue_of(spec)))
        except ConfigError:
            left_out.append(spec.name)
    if left_out:
        log.log(
            logging.DEBUG if qs.queues else logging.WARNING,
            f"not served by workers: {', '.join(left_out)}: a name that cannot be a queue name "
            "and no @task(..., queue='name'); fine for run-mode tasks",
            extra={"event": "tasks_not_served"},
        )
    queues = frozenset(qs.queues) or frozenset(queue for _, queue in actors)
    if not queues:
        raise ConfigError(
            f"worker: no registered task can run from a queue ({', '.join(left_out)}: names "
            "must start with a letter or '_'): give them one with @task(..., queue='name')"
        )
    return Plan(tuple(actors), queues)


def _metrics_middleware(qs: QueueSettings) -> list[Any]:
    if qs.metrics_port is None:
        return []
    from dramatiq.middleware.prometheus import Prometheus  # noqa: PLC0415

    return [Prometheus()]


def build(
    settings: Settings,
    qs: QueueSettings,
    served: Plan,
    worker_id: str,
    *,
    client: Any,
    record_client: Any,
) -> tuple[RedisBroker, Runtime]:
    """The broker on ``client`` (bytes, for Dramatiq) with the planned actors, which record
    their runs through ``record_client``, and the queues to consume declared."""
    runtime = Runtime(worker_id)
    retries = Retries(
        max_retries=DEFAULT_RETRIES,
        min_backoff=int(DEFAULT_MIN_BACKOFF_S * 1000),
        max_backoff=int(DEFAULT_MAX_BACKOFF_S * 1000),
    )
    # No time limit unless a task sets one: a scheduled job's length is its own business.
    middleware = [runtime, TimeLimit(time_limit=float("inf")), retries, *_metrics_middleware(qs)]
    broker = make_broker(client, qs, middleware)
    actors = Actors(settings, broker, runtime, record_client)
    for spec, queue in served.actors:
        actors.declare(spec, queue)
    for queue in served.queues:
        broker.declare_queue(queue)
    return broker, runtime


def serve(
    settings: Settings,
    qs: QueueSettings,
    served: Plan,
    *,
    worker_id: str,
    stop: Shutdown | None = None,
) -> int:
    """One worker process until SIGTERM. 0 after a clean stop, 143 if jobs had to be put back."""
    stop = stop or Shutdown().install()
    redis, ttl_s = settings.redis, settings.lease.ttl_s
    # A worker holds no lease, but its calls' socket timeout has always followed
    # CRON_RUNNER_LEASE_TTL (`worker --lease-ttl`, and the chart sets it for workers).
    with (
        store.connected(redis, "worker", ttl_s=ttl_s, decode_responses=False) as client,
        store.connected(redis, "worker", ttl_s=ttl_s, ping=False) as record_client,
    ):
        broker, runtime = build(
            settings, qs, served, worker_id, client=client, record_client=record_client
        )
        queues = set(served.queues)
        broker.emit_after("process_boot")
        worker = dramatiq.Worker(
            broker,
            queues=queues,
            worker_threads=qs.threads,
            worker_timeout=max(1, int(qs.poll_interval_s * 1000)),
        )
        worker.start()
        log.info(
            f"worker ready: queues {', '.join(sorted(queues))}; {qs.threads} threads",
            extra={"event": "worker_ready", "holder": worker_id, "pid": os.getpid()},
        )
        stop.wait()
        grace_s = settings.run.shutdown_grace_s
        log.info(
            f"stopping: running jobs get {grace_s:g}s to finish",
            extra={"event": "stopping", "holder": worker_id},
        )
        timer = threading.Timer(
            cancel_after_s(grace_s), runtime.cancel_all, args=("worker shutting down",)
        )
        timer.daemon = True
        timer.start()
        worker.stop(timeout=int(grace_s * 1000))
        timer.cancel()
        _leave(broker, queues)
        broker.close()
    code = EXIT_TERMINATED if runtime.requeued else 0
    log.info(
        "worker stopped" + (f"; {runtime.requeued} job(s) put back" if runtime.requeued else ""),
        extra={"event": "worker_stopped", "holder": worker_id, "exit_code": code},
    )
    return code


def _leave(broker: RedisBroker, queues: Iterable[str]) -> None:
    """Take this worker out of the heartbeats when it holds nothing: else it would look dead
    later, and maintenance would scan for its keys. With anything left, stay, so that
    maintenance re-delivers it."""
    acks = f"{broker.namespace}:__acks__.{broker.broker_id}"
    client: Any = broker.client
    try:
        sets = [f"{acks}.{q}{suffix}" for q in queues for suffix in ("", ".DQ")]
        if not any(client.scard(key) for key in sets):
            broker.client.zrem(f"{broker.namespace}:__heartbeats__", broker.broker_id)
    except RedisError as exc:
        log.warning(f"could not leave the heartbeats: {exc}", extra={"event": "leave_failed"})
