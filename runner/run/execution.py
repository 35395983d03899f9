"""One run: slot -> connect -> acquire -> keeper + task -> complete or release -> record
(docs/design.md).

All stopping logic lives here, in ordinary code: the signal handlers only set a flag.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from types import FrameType
from typing import Any, NamedTuple, NoReturn, Protocol

from redis.exceptions import RedisError

from runner import clock
from runner.config.settings import Settings
from runner.errors import (
    EXIT_LEASE_LOST,
    EXIT_TASK_FAILED,
    EXIT_TERMINATED,
    ConfigError,
    FinishIncomplete,
    LeaseLost,
    LeaseNotOwned,
    StoreUnavailable,
    Terminated,
)
from runner.keys import TaskKeys
from runner.lease.keeper import Keeper
from runner.lease.scripts import Acquired, Finished, Held, Lease, SlotDone, new_token
from runner.lease.store import (
    open_connection,
    replicas_acknowledged,
    wait_reply_timeout_s,
    wait_timeout_ms,
    with_deadline,
)
from runner.logs import RunLogger, keeper_logger, run_logger
from runner.run.targets import CommandTarget, Target, reap_orphans
from runner.schedule import slots
from runner.tasks import RunContext

TICK_S = 0.05
ONE_HOUR_S = 3600.0
FALLBACK_RETENTION_S = 7 * 24 * ONE_HOUR_S

# Outcomes, as recorded in the run stream and counted by telemetry.
RAN = "ran"
ENQUEUED = "enqueued"  # queue mode: the slot's message was sent; a worker runs it
SKIPPED_HELD = "skipped_held"
SKIPPED_DONE = "skipped_done"
SKIPPED_STALE = "skipped_stale"  # a CronJob slot older than its marker retention
FAILED = "failed"
LEASE_LOST = "lease_lost"
TERMINATED = "terminated"
UNAVAILABLE = "unavailable"
TOO_LATE = "too_late"  # a server's run that started past the starting deadline of its slot


# Each asks the run to stop as SIGTERM does: the task stopped, the lease released, exit 143.
# Left at their defaults, SIGHUP (a closed terminal or ssh session), SIGQUIT and SIGUSR1/2
# would kill the runner on the spot and leave its command running and its lease held.
STOP_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


class Shutdown:
    """A stop signal (STOP_SIGNALS) sets a flag; nothing else happens in the handler."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        self.count += 1

    def install(self) -> Shutdown:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        return self

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "a signal"


class HolderAlive(NamedTuple):
    """A run of the same slot holds the lease and was seen renewing it: it is running."""

    held: Held


class HolderUnconfirmed(NamedTuple):
    """A run of the same slot holds the lease, neither renewed nor gone within the wait."""

    held: Held


def definition_of(settings: Settings, what: str) -> str:
    """The task's definition that every runner of it must share ('' without a schedule: a
    manual run has no slot to run twice). ``what`` is the mode and the command or task."""
    schedule = settings.slots.schedule
    if not schedule or not what:
        return ""
    return f"{what}, schedule '{' '.join(schedule.split())}' in {settings.slots.timezone}"


class RunResult(NamedTuple):
    outcome: str
    exit_code: int
    fence: int | None = None
    reason: str | None = None


class RunObserver(Protocol):
    """What a run tells an observer (telemetry) as it goes. Called on the run's own thread."""

    def started(self, slot: int | None) -> None: ...

    def phase(self, name: str) -> AbstractContextManager[object]:
        """Around 'connect', 'acquire', 'task', 'complete' and 'release'."""
        ...

    def acquired(self, fence: int) -> None: ...

    def finished(
        self, outcome: str, exit_code: int, *, renewals: int, failed_renewals: int
    ) -> None: ...

    def close(self) -> None:
        """Deliver what was observed, within a bounded time."""
        ...


class NullObserver:
    """The default: telemetry off."""

    def started(self, slot: int | None) -> None:
        pass

    def phase(self, name: str) -> AbstractContextManager[object]:
        return nullcontext()

    def acquired(self, fence: int) -> None:
        pass

    def finished(
        self, outcome: str, exit_code: int, *, renewals: int, failed_renewals: int
    ) -> None:
        pass

    def close(self) -> None:
        pass


