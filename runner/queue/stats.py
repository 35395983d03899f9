"""Queue statistics for ``status`` and ``serve``: depth, in flight, delayed and dead letters
per queue (docs/design.md, Queue mode). Plain Redis reads on Dramatiq's key layout
(runner.queue.messages); Dramatiq itself is not imported.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoPermissionError

from runner.config.queue import namespace_for
from runner.config.settings import Settings
from runner.errors import ConfigError
from runner.lease.replies import UnexpectedReply, answered, integer
from runner.queue.options import registered_queue
from runner.tasks import Registry

log = logging.getLogger("runner.queue")


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
        counts = answered(pipe.execute, "queue counts")
    if not isinstance(counts, list) or len(counts) != 4 * len(names):
        raise UnexpectedReply("queue counts", counts)
    out = []
    for i, q in enumerate(names):
        ready, total, delayed, dead = (integer(v, q) for v in counts[4 * i : 4 * i + 4])
        out.append(QueueStats(q, ready, max(0, total - ready), delayed, dead))
    return out


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
