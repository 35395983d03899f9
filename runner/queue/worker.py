"""``cron-runner worker``: a Dramatiq worker whose actors are the registered tasks
(docs/design.md, Queue mode).

Imported only by the worker command: it imports Dramatiq at the top. ``--processes N`` forks
N of these (runner.queue.supervisor); each job's run is recorded as a run's is, in the run
stream and the state hash (runner.lease.journal).

Each task becomes an actor named after it, on its queue (``@task(queue=...)``, default its
name), with its retry and time-limit options (runner.queue.actors). A message runs the task
with a ``RunContext`` like a run's, under the task's lease when a run sent it (its overlap
policy, a fencing token of its own: runner.queue.jobs), and within the task's rate limit
(runner.queue.limits). Dramatiq does the rest: exponential backoff with jitter between
retries, the dead-letter queue after the last one, re-delivery of a dead worker's messages
once its heartbeat is older than the heartbeat timeout.

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
from collections.abc import Iterable
from typing import Any, NamedTuple

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Retries, TimeLimit
from redis.exceptions import RedisError

from runner.config.queue import (
    DEFAULT_MAX_BACKOFF_S,
    DEFAULT_MIN_BACKOFF_S,
    DEFAULT_RETRIES,
    QueueSettings,
)
from runner.config.settings import Settings
from runner.errors import EXIT_TERMINATED, ConfigError
from runner.lease import store
from runner.queue import checked
from runner.queue.actors import Actors
from runner.queue.messages import make_broker
from runner.queue.options import queue_of
from runner.queue.runtime import Runtime
from runner.signals import Shutdown
from runner.tasks import Registry, TaskSpec

log = logging.getLogger("runner.worker")


def cancel_after_s(grace_s: float) -> float:
    """When, after SIGTERM, running jobs are asked to stop: late in the grace, leaving the
    last fifth (at most 5 s) for them to unwind and be put back."""
    return grace_s - min(5.0, grace_s / 5)


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
    checked.install()
    broker = make_broker(client, qs, middleware, checked=True)
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