class Observers:
    """Tells every observer the same things (telemetry and pings together)."""

    def __init__(self, *observers: RunObserver) -> None:
        self.observers = observers

    def started(self, slot: int | None) -> None:
        for o in self.observers:
            o.started(slot)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with ExitStack() as stack:
            for o in self.observers:
                stack.enter_context(o.phase(name))
            yield

    def acquired(self, fence: int) -> None:
        for o in self.observers:
            o.acquired(fence)

    def finished(
        self, outcome: str, exit_code: int, *, renewals: int, failed_renewals: int
    ) -> None:
        for o in self.observers:
            o.finished(outcome, exit_code, renewals=renewals, failed_renewals=failed_renewals)

    def close(self) -> None:
        for o in self.observers:
            o.close()


class PingHook(NullObserver):
    """CRON_RUNNER_PING_URL: runner.run.ping is imported once the run takes its lease (or ends
    without one, Redis unreachable), never for a replica that skips."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.pinger: Any = None

    def _pinger(self) -> Any:
        if self.pinger is None:
            from runner.run.ping import Pinger  # noqa: PLC0415 - only when a run pings

            self.pinger = Pinger(self.url, self.timeout_s)
        return self.pinger

    def acquired(self, fence: int) -> None:
        self._pinger().start()

    def finished(
        self, outcome: str, exit_code: int, *, renewals: int, failed_renewals: int
    ) -> None:
        if outcome in (SKIPPED_HELD, SKIPPED_DONE):
            return
        self._pinger().finish(exit_code)

    def close(self) -> None:
        if self.pinger is not None:
            self.pinger.close()


def resolve_slot(settings: Settings, now_s: float) -> int | None:
    """The run's slot: the CronJob's (Job name, scheduled-timestamp annotation), else the
    schedule's at ``now_s``, else None (a manual run). A CronJob slot later than now plus the
    skew tolerance is refused: running it would mark a slot done before its time."""
    s = settings.slots
    if s.job_name or s.scheduled_at_s is not None:
        slot = _cronjob_slot(s.job_name, s.cronjob_name, s.scheduled_at_s)
        if slot is not None and slot > now_s + s.skew_tolerance_s:
            raise ConfigError(
                f"{_slot_origin(s.job_name, s.scheduled_at_s)} names the slot {_utc(slot)}, "
                f"later than now ({_utc(now_s)}) plus the skew tolerance "
                f"({s.skew_tolerance_s:g}s): not run, nothing written. Expected the CronJob "
                "controller's Job name <cronjob>-<scheduled minute since the epoch>"
            )
        return slot
    if s.schedule:
        return slots.Schedule.parse(s.schedule, s.timezone, s.skew_tolerance_s).slot_for(now_s)
    return None


def _cronjob_slot(
    job_name: str | None, cronjob_name: str | None, scheduled_at_s: float | None
) -> int | None:
    named = slots.slot_from_job_name(job_name, cronjob_name) if job_name else None
    if scheduled_at_s is None:
        return named
    # The annotation has seconds, the name minutes (the controller's getTimeHashInMinutes):
    # the slot stays the name's minute, the one the previous release used too.
    annotated = int(scheduled_at_s // 60) * 60
    if not slots.MIN_SLOT_MINUTES <= annotated // 60 < slots.MAX_SLOT_MINUTES:
        raise ConfigError(
            f"CRON_RUNNER_SCHEDULED_TIMESTAMP says {_utc(max(scheduled_at_s, 0.0))}: expected a "
            "time from 2015 to 2160, as the CronJob controller writes"
        )
    if named is not None and named != annotated:
        raise ConfigError(
            f"CRON_RUNNER_JOB_NAME={job_name!r} names the slot {_utc(named)} but "
            f"CRON_RUNNER_SCHEDULED_TIMESTAMP (batch.kubernetes.io/cronjob-scheduled-timestamp) "
            f"says {_utc(scheduled_at_s)}: expected both from the CronJob controller, agreeing "
            "to the minute"
        )
    return annotated


def _slot_origin(job_name: str | None, scheduled_at_s: float | None) -> str:
    if job_name:
        return f"CRON_RUNNER_JOB_NAME={job_name!r}"
    return f"CRON_RUNNER_SCHEDULED_TIMESTAMP ({_utc(scheduled_at_s or 0.0)})"


def _utc(t_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_s))


def stale_slot_reason(settings: Settings, slot: int | None, now_s: float) -> str | None:
    """Why a CronJob slot is too old to run, or None. Past its marker's retention, the marker
    of a run that did happen may have expired: the slot cannot be proven unrun."""
    s = settings.slots
    if slot is None or not (s.job_name or s.scheduled_at_s is not None):
        return None
    age_s = now_s - slot
    explicit = settings.lease.slot_retention_s
    # A computed retention is never below an hour: younger slots need no schedule parsing,
    # so a CronJob pod's start stays free of the schedule machinery.
    if age_s <= (explicit if explicit is not None else ONE_HOUR_S):
        return None
    keep_s = retention_s(settings)
    if age_s <= keep_s:
        return None
    return (
        f"slot {_utc(slot)} is {age_s:.0f}s old, older than its marker's retention "
        f"({keep_s:g}s): a run of it may have happened and its marker expired, so it is not run"
    )


def retention_s(settings: Settings, log: RunLogger | None = None) -> float:
    if settings.lease.slot_retention_s is not None:
        return settings.lease.slot_retention_s
    s = settings.slots
    if s.schedule:
        # With a Job name the tolerance plays no part (and was not checked at start).
        tolerance_s = 0.0 if s.job_name else s.skew_tolerance_s
        try:
            return slots.Schedule.parse(s.schedule, s.timezone, tolerance_s).retention_s
        except ConfigError as exc:
            # Only with a Job name (else the schedule was checked at start). Kubernetes'
            # `@every 1h` has no slots we can compute, but a delay: twice it, as for a gap.
            every_s = slots.every_retention_s(s.schedule)
            if every_s is not None:
                return every_s
            # Anything else the runner cannot read: the task has run, so keep the marker long
            # rather than fail the run and leave its lease to expire.
            if log is not None:
                log.warning(
                    f"CRON_RUNNER_SCHEDULE: {exc}; slot markers are kept {FALLBACK_RETENTION_S:g}s",
                    extra={"event": "retention_fallback"},
                )
            return FALLBACK_RETENTION_S
    # A Job-name slot without a schedule: a day covers any CronJob retry window.
    return 24 * ONE_HOUR_S


class Execution:
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
    ) -> None:
        self.settings = settings
        self.client = client
        self.task_name = task_name
        self.target = target
        self.shutdown = shutdown
        self.keys = TaskKeys(settings.lease.prefix, settings.lease.scope, task_name)
        self.lease = Lease(
            client,
            self.keys,
            new_token(settings.lease.holder),
            ttl_ms=settings.lease.ttl_ms,
            definition=definition_of(settings, what),
            redefine=settings.lease.redefine,
            runs_maxlen=settings.lease.history_length,
        )
        self.log: RunLogger = run_logger(task_name, settings.lease.holder)
        self.where = settings.redis.display_target
        self.started_wall = 0.0
        self.started_mono = 0.0
        self.slot: int | None = None
        self.fence = 0
        self.observer: RunObserver = observer or NullObserver()
        self.keeper: Keeper | None = None

    # -- phases ---------------------------------------------------------------

    def run(self) -> RunResult:
        self.started_wall = clock.wall()
        self.started_mono = clock.monotonic()
        self.slot = resolve_slot(self.settings, self.started_wall)
        # The token names the slot: a runner of the same slot that finds it knows to wait.
        self.lease.token = new_token(self.settings.lease.holder, self.slot)
        self.observer.started(self.slot)
        try:
            result = self._run()
        except Exception as exc:
            code = getattr(exc, "exit_code", 1)
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
        not_started = self._not_started()
        if not_started is not None:
            return self._finish_log(not_started)

        # Connecting and acquiring share the connect deadline: exit 69 comes within it.
        deadline = clock.monotonic() + self.settings.redis.connect_timeout_s
        sent_at = [0.0]
        got: Acquired | Held | SlotDone | HolderAlive | HolderUnconfirmed | RunResult

        def acquire() -> Acquired | Held | SlotDone:
            sent_at[0] = clock.monotonic()
            return self.lease.acquire(self.slot)

        stopping = lambda: self.shutdown.requested  # noqa: E731
        try:
            with self.observer.phase("connect"):
                with_deadline(
                    lambda: open_connection(self.client, self.keys.lease),
                    deadline_s=deadline,
                    what="connect",
                    where=self.where,
                    stop=stopping,
                )
            late_s = self._late_s()
            if late_s is not None:
                got = self._too_late(late_s)
            else:
                with self.observer.phase("acquire"):
                    got = with_deadline(
                        acquire, deadline_s=deadline, what="acquire", where=self.where,
                        stop=stopping,
                    )  # fmt: skip
                    if isinstance(got, Held) and self.slot is not None and got.slot == self.slot:
                        got = self._wait_for_holder(got, acquire, stopping)
        except StoreUnavailable as exc:
            return self._finish_log(
                RunResult(UNAVAILABLE, StoreUnavailable.exit_code, reason=str(exc))
            )
        except Terminated as exc:
            return self._finish_log(RunResult(TERMINATED, EXIT_TERMINATED, reason=str(exc)))

        if not isinstance(got, Acquired):
            return self._finish_log(got) if isinstance(got, RunResult) else self._skipped(got)

        self.fence = got.fence
        self.log.bind(fence=got.fence)
        self.observer.acquired(got.fence)
        self._wait_replicas()
        self.log.info("acquired", extra={"event": "acquired"})
        if self.shutdown.requested:
            # SIGTERM arrived while acquiring: give the lease back unused, the slot still open.
            with self.observer.phase("release"):
                self._release(TERMINATED, EXIT_TERMINATED, "terminated before the task started")
            return self._finish_log(
                RunResult(TERMINATED, EXIT_TERMINATED, reason="terminated before start")
            )
        self.keeper = keeper = Keeper(
            self.lease,
            ttl_s=self.settings.lease.ttl_s,
            confirmed_at=sent_at[0],
            on_renewed=self._renewed,
            logger=keeper_logger(self.log),
        ).start()
        return self._finish_log(self._run_task(keeper, got.fence))

    def _renewed(self) -> None:
        """On the keeper's thread: the command's supervisor may wait till the new expiry."""
        if isinstance(self.target, CommandTarget) and self.keeper is not None:
            self.target.extend(self.keeper.expires_at)

    # -- a holder of the same slot --------------------------------------------------

    def _wait_for_holder(
        self, held: Held, acquire: Any, stopping: Any
    ) -> Acquired | SlotDone | Held | HolderAlive | HolderUnconfirmed:
        """Wait for a holder of this very slot to finish (skip: done), renew (skip: it runs,
        and its own Job retries if it dies later) or vanish without a marker (take over).

        Skipping at once would lose the slot when that holder was killed: its lease stays
        until the TTL, and a retry that finds it would exit 0 with nothing run (issue 11).
        Each look is the acquire script again, one round trip.
        """
        wait_s = self.settings.lease.held_wait
        until = clock.monotonic() + wait_s
        poll_s = max(TICK_S, min(1.0, self.settings.lease.ttl_s / 12))
        self.log.info(
            f"waiting: a run of this slot holds the lease; waiting up to {wait_s:g}s for it to "
            "finish, renew or expire (CRON_RUNNER_HELD_WAIT)",
            extra={"event": "waiting", "run_holder": held.holder, "ttl_ms": held.ttl_ms},
        )
        seen = held
        while True:
            next_look = clock.monotonic() + poll_s
            while clock.monotonic() < next_look:
                if stopping():
                    raise Terminated("stopped while waiting for the slot's holder")
                time.sleep(TICK_S)
            if clock.monotonic() >= until:
                return HolderUnconfirmed(seen)
            got: Acquired | Held | SlotDone = with_deadline(
                acquire,
                deadline_s=clock.monotonic() + self.settings.redis.connect_timeout_s,
                what="acquire",
                where=self.where,
                stop=stopping,
            )
            if not isinstance(got, Held):
                return got  # taken over (the holder is gone, no marker), or done
            if got.slot != self.slot:
                return got  # another slot's run: ours is not running, and cannot now
            if got.token == seen.token and got.ttl_ms > seen.ttl_ms:
                return HolderAlive(got)  # renewed since the last look: it is running
            seen = got  # the same holder running down, or a new holder of this slot

    def _skipped(self, got: Held | SlotDone | HolderAlive | HolderUnconfirmed) -> RunResult:
        if isinstance(got, HolderUnconfirmed):
            reason = (
                f"a run of this slot by {got.held.holder} holds the lease and neither renewed nor "
                f"released it within {self.settings.lease.held_wait:g}s (CRON_RUNNER_HELD_WAIT): "
                "not run, and not reported done"
            )
            self.log.warning(
                reason,
                extra={"event": "skipped", "outcome": SKIPPED_HELD,
                       "exit_code": LeaseLost.exit_code, "run_holder": got.held.holder},
            )  # fmt: skip
            return RunResult(SKIPPED_HELD, LeaseLost.exit_code, reason=reason)
        if isinstance(got, HolderAlive):
            self.log.info(
                "skipped: a run of this slot holds the lease and renews it",
                extra={"event": "skipped", "outcome": SKIPPED_HELD, "exit_code": 0,
                       "run_holder": got.held.holder, "ttl_ms": got.held.ttl_ms},
            )  # fmt: skip
            return RunResult(SKIPPED_HELD, 0, reason=f"running at {got.held.holder}")
        if isinstance(got, Held):
            self.log.info(
                "skipped: another holder has the lease",
                extra={"event": "skipped", "outcome": SKIPPED_HELD, "exit_code": 0,
                       "run_holder": got.holder, "ttl_ms": got.ttl_ms},
            )  # fmt: skip
            return RunResult(SKIPPED_HELD, 0, reason=f"held by {got.holder}")
        finished = (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(got.finished_at))
            if got.finished_at
            else "unknown"
        )
        self.log.info(
            "skipped: this slot already ran",
            extra={"event": "skipped", "outcome": SKIPPED_DONE, "exit_code": 0,
                   "run_holder": got.holder, "finished_at": finished},
        )  # fmt: skip
        return RunResult(SKIPPED_DONE, 0, reason=f"slot done by {got.holder} at {finished}")

    # -- a server's run past its slot's starting deadline ------------------------------

    def _late_s(self) -> float | None:
        """How late past the starting deadline a schedule slot starts, None if in time.

        Only without a Job name: a CronJob pod's lateness is bounded by the controller's own
        startingDeadlineSeconds. A crontab line whose schedule or zone disagrees with the
        fleet's, or a timer catching up, computes a slot hours old: it must not run it.
        """
        s = self.settings.slots
        if s.job_name or s.scheduled_at_s is not None or not s.schedule or self.slot is None:
            return None
        late_s = self.started_wall - self.slot
        return late_s if late_s > s.starting_deadline_s else None

    def _too_late(self, late_s: float) -> RunResult:
        slots = self.settings.slots
        reason = (
            f"started {late_s:.0f}s after its slot, past the starting deadline of "
            f"{slots.starting_deadline_s:g}s (CRON_RUNNER_STARTING_DEADLINE): not run. If cron "
            f"fired it on time, its schedule is read in another time zone than {slots.timezone}: "
            "a crontab fires in the server's local time, so give that zone with --timezone "
            "(CRON_RUNNER_TIMEZONE)"
        )
        # Recorded in the run stream only: the state hash is the runs' (no fence was taken).
        self._safe_record(TOO_LATE, 0, reason, with_state=False)
        return RunResult(TOO_LATE, 0, reason=reason)

    def _not_started(self) -> RunResult | None:
        """Why the run stops before connecting: a stop request, or a slot too old to run."""
        if self.shutdown.requested:
            return RunResult(TERMINATED, EXIT_TERMINATED, reason="terminated before start")
        stale = stale_slot_reason(self.settings, self.slot, self.started_wall)
        return None if stale is None else self._skip_stale(stale)

    def _skip_stale(self, reason: str) -> RunResult:
        """Recorded in the run stream only, and without its slot: status and the watchdog go on
        from the last plausible run (so they report this slot as missed)."""
        record = {**self._record(SKIPPED_STALE, 0, reason), "slot": ""}
        try:
            self._finished(self.lease.record(record, {}))
        except (RedisError, FinishIncomplete) as exc:
            self.log.warning(f"could not record the run: {exc}", extra={"event": "record_failed"})
        return RunResult(SKIPPED_STALE, 0, reason=reason)

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
            self._release(UNAVAILABLE, StoreUnavailable.exit_code, reason)
            raise StoreUnavailable(reason)

    def _run_task(self, keeper: Keeper, fence: int) -> RunResult:
        # Current while the task starts, so a Python task's thread inherits it (targets.py).
        with self.observer.phase("task"):
            stop_reason = self._supervise(keeper, fence)
        return self._settle(keeper, stop_reason)

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
        command = self.target if isinstance(self.target, CommandTarget) else None
        if command is not None:
            command.lease_expires_at = keeper.expires_at
        self.target.start(ctx)
        # As PID 1 or a subreaper, exited orphans are ours to reap. While a command runs,
        # every other child is one (or the command's supervisor, which we may reap too). A
        # Python task's children are its own: reaping them would steal their exit codes from
        # its subprocess calls, so as PID 1 they wait till it ends.
        reap_during = command is not None and (os.getpid() == 1 or command.adopting)
        keep_pid = command.pid if command is not None else None
        kill_at: float | None = None
        stop_reason: str | None = None
        while not self.target.poll(TICK_S):
            if reap_during:
                reap_orphans(keep_pid)
            now = clock.monotonic()
            if stop_reason is None and keeper.is_lost():
                stop_reason = LEASE_LOST
                kill_at = keeper.expires_at
            elif stop_reason is None and self.shutdown.requested:
                stop_reason = TERMINATED
                kill_at = now + self.settings.run.shutdown_grace_s
            elif stop_reason == TERMINATED and keeper.is_lost():
                # Shutting down, and now the lease is going too: it bounds the grace.
                kill_at = min(kill_at or now, keeper.expires_at)
            if stop_reason is not None and not ctx.cancelled.is_set():
                ctx.cancel("lease lost" if stop_reason == LEASE_LOST else "shutdown requested")
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
                command is not None
                and command.exit_code() == 128 + signal.SIGKILL
                and clock.monotonic() >= keeper.expires_at
            ):
                # The supervisor got there first (a tick before us, or while we were frozen).
                self.log.warning(
                    "task killed by its supervisor at the lease's local expiry",
                    extra={"event": "killed"},
                )
        if os.getpid() == 1:
            reap_orphans(None)
        return stop_reason

    def _abandon(self, keeper: Keeper, stop_reason: str) -> NoReturn:
        """A Python task ignored cancellation past its deadline: it cannot be killed in-process.
        Exit without releasing; the lease expires by its TTL, after this process is gone."""
        keeper.stop()
        code = EXIT_LEASE_LOST if stop_reason == LEASE_LOST else EXIT_TERMINATED
        self.log.error(
            "the task did not stop and cannot be killed inside the process: exiting without "
            "releasing the lease, which expires by its TTL",
            extra={"event": "abandoned", "outcome": stop_reason, "exit_code": code},
        )
        self._safe_record(stop_reason, code, "task ignored cancellation")
        self._observe_end(stop_reason, code)
        self.observer.close()
        logging.shutdown()
        os._exit(code)

    def _settle(self, keeper: Keeper, stop_reason: str | None) -> RunResult:
        keeper.stop()
        code = self.target.exit_code()
        error = self.target.error()
        if isinstance(self.target, CommandTarget) and self.target.adopted:
            kept = self._adopted(self.target, code)
            if kept is not None:
                return kept
        if stop_reason == LEASE_LOST or keeper.is_lost():
            with self.observer.phase("release"):
                self._release_quietly(LEASE_LOST, EXIT_LEASE_LOST, keeper.lost_reason)
            return RunResult(LEASE_LOST, EXIT_LEASE_LOST, reason=keeper.lost_reason)
        if stop_reason == TERMINATED:
            with self.observer.phase("release"):
                self._release(TERMINATED, EXIT_TERMINATED, error)
            return RunResult(TERMINATED, EXIT_TERMINATED, reason=f"stopped by {self.shutdown.name}")
        if code != 0:
            with self.observer.phase("release"):
                self._release(FAILED, code, error)
            return RunResult(FAILED, code, reason=error)
        return self._complete(getattr(self.target, "outcome", RAN))

    def _complete(self, done: str) -> RunResult:
        # Only a completing run needs the retention: a CronJob pod's start stays free of croniter.
        self.lease.retention_ms = int(retention_s(self.settings, self.log) * 1000)
        try:
            with self.observer.phase("complete"):
                self._store(
                    lambda: self.lease.complete(
                        self.slot,
                        self._record(done, 0, None),
                        self._state(done, 0),
                        {"fence": self.fence},
                    )
                )
        except LeaseNotOwned as exc:
            return RunResult(LEASE_LOST, EXIT_LEASE_LOST, reason=str(exc))
        except FinishIncomplete as exc:
            # The task ran; what the finish could not write is a configuration to fix.
            self.log.error(str(exc), extra={"event": "finish_incomplete"})
            return RunResult(done, exc.exit_code, reason=str(exc))
        self.log.info("released", extra={"event": "released"})
        return RunResult(done, 0)

    def _adopted(self, command: CommandTarget, code: int) -> RunResult | None:
        """Descendants left the command's group and came back to us: all were killed, or some
        cannot be confirmed stopped, and then the lease is kept (it expires by its TTL) so that
        no other holder starts beside them."""
        pids = sorted(command.outside)
        if not command.survivors:
            if not pids:
                return None  # only the group's own, killed with it
            self.log.warning(
                f"stopped {len(pids)} process(es) the command left outside its process group",
                extra={"event": "descendants_stopped", "pids": pids},
            )
            return None
        reason = (
            f"processes the command left outside its process group could not be confirmed "
            f"stopped: {command.survivors}; the lease is kept and expires by its TTL"
        )
        self.log.error(reason, extra={"event": "descendants_not_stopped"})
        self._safe_record(FAILED, code or EXIT_TASK_FAILED, reason)
        return RunResult(FAILED, code or EXIT_TASK_FAILED, reason=reason)

    # -- Redis writes at the end of a run ----------------------------------------

    def _store(self, call: Any) -> Any:
        deadline = clock.monotonic() + self.settings.redis.connect_timeout_s
        return with_deadline(call, deadline_s=deadline, what="finish", where=self.where)

    def _release(self, outcome: str, code: int, error: str | None) -> None:
        try:
            self._finished(
                self._store(
                    lambda: self.lease.release(
                        self._record(outcome, code, error), self._state(outcome, code)
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
        self, outcome: str, code: int, error: str | None, *, with_state: bool = True
    ) -> None:
        state = self._state(outcome, code) if with_state else {}
        try:
            self._finished(self.lease.record(self._record(outcome, code, error), state))
        except (RedisError, FinishIncomplete) as exc:
            self.log.warning(f"could not record the run: {exc}", extra={"event": "record_failed"})

    def _finished(self, finished: Finished) -> None:
        if finished.stale_state:
            self.log.warning(
                "the task's state was left as it is: a newer holder (a higher fence) wrote it",
                extra={"event": "state_kept"},
            )

    # -- what is written ----------------------------------------------------------

    def _duration_ms(self) -> int:
        return int((clock.monotonic() - self.started_mono) * 1000)

    def _record(self, outcome: str, code: int, error: str | None) -> dict[str, str | int | float]:
        record: dict[str, str | int | float] = {
            "slot": "" if self.slot is None else self.slot,
            "holder": self.settings.lease.holder,
            "fence": self.fence,
            "outcome": outcome,
            "exit_code": code,
            "started_at": f"{self.started_wall:.3f}",
            "duration_ms": self._duration_ms(),
        }
        if error:
            record["error"] = error[:500]
        return record

    def _state(self, outcome: str, code: int) -> dict[str, str | int | float]:
        now = f"{clock.wall():.3f}"
        state: dict[str, str | int | float] = {
            "last_run_at": now,
            "last_outcome": outcome,
            "last_fence": self.fence,
            "last_holder": self.settings.lease.holder,
        }
        if self.slot is not None:
            state["last_slot"] = self.slot
        if self.settings.slots.schedule:
            state["schedule"] = self.settings.slots.schedule
            state["timezone"] = self.settings.slots.timezone
        if self.settings.run.max_runtime_s:
            state["max_runtime_ms"] = int(self.settings.run.max_runtime_s * 1000)
        # An enqueue is not the task's success: the worker records that when the job runs.
        prefix = {RAN: "last_success", ENQUEUED: "last_enqueued"}.get(outcome, "last_failure")
        state[f"{prefix}_at"] = now
        state[f"{prefix}_duration_ms"] = self._duration_ms()
        if self.slot is not None:
            state[f"{prefix}_slot"] = self.slot
        if outcome not in (RAN, ENQUEUED):
            state["last_failure_outcome"] = outcome
            state["last_failure_exit_code"] = code
        return state

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
