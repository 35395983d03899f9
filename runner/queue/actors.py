"""The worker's actors: one per registered task, each running a message as a run of its task
(docs/design.md, Queue mode).

A message runs the task with a ``RunContext`` like a run's: the slot, the worker's id as
holder, the message's payload. A message a run sent (it names the run, or has a slot) runs
under the task's lease (runner.queue.jobs): the fencing token is that acquire's, the overlap
policy decides whether and when it runs, and the outcome completes or releases the lease. A
message without either (a Producer's piece of work) takes no lease, as before: its fencing
token is the message's (0).

Either way a task with a rate limit (``@task(rate_limit=)``, or the enqueueing CronJob's
CRON_RUNNER_RATE_LIMIT carried in the message) counts the start first (runner.queue.limits);
a job over the limit goes back to its queue with a delay, never to the dead-letter queue.

Each job's outcome goes to the run stream and the state hash (runner.lease.journal).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimitExceeded
from redis.exceptions import RedisError

from runner import clock
from runner.config.settings import ALLOW_OTHER_SLOTS, REPLACE, Settings
from runner.errors import Cancelled, CronRunnerError, LeaseNotOwned
from runner.keys import TaskKeys
from runner.lease import journal, store
from runner.lease.journal import Fields
from runner.lease.keeper import Keeper
from runner.lease.scripts import AcquireResult, holder_of, new_token, slot_of
from runner.logs import RunLogger, keeper_logger, run_logger
from runner.outcomes import (
    FAILED,
    LEASE_LOST,
    OUTCOMES,
    RAN,
    REPLACED,
    REQUEUED,
    SKIPPED_DONE,
    SKIPPED_HELD,
    exit_code,
)
from runner.queue import attempts, limits
from runner.queue.jobs import (
    JOB_MARKER_RETENTION_MS,
    Gate,
    JobKeys,
    JobLease,
    PutBack,
    Skip,
    turn_later,
)
from runner.queue.options import JobPolicy, job_policy
from runner.queue.runtime import TIME_LIMIT
from runner.tasks import RunContext, TaskSpec, queue_options

if TYPE_CHECKING:
    from runner.queue.runtime import Runtime

T = TypeVar("T")
REPLACED_REASON = "replaced by a run of a newer slot"
SHUTDOWN = "stopped for the worker's shutdown: put back on its queue"
# The ``skipped`` field a slot that waits its turn writes on its marker before an acquire.
WAITS_TURN = "waits_turn"


@dataclass
class _Job:
    """One message, as its actor runs it."""

    spec: TaskSpec
    name: str  # the run's name: the lease, the records and ctx.task follow it
    slot: int | None
    payload: dict[str, Any]
    message: MessageProxy | None
    message_id: str
    policy: JobPolicy
    logger: RunLogger
    leased: bool  # a run's message (a name or a slot): under the task's lease
    started_wall: float = 0.0
    started_mono: float = 0.0


class Actors:
    """Builds one actor per registered task and runs a message as a task run."""

    def __init__(
        self, settings: Settings, broker: RedisBroker, runtime: Runtime, record_client: Any
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.runtime = runtime
        self.record_client = record_client
        lease = settings.lease
        self.limits = limits.RateLimits(record_client, lease.prefix, lease.scope)

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
            name: str | None = None,
            **_unknown: Any,
        ) -> None:
            self._run(spec, slot, fence, payload or {}, name)

        run.__name__ = run.__qualname__ = spec.fn.__name__
        run.__module__ = spec.fn.__module__
        return run

    def _run(
        self,
        spec: TaskSpec,
        slot: int | None,
        fence: int,
        payload: dict[str, Any],
        name: str | None,
    ) -> None:
        message = self.runtime.current()
        options = message.options if message is not None else {}
        holder = self.runtime.worker_id
        job_name = name or spec.name
        logger = run_logger(job_name, holder)
        message_id = message.message_id if message is not None else ""
        logger.bind(slot=slot if slot is not None else "manual", message_id=message_id,
                    attempt=int(options.get("retries", 0)))  # fmt: skip
        job = _Job(spec, job_name, slot, payload, message, message_id, job_policy(options, spec),
                   logger, leased=slot is not None or name is not None)  # fmt: skip
        if job.leased:
            self._run_leased(job)
            return
        logger.bind(fence=fence)
        if not self._admitted(job):
            return
        ctx = RunContext(task=job.name, slot=slot, fencing_token=fence, holder=holder,
                         logger=logger, payload=payload)  # fmt: skip
        self._run_task(job, ctx, lease=None)

    # -- the rate limit ---------------------------------------------------------------------

    def _admitted(self, job: _Job, *, before_back: Callable[[], None] | None = None) -> bool:
        """Count this start against the task's rate limit. Over it, ``before_back`` (the lease
        released), then the message goes back to its queue with a delay."""
        rate = job.policy.rate_limit
        if rate is None or job.message is None or self.limits.admit(job.name, rate):
            return True
        if before_back is not None:
            before_back()
        times = int(job.message.options.get(limits.LIMITED, 0))
        delay = limits.delay_ms(rate, times)
        job.logger.log(
            logging.INFO if times == 0 else logging.DEBUG,
            f"over the rate limit of {rate.limit} starts in {rate.window_s}s: back on the queue "
            f"for {delay} ms",
            extra={"event": "rate_limited", "delay_ms": delay, "times": times + 1},
        )
        self.runtime.put_back(self.broker, job.message, delay, {limits.LIMITED: times + 1})
        return False

    # -- a job under the task's lease -------------------------------------------------------

    def _lease(self, job: _Job) -> JobLease:
        lease_settings = self.settings.lease
        wait_ms = int(self._overlap_wait_s(job) * 1000)
        return JobLease(
            self.record_client,
            JobKeys(lease_settings.prefix, lease_settings.scope, job.name),
            new_token(self.runtime.worker_id, job.slot),
            ttl_ms=lease_settings.ttl_ms,
            retention_ms=JOB_MARKER_RETENTION_MS,
            runs_maxlen=lease_settings.history_length,
            overlap=job.policy.overlap,
            aux_ms=wait_ms,
            skip_ttl_ms=JOB_MARKER_RETENTION_MS,
            pause_after_failures=job.policy.pause_on_failures,
        )

    def _overlap_wait_s(self, job: _Job) -> float:
        """The message's overlap wait, else as long as a holder may take to stop and release
        when asked: its TTL, its shutdown grace and 10 s (the workers share these settings)."""
        if job.policy.overlap_wait_s is not None:
            return job.policy.overlap_wait_s
        return self.settings.lease.timings.default_overlap_wait_s(
            self.settings.run.shutdown_grace_s
        )

    def _store(self, call: Callable[[], T], what: str) -> T:
        return store.within_connect_deadline(self.settings.redis, call, what=what)

    def _run_leased(self, job: _Job) -> None:
        lease = self._lease(job)
        skip_record = self._record_fields(job, SKIPPED_HELD, 0)
        del skip_record[journal.OUTCOME]  # the script adds it, and why

        def look(final: bool) -> AcquireResult:
            return self._store(
                lambda: lease.acquire(job.slot, final=final, skip_record=skip_record), "acquire"
            )

        gate = Gate(look, job.slot, wait_s=self._overlap_wait_s(job),
                    held_wait_s=self.settings.lease.held_wait, stopping=self.runtime.stopping,
                    waits_turn=job.policy.wait_turn)  # fmt: skip
        turn = self._not_its_turn(job, lease) or gate.take()
        if isinstance(turn, Skip):
            self._skipped(job, lease, turn)
            return
        if isinstance(turn, PutBack):
            self._put_back(job, turn)
            return
        job.logger.bind(fence=turn.fence)

        def release() -> None:  # the lease of a job held back by the rate limit, unrecorded
            self._finish_quietly(job, lambda: lease.release({}, {}))

        if not self._admitted(job, before_back=release):
            return
        ctx = RunContext(task=job.name, slot=job.slot, fencing_token=turn.fence,
                         holder=self.runtime.worker_id, logger=job.logger, payload=job.payload)  # fmt: skip
        timings = self.settings.lease.timings
        keeper = Keeper(
            lease,
            ttl_s=timings.ttl_s,
            confirmed_at=turn.sent_at,
            renew_interval_s=timings.replace_renew_interval_s
            if job.policy.overlap == REPLACE
            else None,
            on_lost=lambda reason: ctx.cancel("lease lost"),
            logger=keeper_logger(job.logger),
        )
        ctx.lease_valid = lambda: not keeper.is_lost()
        lease.on_preempted = lambda exc: self._preempted(job, ctx, exc)
        keeper.start()
        try:
            self._run_task(job, ctx, lease=lease, keeper=keeper)
        finally:
            keeper.stop()

    def _not_its_turn(self, job: _Job, lease: JobLease) -> PutBack | None:
        """A slot that waits its turn, while another slot holds the lease: back on the queue.

        The acquire script records a slot's skip once, when its marker has no ``skipped``
        field yet: one is written here first, so that a held reply (another job took the
        lease between this read and the acquire) records nothing, and the message goes back.
        A skip that stands (superseded, paused) is then recorded by the worker (``_skipped``).
        """
        if not job.policy.wait_turn or job.slot is None:
            return None
        keys = lease.keys
        marker = keys.slot(job.slot)

        def read() -> list[Any]:
            pipe = self.record_client.pipeline(transaction=False)
            # HSET, not HSETNX: the minimal ACL has it (docs/reliability.md), and only the
            # field's presence counts.
            pipe.hset(marker, "skipped", WAITS_TURN)
            pipe.pexpire(marker, JOB_MARKER_RETENTION_MS)
            pipe.get(keys.lease)
            pipe.pttl(keys.lease)
            return list(pipe.execute())

        *_, token, ttl_ms = self._store(read, "read the lease")
        if job.policy.overlap == ALLOW_OTHER_SLOTS or token is None or slot_of(token) == job.slot:
            return None  # free, or held for this very slot: the gate's usual wait
        return turn_later(int(ttl_ms), holder_of(token))

    def _preempted(self, job: _Job, ctx: RunContext, exc: CronRunnerError) -> None:
        job.logger.warning(str(exc), extra={"event": "preempted"})
        ctx.cancel(REPLACED_REASON)

    def _skipped(self, job: _Job, lease: JobLease, skip: Skip) -> None:
        job.started_wall, job.started_mono = clock.wall(), clock.monotonic()
        self._log_finished(job, skip.outcome, skip.reason)
        # A done slot is not a run to record; a slot that waits its turn had its skip kept
        # out of the script's record (_not_its_turn).
        if (skip.recorded and not job.policy.wait_turn) or skip.outcome == SKIPPED_DONE:
            return
        record = self._record_fields(job, skip.outcome, 0, skip.reason)
        self._finish_quietly(job, lambda: lease.record(record, {}))

    def _put_back(self, job: _Job, back: PutBack) -> None:
        if job.message is None:
            return
        if back.delay_ms is None:  # the worker stops: as a job stopped by the shutdown
            self.runtime.requeued += 1
            self.runtime.put_back(self.broker, job.message)
            job.started_wall, job.started_mono = clock.wall(), clock.monotonic()
            self._log_finished(job, REQUEUED, back.reason)
            return
        job.logger.info(
            f"{back.reason}: back on the queue for {back.delay_ms} ms",
            extra={"event": "put_back", "delay_ms": back.delay_ms},
        )
        self.runtime.put_back(self.broker, job.message, back.delay_ms)

    # -- the task ---------------------------------------------------------------------------

    def _run_task(
        self, job: _Job, ctx: RunContext, *, lease: JobLease | None, keeper: Keeper | None = None
    ) -> None:
        self.runtime.attach(ctx)
        job.started_wall, job.started_mono = clock.wall(), clock.monotonic()
        job.logger.debug("start", extra={"event": "start"})
        traced = self._begin_attempt(job, ctx)
        try:
            self._task(job, ctx, lease=lease, keeper=keeper)
        finally:
            if traced:  # this attempt's own record is written (or could not be)
                attempts.safely(attempts.end, self.record_client, self._keys(job), job.message_id)

    def _keys(self, job: _Job) -> TaskKeys:
        return TaskKeys(self.settings.lease.prefix, self.settings.lease.scope, job.name)

    def _begin_attempt(self, job: _Job, ctx: RunContext) -> bool:
        """Leave this attempt's trace, recording the one before it if it left one (a worker
        killed, or stopped at the end of its grace): runner.queue.attempts."""
        if not job.message_id:
            return False
        trace = {"holder": ctx.holder, "fence": ctx.fencing_token, "slot": ctx.slot,
                 "started_at": job.started_wall}  # fmt: skip
        attempts.safely(attempts.begin, self.record_client, self._keys(job), job.message_id,
                        trace, self.settings.lease.history_length)  # fmt: skip
        return True

    def _task(
        self, job: _Job, ctx: RunContext, *, lease: JobLease | None, keeper: Keeper | None
    ) -> None:
        try:
            job.spec.fn(ctx)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            if lease is not None and lease.preempted is not None:
                self._done(job, ctx, lease, REPLACED, str(lease.preempted))
                return
            if isinstance(exc, Cancelled) and self.runtime.stopping.is_set() and job.message:
                # Stopped for the shutdown: a copy goes back with the same retry count, then
                # this one is acknowledged. A crash in between runs it twice, never zero times.
                # The attempt is recorded as requeued (the state stays the last run's).
                record = self._record_fields(job, REQUEUED, ctx.fencing_token, SHUTDOWN)
                if lease is not None:
                    self._finish_quietly(job, lambda: lease.release(record, {}))
                else:
                    self._finish_quietly(job, lambda: journal.record_unleased(
                        self.record_client, self._keys(job), record, {},
                        runs_maxlen=self.settings.lease.history_length))  # fmt: skip
                self.runtime.put_back(self.broker, job.message)
                self.runtime.requeued += 1
                self._log_finished(job, REQUEUED, SHUTDOWN)
                return
            if lease is not None and keeper is not None and keeper.is_lost():
                self._lost(job, ctx, lease, error)
            elif isinstance(exc, TimeLimitExceeded) or ctx.cancel_reason.startswith(TIME_LIMIT):
                # Stopped at its limit, or later: when the call it was blocked in returned.
                why = ctx.cancel_reason or TIME_LIMIT + " exceeded"
                self._failed(job, ctx, lease, f"{why}: stopped after "
                             f"{self._duration_ms(job) / 1000:.1f}s")  # fmt: skip
            elif isinstance(exc, Cancelled):
                self._failed(job, ctx, lease, "cancelled")
            else:
                self._failed(job, ctx, lease, error)
            raise
        if lease is None:
            self._log_finished(job, RAN, None)
            self._record_unleased(job, ctx, RAN, None)
            return
        self._done(job, ctx, lease, RAN, None)

    def _done(
        self, job: _Job, ctx: RunContext, lease: JobLease, outcome: str, error: str | None
    ) -> None:
        """Complete the lease: the job's marker says the slot ran (or was replaced), so a
        message delivered again for it is acknowledged without running."""
        code = _code(outcome)
        marker: Fields = {"fence": ctx.fencing_token}
        if outcome == REPLACED:
            marker["outcome"] = REPLACED
        record = self._record_fields(job, outcome, ctx.fencing_token, error)
        state = self._state_fields(job, ctx, outcome, code)
        # replaced: its slot is done, which neither counts as a failure nor ends a count of them.
        success = outcome != REPLACED

        def complete() -> object:
            return lease.complete(job.slot, record, state, marker,
                                  retention_ms=JOB_MARKER_RETENTION_MS, success=success)  # fmt: skip

        try:
            self._store(complete, "finish")
        except LeaseNotOwned as exc:
            # The lease went while the task ran to its end: as a run, lease_lost, and the
            # message is retried (Dramatiq's retries).
            self._lost(job, ctx, lease, str(exc))
            raise
        except (RedisError, CronRunnerError) as exc:
            self._log_finished(job, outcome, error)
            job.logger.warning(f"could not record the run: {exc}", extra={"event": "record_failed"})
            return
        self._log_finished(job, outcome, error)

    def _lost(self, job: _Job, ctx: RunContext, lease: JobLease, error: str) -> None:
        self._log_finished(job, LEASE_LOST, error)
        code = _code(LEASE_LOST)
        record = self._record_fields(job, LEASE_LOST, ctx.fencing_token, error)
        state = self._state_fields(job, ctx, LEASE_LOST, code)
        self._finish_quietly(job, lambda: lease.record(record, state))

    def _failed(self, job: _Job, ctx: RunContext, lease: JobLease | None, error: str) -> None:
        self._log_finished(job, FAILED, error)
        if lease is None:
            self._record_unleased(job, ctx, FAILED, error)
            return
        record = self._record_fields(job, FAILED, ctx.fencing_token, error)
        state = self._state_fields(job, ctx, FAILED, 1)
        try:
            finished = self._store(lambda: lease.release(record, state, failure=True), "finish")
        except (RedisError, CronRunnerError) as exc:
            job.logger.warning(f"could not record the run: {exc}", extra={"event": "record_failed"})
            return
        if finished.paused:
            job.logger.warning(
                f"paused the task after {lease.pause_after_failures} consecutive failures: no "
                "job of it runs until `cron-runner resume`",
                extra={"event": "paused"},
            )

    def _finish_quietly(self, job: _Job, call: Callable[[], object]) -> None:
        """A finish whose failure changes nothing for the message: logged, not raised."""
        try:
            self._store(call, "finish")
        except (RedisError, CronRunnerError) as exc:
            job.logger.warning(f"could not record the run: {exc}", extra={"event": "record_failed"})

    # -- records ----------------------------------------------------------------------------

    def _duration_ms(self, job: _Job) -> int:
        return int((clock.monotonic() - job.started_mono) * 1000)

    def _log_finished(self, job: _Job, outcome: str, error: str | None) -> None:
        info = outcome == RAN or OUTCOMES[outcome].skip
        job.logger.log(
            logging.INFO if info else logging.WARNING,
            f"finished: {outcome}" + (f" ({error})" if error else ""),
            extra={"event": "finished", "outcome": outcome, "exit_code": _code(outcome),
                   "duration_ms": self._duration_ms(job)},
        )  # fmt: skip

    def _record_fields(
        self, job: _Job, outcome: str, fence: int, error: str | None = None
    ) -> Fields:
        started = job.started_mono > 0
        return journal.run_record(
            slot=job.slot, holder=self.runtime.worker_id, fence=fence, outcome=outcome,
            exit_code=_code(outcome), started_at_s=job.started_wall if started else clock.wall(),
            duration_ms=self._duration_ms(job) if started else 0, error=error,
            message_id=job.message_id,
        )  # fmt: skip

    def _state_fields(self, job: _Job, ctx: RunContext, outcome: str, code: int) -> Fields:
        return journal.state(
            outcome=outcome, exit_code=code, fence=ctx.fencing_token, holder=ctx.holder,
            slot=ctx.slot, at_s=clock.wall(), duration_ms=self._duration_ms(job),
        )  # fmt: skip

    def _record_unleased(self, job: _Job, ctx: RunContext, outcome: str, error: str | None) -> None:
        """A piece of work (no lease): the same run stream and state hash a run writes, so
        history, status and the watchdog see what the workers did."""
        code = _code(outcome)
        lease_settings = self.settings.lease
        record = self._record_fields(job, outcome, ctx.fencing_token, error)
        state = self._state_fields(job, ctx, outcome, code)
        keys = TaskKeys(lease_settings.prefix, lease_settings.scope, job.name)
        try:
            journal.record_unleased(
                self.record_client, keys, record, state, runs_maxlen=lease_settings.history_length
            )
        except RedisError as exc:
            job.logger.warning(f"could not record the run: {exc}", extra={"event": "record_failed"})


def _code(outcome: str) -> int:
    """The exit code a worker's outcome stands for in its log line and record: 1 for a task
    that raised, as a Python task's run; 0 for a skip held by another job (it is running)."""
    return exit_code(outcome, 1 if outcome == FAILED else 0)
