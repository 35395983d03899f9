"""One run, in phases: slot -> connect -> acquire -> decide -> keeper + task -> settle ->
record (docs/design.md, Decisions inside the lease, and Overlap policies).

What a run does when it may not simply run its slot (held, late, stale, paused, and the overlap
policies' waits) is decided in runner.run.policy; the slot and its marker's retention come from runner.schedule.slots. All
stopping logic lives here, in ordinary code: a stop signal only sets the flag (runner.signals).

A run that catches up runs the earlier slots it is given before its own, under the same lease
(runner.schedule.catchup chooses them); a run an operator asks for (``Asked``: trigger,
backfill) has its slot given (docs/design.md, Catch-up, trigger and backfill).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

from redis.exceptions import RedisError

from runner import clock
from runner.config.settings import REPLACE, SKIP, Settings
from runner.errors import (
    EXIT_TASK_FAILED,
    CronRunnerError,
    FinishIncomplete,
    LeaseNotOwned,
    StoreUnavailable,
    Terminated,
)
from runner.keys import TaskKeys
from runner.lease import journal
from runner.lease.keeper import Keeper
from runner.lease.scripts import (
    Acquired,
    AcquireResult,
    Finished,
    Lease,
    new_token,
    started_at_of,
)
from runner.lease.store import (
    open_connection,
    replicas_acknowledged,
    wait_reply_timeout_s,
    wait_timeout_ms,
    with_deadline,
)
from runner.logs import RunLogger, keeper_logger, run_logger
from runner.outcomes import (
    FAILED,
    LEASE_LOST,
    REPLACED,
    TERMINATED,
    TOO_LATE,
    UNAVAILABLE,
    exit_code,
)
from runner.run.observer import NullObserver, RunObserver
from runner.run.policy import RECORDED, RECORDED_WITHOUT_SLOT, Policy, Skip, overlap_wait_s
from runner.run.process import exit_now, reap_after_task
from runner.run.targets import LeftBehind, Target
from runner.schedule import catchup
from runner.schedule.markers import resolve_slot, retention_s
from runner.signals import Shutdown
from runner.tasks import RunContext

TICK_S = 0.05
# What a task is told when it is asked to stop (RunContext.cancel_reason).
_CANCEL_REASONS = {
    LEASE_LOST: "lease lost",
    TERMINATED: "shutdown requested",
    REPLACED: "replaced by a run of a newer slot",
}


def definition_of(settings: Settings, what: str) -> str:
    """The task's definition that every runner of it must share ('' without a schedule: a
    manual run has no slot to run twice). ``what`` is the mode and the command or task."""
    schedule = settings.slots.schedule
    if not schedule or not what:
        return ""
    definition = f"{what}, schedule '{' '.join(schedule.split())}' in {settings.slots.timezone}"
    # Only when not skip, so that a default task's definition is the one previous releases store.
    overlap = settings.lease.overlap_policy
    return definition if overlap == SKIP else f"{definition}, overlap {overlap}"


class Asked(NamedTuple):
    """A run an operator asked for, not the schedule: ``cron-runner trigger`` (slot None: a run
    now, recorded as triggered) or one slot of ``cron-runner backfill``. Its slot is given, so
    neither its age, the starting deadline nor catch-up applies; a backfilled slot writes its run
    record but not the task's state, which stays its latest slot's (docs/design.md, Catch-up,
    trigger and backfill)."""

    slot: int | None


class RunResult(NamedTuple):
    outcome: str
    exit_code: int
    fence: int | None = None
    reason: str | None = None

    @classmethod
    def of(cls, outcome: str, reason: str | None = None) -> RunResult:
        """An outcome with its fixed exit code (runner.outcomes)."""
        return cls(outcome, exit_code(outcome), reason=reason)


class Execution:
    """One run of ``target`` as task ``task_name``. ``exit_process`` ends the process when a
    task that cannot be killed ignores its cancellation (tests pass one that raises)."""

    def __init__(
        self,
        settings: Settings,
        client: Any,
        task_name: str,
        target: Target,
        shutdown: Shutdown,
        *,
        observer: RunObserver | None = None,
        what: str = "",
        exit_process: Callable[[int], NoReturn] = exit_now,
        asked: Asked | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.task_name = task_name
        self.target = target
        self.shutdown = shutdown
        self.exit_process = exit_process
        self.keys = TaskKeys(settings.lease.prefix, settings.lease.scope, task_name)
        overlap = settings.lease.overlap_policy
        # A skip counter on a slot that did not run is kept as long as a marker at the least.
        skip_keep_s = settings.lease.slot_retention_s or 3600.0
        # A trigger has no slot to run twice: its definition is not checked, as a manual run's.
        triggered = asked is not None and asked.slot is None
        self.lease = Lease(
            client,
            self.keys,
            new_token(settings.lease.holder),
            ttl_ms=settings.lease.ttl_ms,
            definition="" if triggered else definition_of(settings, what),
            redefine=settings.lease.redefine,
            runs_maxlen=settings.lease.history_length,
            overlap=overlap,
            aux_ms=int(overlap_wait_s(settings) * 1000) if overlap == REPLACE else 0,
            skip_ttl_ms=int(skip_keep_s * 1000),
            pause_after_failures=settings.lease.failures_before_pause,
        )
        self.log: RunLogger = run_logger(task_name, settings.lease.holder)
        self.policy = Policy(settings, self.log)
        self.where = settings.redis.display_target
        self.started_wall = 0.0
        self.started_mono = 0.0
        self.slot: int | None = None
        self.fence = 0
        self.observer: RunObserver = observer or NullObserver()
        self.keeper: Keeper | None = None
        self._sent_at = 0.0  # when the last acquire was sent: a won lease is confirmed from then
        self.asked = asked
        if asked is None:
            catchup.check_catchup(settings, self.lease.overlap)
        if asked is None and settings.slots.catches_up:
            # A slot skipped on purpose (paused, superseded, held by an earlier slot) is not
            # missed: its record on the marker must outlive the window, as a run's marker does.
            self.lease.skip_ttl_ms = int(retention_s(settings) * 1000)
        # Catch-up: the window's slots the acquire script judges, and those this run then runs.
        self._candidates: list[int] = []
        self._catching_up: tuple[int, ...] = ()

    # -- phases ---------------------------------------------------------------

    def run(self) -> RunResult:
        self.started_wall = clock.wall()
        self.started_mono = clock.monotonic()
        asked = self.asked
        self.slot = resolve_slot(self.settings, self.started_wall) if asked is None else asked.slot
        # The token names the slot: a runner of the same slot that finds it knows to wait.
        self.lease.token = new_token(self.settings.lease.holder, self.slot)
        self.observer.started(self.slot)
        try:
            result = self._run()
        except Exception as exc:
            # Left to the CLI, which maps the error to its exit code: the observers learn it too.
            code = exc.exit_code if isinstance(exc, CronRunnerError) else EXIT_TASK_FAILED
            self._observe_end(UNAVAILABLE if isinstance(exc, StoreUnavailable) else FAILED, code)
            raise
        self._observe_end(result.outcome, result.exit_code)
        return result

    def _observe_end(self, outcome: str, code: int) -> None:
        keeper = self.keeper
        self.observer.finished(
            outcome,
            code,
            renewals=keeper.renewals if keeper else 0,
            failed_renewals=keeper.failed_renewals if keeper else 0,
        )

    def _run(self) -> RunResult:
        self.log.bind(slot=self.slot if self.slot is not None else "manual")
        job = self.settings.slots.job_name
        self.log.info(
            f"start (manual run: Job {job!r} carries no scheduled time)"
            if job and self.slot is None
            else "start",
            extra={"event": "start"},
        )
        if self.shutdown.requested:
            return self._finish_log(RunResult.of(TERMINATED, self._stopped_before_start()))
        stale = self.policy.before_connect(self.slot, self.started_wall) if not self.asked else None
        if stale is not None:
            return self._skip(stale)
        try:
            decided = self._connect_and_acquire()
        except StoreUnavailable as exc:
            return self._finish_log(RunResult.of(UNAVAILABLE, str(exc)))
        except Terminated as exc:
            return self._finish_log(RunResult.of(TERMINATED, str(exc)))
        if isinstance(decided, Skip):
            return self._skip(decided)
        self._catching_up = catchup.chosen(self.settings.slots.catchup, decided.unrun)
        return self._finish_log(self._hold(decided.fence))

    def _stopped_before_start(self) -> str:
        return f"stopped by {self.shutdown.name} before the task started"

    def _stopping(self) -> bool:
        return self.shutdown.requested

    def _connect_and_acquire(self) -> Acquired | Skip:
        # Connecting and acquiring share the connect deadline: exit 69 comes within it.
        deadline = clock.monotonic() + self.settings.redis.connect_timeout_s
        with self.observer.phase("connect"):
            with_deadline(
                lambda: open_connection(self.client, self.keys.lease),
                deadline_s=deadline,
                what="connect",
                where=self.where,
                stop=self._stopping,
            )
        if self.asked is None:
            late = self.policy.before_acquire(self.slot, self.started_wall)
            if late is not None:
                return late
            self._candidates = catchup.candidates(self.settings, self.slot, clock.wall())
        with self.observer.phase("acquire"):
            reply = with_deadline(
                self._acquire, deadline_s=deadline, what="acquire", where=self.where,
                stop=self._stopping,
            )  # fmt: skip
            return self.policy.decide(reply, self.slot, self._look, self._stopping)

    def _acquire(self, *, final: bool = False) -> AcquireResult:
        self._sent_at = clock.monotonic()
        record = self._record("", 0, None)
        del record[journal.OUTCOME]  # the script adds it, and why, when it records a skip
        return self.lease.acquire(
            self.slot, catch_up=self._candidates, final=final, skip_record=record
        )

    def _look(self, *, final: bool = False) -> AcquireResult:
        """The acquire script again, for the policy: within a connect deadline of its own."""
        return with_deadline(
            lambda: self._acquire(final=final),
            deadline_s=clock.monotonic() + self.settings.redis.connect_timeout_s,
            what="acquire",
            where=self.where,
            stop=self._stopping,
        )

    def _skip(self, skip: Skip) -> RunResult:
        if skip.journal == RECORDED:
            self._safe_record(skip.outcome, skip.exit_code, skip.reason, with_state=False)
        elif skip.journal == RECORDED_WITHOUT_SLOT:
            self._safe_record(
                skip.outcome, skip.exit_code, skip.reason, with_state=False, with_slot=False
            )
        result = RunResult(skip.outcome, skip.exit_code, reason=skip.reason)
        return result if skip.logged else self._finish_log(result)

    def _hold(self, fence: int) -> RunResult:
        """The lease is ours: run the task under it, renewed by the keeper."""
        self.fence = fence
        self.log.bind(fence=fence)
        self.observer.acquired(fence)
        self._wait_replicas()
        self.log.info("acquired", extra={"event": "acquired"})
        self._record_taken_over()
        if self.shutdown.requested:
            # SIGTERM arrived while acquiring: give the lease back unused, the slot still open.
            with self.observer.phase("release"):
                self._release(TERMINATED, exit_code(TERMINATED), self._stopped_before_start())
            return RunResult.of(TERMINATED, self._stopped_before_start())
        lease_settings = self.settings.lease
        self.keeper = keeper = Keeper(
            self.lease,
            ttl_s=lease_settings.ttl_s,
            renew_interval_s=lease_settings.timings.replace_renew_interval_s
            if lease_settings.overlap_policy == REPLACE
            else None,
            confirmed_at=self._sent_at,
            on_renewed=self._renewed,
            logger=keeper_logger(self.log),
        ).start()
        return self._run_task(keeper, fence)

    def _record_taken_over(self) -> None:
        """A run of this slot held the lease and vanished without a marker (killed with kill -9,
        its node lost): this run took the lease over, and records that attempt as lost, from
        what its lease left (its holder and when it started). One round trip, on this path only.
        """
        held = self.policy.taken_over
        if held is None:
            return
        started = started_at_of(held.token)
        record = journal.run_record(
            slot=self.slot, holder=held.holder, fence=0, outcome=LEASE_LOST,
            exit_code=exit_code(LEASE_LOST), started_at_s=started or clock.wall(), duration_ms=0,
            error=f"this run ended without a record of its own (killed, or its node lost): its "
            f"lease expired, and {self.settings.lease.holder} took the slot over",
        )  # fmt: skip
        try:
            self.lease.record(record, {})
        except (RedisError, FinishIncomplete) as exc:
            self.log.warning(f"could not record the run: {exc}", extra={"event": "record_failed"})

    def _renewed(self) -> None:
        """On the keeper's thread: the command's supervisor may wait till the new expiry."""
        supervised = self.target.supervised
        if supervised is not None and self.keeper is not None:
            supervised.extend(self.keeper.expires_at)

    def _wait_replicas(self) -> None:
        wanted = self.settings.redis.min_replicas
        if wanted <= 0:
            return
        ttl_s = self.settings.lease.ttl_s
        timeout_ms = wait_timeout_ms(ttl_s)
        try:
            acked: int | None = replicas_acknowledged(
                self.client, self.keys.lease, wanted, timeout_ms, wait_reply_timeout_s(ttl_s)
            )
        except RedisError as exc:
            acked = None
            self.log.warning(f"WAIT failed: {exc}", extra={"event": "wait_failed"})
        if acked is None or acked < wanted:
            counted = (
                f"WAIT got no reply: unknown whether {wanted} replicas"
                if acked is None
                else f"only {acked} of {wanted} replicas"
            )
            reason = (
                f"{counted} acknowledged the lease within {timeout_ms} ms; "
                "released it without running (CRON_RUNNER_REDIS_MIN_REPLICAS)"
            )
            self._release(UNAVAILABLE, exit_code(UNAVAILABLE), reason)
            raise StoreUnavailable(reason)

    def _run_task(self, keeper: Keeper, fence: int) -> RunResult:
        # An enqueue target sends each slot to the workers: there they wait their turn.
        catching_up = getattr(self.target, "catching_up", None)
        if self._catching_up and catching_up is not None:
            catching_up()
        for slot in self._catching_up:
            ended = self._catch_up(keeper, fence, slot)
            if ended is not None:
                return ended
        # Current while the task starts, so a Python task's thread inherits it (targets.py).
        with self.observer.phase("task"):
            stop_reason = self._supervise(keeper, fence)
        return self._settle(keeper, stop_reason)

    # -- catch-up: earlier slots that never ran, before the run's own --------------------

    def _catch_up(self, keeper: Keeper, fence: int, slot: int) -> RunResult | None:
        """Run ``slot``, an earlier slot that never ran, under the lease held (same fence), and
        mark it done keeping the lease (docs/design.md, Catch-up, trigger and backfill).

        None: go on to the next slot. A slot that failed is recorded and left unmarked: each
        slot is a run of its own, as if it had fired on time, so the others still run, and a
        later run's catch-up tries it again within its window. A result ends the run, settled
        as the run's own slot would be: the lease was lost, a stop was asked, a command left
        processes that could not be stopped, or the slot could not be marked.
        """
        before = self._not_started(keeper)
        if before is not None:
            return before
        own, started = self.slot, (self.started_wall, self.started_mono)
        # The task is told this slot, and its record, state and log lines say it.
        self.slot = slot
        self.started_wall, self.started_mono = clock.wall(), clock.monotonic()
        self.log.bind(slot=slot)
        with self.observer.phase("catch_up"):
            stop_reason = self._supervise(keeper, fence)
        supervised = self.target.supervised
        left = supervised.left_behind() if supervised is not None else LeftBehind()
        if stop_reason is not None or keeper.is_lost() or left.survivors:
            return self._settle(keeper, stop_reason)
        self._left_behind(left, 0)
        code = self.target.exit_code()
        if code != 0:
            error = self.target.error()
            self._safe_record(FAILED, code, error)
            self._caught_up_log(RunResult(FAILED, code, reason=error))
        else:
            ended = self._mark_caught_up(keeper)
            if ended is not None:
                return ended
        self.slot, (self.started_wall, self.started_mono) = own, started
        self.log.bind(slot=own)
        return None

    def _not_started(self, keeper: Keeper) -> RunResult | None:
        """Between two slots: a stop asked, or the lease lost, ends the run before the next."""
        if self.shutdown.requested:
            keeper.stop()
            with self.observer.phase("release"):
                self._release(TERMINATED, exit_code(TERMINATED), self._stopped_before_start())
            return RunResult.of(TERMINATED, self._stopped_before_start())
        if keeper.is_lost():
            keeper.stop()
            with self.observer.phase("release"):
                self._release_quietly(LEASE_LOST, exit_code(LEASE_LOST), keeper.lost_reason)
            return RunResult.of(LEASE_LOST, keeper.lost_reason)
        return None

    def _mark_caught_up(self, keeper: Keeper) -> RunResult | None:
        done = self.target.outcome
        try:
            self._mark_done(done, 0, None, {"fence": self.fence}, keep_lease=True)
        except LeaseNotOwned as exc:
            keeper.stop()
            return RunResult.of(LEASE_LOST, str(exc))
        except FinishIncomplete as exc:
            # The slot ran and may be unmarked: end the run, whose own slot would fail alike,
            # and leave the lease to its TTL (a configuration to fix: exit 78).
            keeper.stop()
            self.log.error(str(exc), extra={"event": "finish_incomplete"})
            return RunResult(done, exc.exit_code, reason=str(exc))
        except StoreUnavailable:
            keeper.stop()
            raise
        self._caught_up_log(RunResult.of(done))
        return None

    def _caught_up_log(self, result: RunResult) -> None:
        """One line per slot caught up; the run's own slot ends with the 'finished' line."""
        self.log.log(
            logging.INFO if result.exit_code == 0 else logging.ERROR,
            f"caught up: {result.outcome}" + (f" ({result.reason})" if result.reason else ""),
            extra={"event": "caught_up", "outcome": result.outcome,
                   "exit_code": result.exit_code, "duration_ms": self._duration_ms()},
        )  # fmt: skip

    # -- the task -----------------------------------------------------------------------

    def _supervise(self, keeper: Keeper, fence: int) -> str | None:
        """Start the task and wait for it to stop; stop it on lease loss or shutdown."""
        ctx = RunContext(
            task=self.task_name,
            slot=self.slot,
            fencing_token=fence,
            holder=self.settings.lease.holder,
            logger=self.log,
            lease_valid=lambda: not keeper.is_lost(),
        )
        supervised = self.target.supervised
        if supervised is not None:
            supervised.extend(keeper.expires_at)
        self.target.start(ctx)
        kill_at: float | None = None
        stop_reason: str | None = None
        while not self.target.poll(TICK_S):
            if supervised is not None:
                supervised.reap()
            now = clock.monotonic()
            if stop_reason is None and keeper.is_lost():
                stop_reason = LEASE_LOST
                kill_at = keeper.expires_at
            elif stop_reason is None and self.shutdown.requested:
                stop_reason = TERMINATED
                kill_at = now + self.settings.run.shutdown_grace_s
            elif stop_reason is None and keeper.preempted is not None:
                # Stopped as on a stop request; the lease is kept until the task has stopped.
                stop_reason = REPLACED
                kill_at = now + self.settings.run.shutdown_grace_s
            elif stop_reason in (TERMINATED, REPLACED) and keeper.is_lost():
                # Shutting down, and now the lease is going too: it bounds the grace.
                kill_at = min(kill_at or now, keeper.expires_at)
            if stop_reason is not None and not ctx.cancelled.is_set():
                ctx.cancel(_CANCEL_REASONS[stop_reason])
                self.target.cancel()
                self.log.warning(
                    f"stopping the task: {ctx.cancel_reason}",
                    extra={"event": "stopping", "reason": keeper.lost_reason or ctx.cancel_reason},
                )
            if kill_at is not None and now >= kill_at:
                if not self.target.kill():
                    self._abandon(keeper, stop_reason or LEASE_LOST)
                self.log.warning("task killed", extra={"event": "killed"})
                break
        else:
            if (
                supervised is not None
                and self.target.exit_code() == 128 + signal.SIGKILL
                and clock.monotonic() >= keeper.expires_at
            ):
                # The supervisor got there first (a tick before us, or while we were frozen).
                self.log.warning(
                    "task killed by its supervisor at the lease's local expiry",
                    extra={"event": "killed"},
                )
        reap_after_task()
        return stop_reason

    def _abandon(self, keeper: Keeper, stop_reason: str) -> NoReturn:
        """A Python task ignored cancellation past its deadline: it cannot be killed in-process.
        Exit without releasing; the lease expires by its TTL, after this process is gone."""
        keeper.stop()
        code = exit_code(stop_reason)
        self.log.error(
            "the task did not stop and cannot be killed inside the process: exiting without "
            "releasing the lease, which expires by its TTL",
            extra={"event": "abandoned", "outcome": stop_reason, "exit_code": code},
        )
        self._safe_record(stop_reason, code, "task ignored cancellation")
        self._observe_end(stop_reason, code)
        self.observer.close()
        self.exit_process(code)

    def _settle(self, keeper: Keeper, stop_reason: str | None) -> RunResult:
        keeper.stop()
        code = self.target.exit_code()
        error = self.target.error()
        supervised = self.target.supervised
        if supervised is not None:
            kept = self._left_behind(supervised.left_behind(), code)
            if kept is not None:
                return kept
        if stop_reason == LEASE_LOST or keeper.is_lost():
            with self.observer.phase("release"):
                self._release_quietly(LEASE_LOST, exit_code(LEASE_LOST), keeper.lost_reason)
            return RunResult.of(LEASE_LOST, keeper.lost_reason)
        if stop_reason == TERMINATED:
            stopped = f"stopped by {self.shutdown.name}"
            with self.observer.phase("release"):
                # The record names the signal that came; the task's own end follows.
                self._release(
                    TERMINATED, exit_code(TERMINATED), f"{stopped} ({error})" if error else stopped
                )
            return RunResult.of(TERMINATED, stopped)
        if stop_reason == REPLACED and keeper.preempted is not None:
            return self._complete(REPLACED, str(keeper.preempted))
        if code != 0:
            with self.observer.phase("release"):
                self._release(FAILED, code, error, failure=True)
            return RunResult(FAILED, code, reason=error)
        return self._complete(self.target.outcome)

    def _complete(self, done: str, reason: str | None = None) -> RunResult:
        """Mark the slot done and release. ``done`` is the task's success (``ran``, ``enqueued``),
        or ``replaced``: stopped for a newer slot, whose slot must not run again either."""
        code = exit_code(done)
        marker: dict[str, str | int | float] = {"fence": self.fence}
        if done == REPLACED:
            marker["outcome"] = REPLACED
        try:
            self._mark_done(done, code, reason, marker, success=done != REPLACED)
        except LeaseNotOwned as exc:
            return RunResult.of(LEASE_LOST, str(exc))
        except FinishIncomplete as exc:
            # The task ran; what the finish could not write is a configuration to fix.
            self.log.error(str(exc), extra={"event": "finish_incomplete"})
            return RunResult(done, exc.exit_code, reason=str(exc))
        self.log.info("released", extra={"event": "released"})
        return RunResult.of(done, reason)

    def _mark_done(
        self,
        done: str,
        code: int,
        reason: str | None,
        marker: dict[str, str | int | float],
        *,
        keep_lease: bool = False,
        success: bool = True,
    ) -> None:
        """The 'complete' phase: the slot's marker, with the run's record and state."""
        # Only a completing run needs the retention: a CronJob pod's start stays free of the
        # schedule parser.
        retention_ms = int(retention_s(self.settings, self.log) * 1000)
        with self.observer.phase("complete"):
            self._store(
                lambda: self.lease.complete(
                    self.slot,
                    self._record(done, code, reason),
                    self._state(done, code),
                    marker,
                    retention_ms=retention_ms,
                    keep_lease=keep_lease,
                    success=success,
                )
            )

    def _left_behind(self, left: LeftBehind, code: int) -> RunResult | None:
        """Descendants left the command's group and came back to us: all were killed, or some
        cannot be confirmed stopped, and then the lease is kept (it expires by its TTL) so that
        no other holder starts beside them."""
        if not left.survivors:
            if left.stopped:
                self.log.warning(
                    f"stopped {len(left.stopped)} process(es) the command left outside its "
                    "process group",
                    extra={"event": "descendants_stopped", "pids": list(left.stopped)},
                )
            return None
        reason = (
            f"processes the command left outside its process group could not be confirmed "
            f"stopped: {list(left.survivors)}; the lease is kept and expires by its TTL"
        )
        self.log.error(reason, extra={"event": "descendants_not_stopped"})
        self._safe_record(FAILED, code or EXIT_TASK_FAILED, reason)
        return RunResult(FAILED, code or EXIT_TASK_FAILED, reason=reason)

    # -- Redis writes at the end of a run ----------------------------------------

    def _store(self, call: Any) -> Any:
        deadline = clock.monotonic() + self.settings.redis.connect_timeout_s
        return with_deadline(call, deadline_s=deadline, what="finish", where=self.where)

    def _release(
        self, outcome: str, code: int, error: str | None, *, failure: bool = False
    ) -> None:
        try:
            self._finished(
                self._store(
                    lambda: self.lease.release(
                        self._record(outcome, code, error),
                        self._state(outcome, code),
                        failure=failure,
                    )
                )
            )
            self.log.info("released", extra={"event": "released"})
        except LeaseNotOwned as exc:
            self.log.warning(f"release refused: {exc}", extra={"event": "release_refused"})
            self._safe_record(outcome, code, error)
        except StoreUnavailable as exc:
            self.log.error(
                f"could not release; the lease expires by its TTL: {exc}",
                extra={"event": "release_failed"},
            )
        except FinishIncomplete as exc:
            self.log.error(str(exc), extra={"event": "finish_incomplete"})

    def _release_quietly(self, outcome: str, code: int, error: str | None) -> None:
        """After a loss the lease is most likely someone else's: release only if still ours."""
        try:
            self._finished(
                self.lease.release(self._record(outcome, code, error), self._state(outcome, code))
            )
            self.log.info("released", extra={"event": "released"})
        except LeaseNotOwned:
            self._safe_record(outcome, code, error)
        except (RedisError, FinishIncomplete) as exc:
            self.log.warning(f"could not record the run: {exc}", extra={"event": "record_failed"})

    def _safe_record(
        self,
        outcome: str,
        code: int,
        error: str | None,
        *,
        with_state: bool = True,
        with_slot: bool = True,
    ) -> None:
        state = self._state(outcome, code) if with_state else {}
        record = self._record(outcome, code, error)
        if not with_slot:
            record["slot"] = ""
        try:
            self._finished(self.lease.record(record, state))
        except (RedisError, FinishIncomplete) as exc:
            self.log.warning(f"could not record the run: {exc}", extra={"event": "record_failed"})

    def _finished(self, finished: Finished) -> None:
        if finished.paused:
            self.log.warning(
                f"paused the task after {self.lease.pause_after_failures} consecutive failures: "
                "no slot runs until `cron-runner resume`",
                extra={"event": "paused"},
            )
        if finished.stale_state:
            self.log.warning(
                "the task's state was left as it is: a newer holder (a higher fence) wrote it",
                extra={"event": "state_kept"},
            )

    # -- what is written ----------------------------------------------------------

    def _duration_ms(self) -> int:
        return int((clock.monotonic() - self.started_mono) * 1000)

    def _record(self, outcome: str, code: int, error: str | None) -> dict[str, str | int | float]:
        asked = self.asked
        return journal.run_record(
            trigger=self.settings.lease.holder if asked and asked.slot is None else None,
            backfill=self.settings.lease.holder if asked and asked.slot is not None else None,
            slot=self.slot,
            holder=self.settings.lease.holder,
            fence=self.fence,
            outcome=outcome,
            exit_code=code,
            started_at_s=self.started_wall,
            duration_ms=self._duration_ms(),
            error=error,
        )

    def _state(self, outcome: str, code: int) -> dict[str, str | int | float]:
        if self.asked is not None and self.asked.slot is not None:
            # A backfilled slot is older than the task's latest: written here, it would move the
            # last success back, and status and the watchdog would count every slot since missed.
            return {}
        return journal.state(
            outcome=outcome,
            exit_code=code,
            fence=self.fence,
            holder=self.settings.lease.holder,
            slot=self.slot,
            at_s=clock.wall(),
            duration_ms=self._duration_ms(),
            schedule=self.settings.slots.schedule,
            timezone=self.settings.slots.timezone,
            max_runtime_s=self.settings.run.max_runtime_s,
        )

    def _finish_log(self, result: RunResult) -> RunResult:
        level = logging.INFO if result.exit_code == 0 else logging.ERROR
        # too_late exits 0, yet the slot did not run: a line that is always late must show.
        if result.outcome in (TERMINATED, TOO_LATE):
            level = logging.WARNING
        self.log.log(
            level,
            f"finished: {result.outcome}" + (f" ({result.reason})" if result.reason else ""),
            extra={"event": "terminated" if result.outcome == TERMINATED else "finished",
                   "outcome": result.outcome, "exit_code": result.exit_code,
                   "duration_ms": self._duration_ms()},
        )  # fmt: skip
        return result
