"""The target of an enqueue-mode run (CRON_RUNNER_MODE=enqueue): send the slot's one message
to the workers (docs/design.md, Queue mode).

It runs inside the usual execution flow (slot, acquire, keeper, complete with the slot
marker, record), so the exclusion and the marker are the run's own; only the task body
differs. It is a ``Target`` of its own, not a Python task: the send is ours, so a stop can
always reach it (``kill`` cuts its connection), and a send that hangs ends the run like a
command that is killed, never in the exit reserved for a Python task that ignores its
cancellation.
"""

from __future__ import annotations

import threading
from typing import Any

from runner.config.queue import QueueSettings, refuse_cluster
from runner.config.settings import BUFFER_ONE, Settings
from runner.keys import TaskKeys
from runner.lease import store
from runner.outcomes import ENQUEUED
from runner.queue.messages import build_message, make_broker, message_id_for, send_once, sent_key
from runner.queue.options import WAIT_TURN, check_backoff, message_options, queue_of
from runner.run.policy import overlap_wait_s
from runner.run.targets import OnThread
from runner.tasks import RunContext, TaskSpec


class EnqueueTarget(OnThread):
    """Send the slot's message on a thread of its own, through a client of its own.

    The send is idempotent per message id (task + slot), so the crash window between the
    send and the marker costs a retried Job nothing: it finds the message sent and completes.
    For the same reason a send cut off by ``kill`` is safe to leave behind: if its transaction
    did reach Redis, a retry finds the message sent.
    """

    # What the run records on success: the message is sent; a worker records the task's run.
    outcome = ENQUEUED
    supervised = None  # no processes of its own: nothing to reap

    def __init__(
        self, settings: Settings, queue_settings: QueueSettings, spec: TaskSpec, retention_s: float
    ) -> None:
        refuse_cluster(settings)
        self.settings = settings
        self.qs = queue_settings
        self.spec = spec
        # Checked even when CRON_RUNNER_QUEUE names another queue: a task the workers cannot
        # place (a name that is no queue name, no @task queue) would only be dead-lettered.
        self.queue = queue_settings.overrides.queue or queue_of(spec)
        # The run's own overlap policy and pause on failures (flag, variable, else @task's):
        # the workers hold the task's lease under them around the job.
        self.options = message_options(
            queue_settings.overrides, overlap=settings.lease.overlap_policy,
            overlap_wait_s=_overlap_wait_s(settings),
            pause_on_failures=settings.lease.failures_before_pause,
        )  # fmt: skip
        self.retention_ms = int(retention_s * 1000)
        self.message_id: str | None = None
        check_backoff(spec, queue_settings.overrides)
        # Fail at start-up, before taking the lease, on a message that can never be sent.
        build_message(spec.name, self.queue, slot=2**40, fence=2**40, payload=None,
                      message_id=message_id_for(settings.lease.scope, spec.name, 0, 0),
                      limit_bytes=queue_settings.max_message_bytes,
                      options=self.options, name="x" * 63)  # fmt: skip
        # A backfill's slots, and those of a run that catches up: the user asked for each, so
        # a worker waits for its turn rather than skip it while another slot runs.
        self.wait_turn = False
        self._sent = False
        self._exc: BaseException | None = None
        self._client: Any = None
        self._killed = threading.Event()

    # -- the Target protocol (runner.run.targets) -------------------------------------------

    def start(self, ctx: RunContext) -> None:
        # Afresh for each slot a run sends (catch-up sends one message per slot).
        self._sent, self._exc, self._client, self.message_id = False, None, None, None
        self._killed.clear()
        # In a copy of the caller's context, as a Python task: the run's task span is current.
        self._start_thread(self._run, ctx, name="enqueue")

    def catching_up(self) -> None:
        """The run sends earlier slots before its own (runner.run.execution): each of its
        messages waits for its turn at the workers, as the slots run one after another in
        run mode."""
        self.wait_turn = True

    def cancel(self) -> None:
        """Nothing to ask politely: a send is short, and either happened or did not."""

    def kill(self) -> bool:
        """Stop retrying and cut the send's connection: its pending read fails at once."""
        self._killed.set()
        client = self._client
        if client is not None:
            client.connection_pool.disconnect()
        return True

    def exit_code(self) -> int:
        return 0 if self._sent else 1

    def error(self) -> str | None:
        if self._exc is not None:
            return f"{type(self._exc).__name__}: {self._exc}"
        return None if self._sent else "stopped while sending"

    # -- the send -----------------------------------------------------------------------------

    def _run(self, ctx: RunContext) -> None:
        try:
            self._send(ctx)
        except BaseException as exc:  # noqa: BLE001 - reported by exit_code()/error()
            self._exc = exc
        else:
            self._sent = True

    def _send(self, ctx: RunContext) -> None:
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
            options={**self.options, WAIT_TURN: 1} if self.wait_turn else self.options,
            # The worker takes this name's lease around the job (runner.queue.jobs).
            name=ctx.task,
        )
        dedup_key = sent_key(
            TaskKeys(self.settings.lease.prefix, scope, ctx.task), message.message_id
        )
        redis, ttl_s = self.settings.redis, self.settings.lease.ttl_s
        # Inside the run's lease: the socket timeout is the lease holder's. No PING: the send
        # is the first call, under the connect deadline.
        with store.connected(redis, "enqueue", ttl_s=ttl_s, ping=False) as client:
            self._client = client
            broker = make_broker(client, self.qs)
            sent = store.within_connect_deadline(
                redis,
                lambda: send_once(client, broker, message, dedup_key, self.retention_ms),
                what="enqueue",
                stop=self._killed.is_set,
            )
        ctx.logger.info(
            f"enqueued on queue {self.queue!r}"
            + "".join(f", {k} {v}" for k, v in sorted(self.options.items()))
            if sent
            else "already enqueued by an earlier "
            f"attempt of this slot on queue {self.queue!r}: not sent again",
            extra={"event": "enqueued", "message_id": message.message_id, "queue": self.queue},
        )


def _overlap_wait_s(settings: Settings) -> float | None:
    """How long a job waits under buffer-one or replace: the run's overlap wait when it was set,
    and for buffer-one its default (the schedule's shortest gap: the next slot's job would
    take its place by then); None leaves replace to the worker's default, which follows the
    holder's TTL and grace, the worker's own."""
    lease = settings.lease
    if lease.overlap_wait_s is None and lease.overlap_policy != BUFFER_ONE:
        return None
    return overlap_wait_s(settings)
