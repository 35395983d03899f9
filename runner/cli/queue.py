"""The queue-mode subcommands (``worker``, ``dlq``) and the enqueue target for ``run``.

Registering the subcommands imports nothing heavy: Dramatiq is imported inside the handlers,
so ``cron-runner --help`` and every run-mode command start as fast as before.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from runner.config.settings import Settings
from runner.errors import ConfigError
from runner.tasks import TaskSpec

AddFlags = Callable[[argparse.ArgumentParser, Sequence[str]], None]

WORKER_EPILOG = """Each registered task is an actor on its queue (@task(queue=...), default: the task's
name; a task whose name cannot be a queue name and that names no queue is left out); a
message runs it with the slot and fencing token taken at enqueue. Retries use exponential
backoff with jitter (@task(retries=, min_backoff=, max_backoff=)); after the last, the message
goes to the dead-letter queue (cron-runner dlq). On SIGTERM, running jobs get
CRON_RUNNER_SHUTDOWN_GRACE to finish; near its end ctx.check() raises, and whatever still runs
is put back on its queue. Exit: 0 after a clean stop, 143 if jobs were put back, 1 if a worker
process died, 78 configuration, 69 Redis unreachable at start.

environment (flags win):
  CRON_RUNNER_WORKER_QUEUES         queues to consume, comma-separated (default: the tasks' own)
  CRON_RUNNER_WORKER_PROCESSES      worker processes (default 1: scale with replicas)
  CRON_RUNNER_WORKER_THREADS        threads per process (default 8)
  CRON_RUNNER_WORKER_POLL_INTERVAL  idle poll interval (default 500ms)
  CRON_RUNNER_QUEUE_HEARTBEAT_TIMEOUT  a worker silent this long is dead; its jobs are re-delivered (default 60s)
  CRON_RUNNER_QUEUE_MAINTENANCE_CHANCE share of broker calls that also look for dead workers (default 0.01)
  CRON_RUNNER_QUEUE_DEAD_MESSAGE_TTL   how long dead letters are kept (default 168h)
  CRON_RUNNER_WORKER_METRICS_PORT   serve Dramatiq's Prometheus metrics on this port (default: off)
"""


def add_commands(sub: Any, add_flags: AddFlags) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "worker",
        help="run queue-mode tasks: a Dramatiq worker for the registered tasks",
        description="Consume the queues of the registered tasks and run each message as a task run.",
        epilog=WORKER_EPILOG,
        formatter_class=fmt,
    )
    p.add_argument(
        "--queues",
        dest="setting_WORKER_QUEUES",
        nargs="+",
        metavar="QUEUE",
        action=_JoinQueues,
        help="queues to consume (space- or comma-separated) [CRON_RUNNER_WORKER_QUEUES]",
    )
    p.add_argument(
        "--processes",
        dest="setting_WORKER_PROCESSES",
        metavar="N",
        help="worker processes [CRON_RUNNER_WORKER_PROCESSES]",
    )
    p.add_argument(
        "--threads",
        dest="setting_WORKER_THREADS",
        metavar="M",
        help="threads per process [CRON_RUNNER_WORKER_THREADS]",
    )
    add_flags(p, ("CONNECT_TIMEOUT", "LEASE_TTL", "SHUTDOWN_GRACE", "HOLDER"))
    p.set_defaults(handler=cmd_worker)

    p = sub.add_parser(
        "dlq",
        help="list, show, retry or purge a task's dead letters (queue mode)",
        description="The dead-letter queue of a queue-mode task: messages whose retries ran out.",
        formatter_class=fmt,
    )
    actions = p.add_subparsers(dest="dlq_action", metavar="ACTION", parser_class=type(p))
    actions.required = True
    for name, text in (
        ("list", "list the task's dead letters, oldest first"),
        ("show", "print one dead letter as JSON, with its traceback"),
        ("retry", "send dead letters back to the task's queue with a fresh retry budget"),
        ("purge", "delete dead letters"),
    ):
        a = actions.add_parser(name, help=text, description=text)
        a.add_argument("task", metavar="TASK", help="the task name")
        if name == "show":
            a.add_argument("ids", nargs=1, metavar="ID", help="message id (from dlq list)")
        elif name in ("retry", "purge"):
            a.add_argument("ids", nargs="*", metavar="ID", help="message ids (from dlq list)")
            a.add_argument("--all", action="store_true", help="every dead letter of the task")
        a.add_argument("--queue", help="the task's queue, if it is not registered here")
        add_flags(a, ("CONNECT_TIMEOUT",))
        a.set_defaults(handler=cmd_dlq)


class _JoinQueues(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        items = [values] if isinstance(values, str) else list(values or [])
        setattr(namespace, self.dest, ",".join(str(v) for v in items))


def enqueue_target(settings: Settings, spec: TaskSpec) -> Any:
    """The target of ``cron-runner run TASK`` in enqueue mode (CRON_RUNNER_MODE=enqueue)."""
    from runner.config.queue import load_queue_settings  # noqa: PLC0415
    from runner.queue.enqueue import EnqueueTarget  # noqa: PLC0415
    from runner.schedule.markers import retention_s  # noqa: PLC0415

    if spec.source.startswith("reference"):
        raise ConfigError(
            f"enqueue mode needs a registered task, not the reference {spec.source[10:]!r}: the "
            "workers look the task up by name (@task in CRON_RUNNER_TASK_MODULES or an entry point)"
        )
    qs = load_queue_settings(settings, os.environ)
    return EnqueueTarget(settings, qs, spec, retention_s(settings))


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from runner.config.queue import load_queue_settings, refuse_cluster  # noqa: PLC0415
    from runner.config.sources import setting_flags  # noqa: PLC0415
    from runner.tasks import Registry  # noqa: PLC0415

    refuse_cluster(settings)
    qs = load_queue_settings(settings, os.environ, setting_flags(args))
    registry = Registry.discover(settings.run.task_modules)
    from runner.queue.supervisor import supervise  # noqa: PLC0415 - imports Dramatiq

    return supervise(settings, qs, registry)


def _task_queue(settings: Settings, task: str, queue: str | None) -> str:
    from runner.errors import UnknownTask  # noqa: PLC0415
    from runner.keys import validate_name  # noqa: PLC0415
    from runner.queue.options import registered_queue  # noqa: PLC0415
    from runner.tasks import Registry  # noqa: PLC0415

    validate_name("TASK", task)
    if queue:
        return queue
    registry = Registry.discover(settings.run.task_modules)
    found = registered_queue(registry, task)
    if found is None:
        known = ", ".join(registry.names()) or "none registered"
        raise UnknownTask(
            f"dlq: unknown task {task!r} (known tasks: {known}): for a task no longer "
            "registered here, name its queue with --queue"
        )
    return found


def cmd_dlq(args: argparse.Namespace, settings: Settings) -> int:
    from runner.config.queue import load_queue_settings, refuse_cluster  # noqa: PLC0415
    from runner.lease import store  # noqa: PLC0415
    from runner.queue import dlq  # noqa: PLC0415

    refuse_cluster(settings)
    qs = load_queue_settings(settings, os.environ)
    task_queue = _task_queue(settings, args.task, args.queue)
    # No PING: reading the dead letters is the first call, under the connect deadline.
    with store.connected(settings.redis, "dlq", ping=False) as client:
        letters = store.within_connect_deadline(
            settings.redis,
            lambda: dlq.dead_letters(client, qs.namespace, task_queue, args.task),
            what="dlq",
        )
        out = sys.stdout
        if args.dlq_action == "list":
            if not letters:
                out.write(f"no dead letters for task {args.task} (queue {task_queue})\n")
                return 0
            out.write(
                f"{'MESSAGE ID':<36}  {'DEAD SINCE':<20}  {'ATTEMPTS':>8}  {'SLOT':<20}  ERROR\n"
            )
            for d in letters:
                slot = dlq.utc(d.slot) if isinstance(d.slot, int) else "manual"
                out.write(f"{d.message_id:<36}  {dlq.utc(d.dead_at):<20}  {d.attempts:>8}  "
                          f"{slot:<20}  {d.error[:120]}\n")  # fmt: skip
            return 0
        if args.dlq_action == "show":
            letter = dlq.find_dead(letters, args.ids[0])
            shown = dict(letter.raw, dead_at=dlq.utc(letter.dead_at), queue_name=letter.queue)
            out.write(json.dumps(shown, indent=2, default=str) + "\n")
            return 0
        if args.ids:
            chosen = [dlq.find_dead(letters, i) for i in args.ids]
        elif args.all:
            chosen = letters
        else:
            raise ConfigError(
                f"dlq {args.dlq_action}: name message ids or pass --all "
                f"({len(letters)} dead letter(s) for task {args.task})"
            )
        if args.dlq_action == "retry":
            sent = dlq.retry_dead(client, qs, chosen)
            out.write(f"sent back to queue {task_queue}: {len(sent)}\n")
            for message_id in sent:
                out.write(f"  {message_id}\n")
        else:
            removed = dlq.purge_dead(client, qs.namespace, chosen)
            out.write(f"purged from the dead-letter queue of {task_queue}: {removed}\n")
        return 0
