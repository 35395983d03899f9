"""What a run does when it may not simply run its slot (docs/design.md, Decisions inside the
lease): the slot is too old to prove unrun, the run starts past its slot's starting deadline,
or the lease is held.

Execution (runner.run.execution) asks at three points of its phases and acts on the answer:

* ``before_connect``: a CronJob slot older than its marker's retention: skipped_stale.
* ``before_acquire``: a schedule's slot started past its starting deadline: too_late.
* ``decide``: the acquire script's reply: Acquired (run it), or a Skip. A run of this very
  slot that holds the lease is waited for first: it finishes (skipped_done), renews
  (skipped_held, 0: it is running), vanishes without marking the slot (taken over: Acquired),
  or none of these within the held wait (skipped_held, 75). Under the overlap policies
  buffer-one and replace, a run that found an earlier slot holding the lease waits for its
  turn (docs/design.md, Overlap policies): a look each poll, the last one recording the skip
  if the lease is still held. A paused task is skipped (paused, 0).

Everything a policy of the lease decides (what to do when held, late or paused) is answered
here, with what the lease scripts reply; execution keeps only the phases.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, NamedTuple, Protocol

from runner import clock
from runner.config.settings import BUFFER_ONE, Settings
from runner.errors import EXIT_LEASE_LOST, EXIT_OK, ConfigError, Terminated
from runner.lease.scripts import (
    BUFFERED,
    GAVE_UP,
    PREEMPTING,
    SUPERSEDED,
    Acquired,
    AcquireResult,
    Held,
    Paused,
    SlotDone,
)
from runner.logs import RunLogger
from runner.outcomes import (
    PAUSED,
    SKIPPED_DONE,
    SKIPPED_HELD,
    SKIPPED_STALE,
    TOO_LATE,
    exit_code,
)
from runner.schedule import catchup
from runner.schedule.jobname import utc
from runner.schedule.markers import stale_slot_reason

TICK_S: Final = 0.05

# What the run stream gets for a skip. A skip takes no fence, so the state hash, which is the
# runs', is never written.
UNRECORDED: Final = ""  # another runner has the slot (running it, or done): it records
RECORDED: Final = "recorded"  # the run stream, with the slot
# The run stream without the slot: status and the watchdog go on from the last plausible run
# (and so report this slot as missed).
RECORDED_WITHOUT_SLOT: Final = "recorded_without_slot"


class Look(Protocol):
    """The acquire script again, one round trip; ``final``: the last look of an overlap wait."""

    def __call__(self, *, final: bool = False) -> AcquireResult: ...


def overlap_wait_s(settings: Settings) -> float:
    """How long buffer-one and replace wait for the holder (CRON_RUNNER_OVERLAP_WAIT).

    replace: the TTL + the shutdown grace + 10 s, room for the holder to see the request at its
    next renewal, stop its task within its grace and release (or for its lease to expire).
    buffer-one: the schedule's shortest gap, after which the next slot would take the buffer
    anyway; its schedule is parsed only here, when a run waits, so a start stays free of it.
    """
    lease = settings.lease
    if lease.overlap_wait_s is not None:
        return lease.overlap_wait_s
    default_s = lease.timings.default_overlap_wait_s(settings.run.shutdown_grace_s)
    schedule = settings.slots.schedule
    if lease.overlap_policy != BUFFER_ONE or not schedule:
        return default_s
    from runner.schedule.slots import Schedule  # noqa: PLC0415 - only a waiting run needs it

    try:
        return Schedule.parse(schedule, settings.slots.timezone, 0.0).min_gap_s
    except ConfigError:  # `@every D` in a CronJob: only the controller knows its fire times
        return default_s


class Skip(NamedTuple):
    """Do not run the slot here."""

    outcome: str
    exit_code: int
    reason: str
    journal: str = UNRECORDED
    # The policy said why in its own 'skipped' line: no 'finished' line follows.
    logged: bool = False


class HolderAlive(NamedTuple):
    """A run of the same slot holds the lease and was seen renewing it: it is running."""

    held: Held


class HolderUnconfirmed(NamedTuple):
    """A run of the same slot holds the lease, neither renewed nor gone within the wait."""

    held: Held


class Policy:
    """The decisions of one task's runs, from its settings. ``log`` is the run's logger."""

    def __init__(self, settings: Settings, log: RunLogger) -> None:
        self.settings = settings
        self.log = log
        # A run of this slot that held the lease and vanished without a marker (killed), from
        # which this run took the lease over: its attempt is for this run to record.
        self.taken_over: Held | None = None

    # -- before connecting ----------------------------------------------------------------

    def before_connect(self, slot: int | None, now_s: float) -> Skip | None:
        """A CronJob slot too old to run: past its marker's retention it cannot be proven unrun."""
        reason = stale_slot_reason(self.settings, slot, now_s)
        if reason is None:
            return None
        return Skip(SKIPPED_STALE, exit_code(SKIPPED_STALE), reason, RECORDED_WITHOUT_SLOT)

    # -- before acquiring -----------------------------------------------------------------

    def before_acquire(self, slot: int | None, started_s: float) -> Skip | None:
        """A schedule's slot started past its starting deadline is not run.

        Only without a Job name: a CronJob pod's lateness is bounded by the controller's own
        startingDeadlineSeconds. A crontab line whose schedule or zone disagrees with the
        fleet's, or a timer catching up, computes a slot hours old: it must not run it. A task
        that catches up (CRON_RUNNER_CATCHUP) still runs its slot late within its window.
        """
        s = self.settings.slots
        if s.job_name or s.scheduled_at_s is not None or not s.schedule or slot is None:
            return None
        late_s = started_s - slot
        deadline_s = catchup.starting_deadline_s(self.settings)
        if late_s <= deadline_s:
            return None
        names = "CRON_RUNNER_STARTING_DEADLINE"
        if s.catches_up:
            names = f"the longer of {names} and CRON_RUNNER_CATCHUP_WINDOW"
        reason = (
            f"started {late_s:.0f}s after its slot, past the starting deadline of "
            f"{deadline_s:g}s ({names}): not run. If cron "
            f"fired it on time, its schedule is read in another time zone than {s.timezone}: "
            "a crontab fires in the server's local time, so give that zone with --timezone "
            "(CRON_RUNNER_TIMEZONE)"
        )
        return Skip(TOO_LATE, exit_code(TOO_LATE), reason, RECORDED)

    # -- the acquire script's reply -------------------------------------------------------

    def decide(
        self,
        reply: AcquireResult,
        slot: int | None,
        look: Look,
        stopping: Callable[[], bool],
    ) -> Acquired | Skip:
        """Run (Acquired) or skip. ``look`` runs the acquire script again (one round trip);
        ``stopping`` says a stop was requested, which ends a wait with Terminated."""
        got: AcquireResult | HolderAlive | HolderUnconfirmed = reply
        if isinstance(got, Held) and got.note in (BUFFERED, PREEMPTING):
            got = self._wait_for_turn(got, look, stopping)
        if isinstance(got, Held) and slot is not None and got.slot == slot and not got.note:
            got = self._wait_for_holder(got, slot, look, stopping)
        if isinstance(got, Acquired):
            return got
        return self._skipped(got)

    def _poll_s(self) -> float:
        return self.settings.lease.timings.holder_poll_s

    @staticmethod
    def _sleep_until(instant: float, stopping: Callable[[], bool], why: str) -> None:
        while clock.monotonic() < instant:
            if stopping():
                raise Terminated(f"stopped while waiting for {why}")
            time.sleep(TICK_S)

    def _wait_for_turn(self, held: Held, look: Look, stopping: Callable[[], bool]) -> AcquireResult:
        """buffer-one: this slot waits to run right after the holder; replace: the holder was
        asked to stop, and this slot runs once it has. Each look is the acquire script (one round
        trip); the last, at the end of the overlap wait, records the slot's skip if the lease is
        still held. A later slot that comes meanwhile supersedes this one (the script says so)."""
        wait_s = overlap_wait_s(self.settings)
        until = clock.monotonic() + wait_s
        poll_s = self._poll_s()
        held_for = f"the slot {held.slot}" if held.slot is not None else "a manual run"
        doing = (
            "this slot runs right after it (buffer-one)"
            if held.note == BUFFERED
            else "asked it to stop (replace); this slot runs once it has"
        )
        self.log.info(
            f"waiting: {held.holder} holds the lease for {held_for}; {doing}, waiting up to "
            f"{wait_s:g}s (CRON_RUNNER_OVERLAP_WAIT)",
            extra={"event": "waiting", "run_holder": held.holder, "ttl_ms": held.ttl_ms},
        )
        while True:
            self._sleep_until(min(clock.monotonic() + poll_s, until), stopping, "the holder")
            final = clock.monotonic() >= until
            got = look(final=final)
            if final or not (isinstance(got, Held) and got.note in (BUFFERED, PREEMPTING)):
                return got

    def _wait_for_holder(
        self,
        held: Held,
        slot: int,
        look: Look,
        stopping: Callable[[], bool],
    ) -> AcquireResult | HolderAlive | HolderUnconfirmed:
        """Wait for a holder of this very slot to finish (skip: done), renew (skip: it runs,
        and its own Job retries if it dies later) or vanish without a marker (take over).

        Skipping at once would lose the slot when that holder was killed: its lease stays
        until the TTL, and a retry that finds it would exit 0 with nothing run (issue 11).
        Each look is the acquire script again, one round trip.
        """
        wait_s = self.settings.lease.held_wait
        until = clock.monotonic() + wait_s
        poll_s = self._poll_s()
        self.log.info(
            f"waiting: a run of this slot holds the lease; waiting up to {wait_s:g}s for it to "
            "finish, renew or expire (CRON_RUNNER_HELD_WAIT)",
            extra={"event": "waiting", "run_holder": held.holder, "ttl_ms": held.ttl_ms},
        )
        seen = held
        while True:
            self._sleep_until(clock.monotonic() + poll_s, stopping, "the slot's holder")
            if clock.monotonic() >= until:
                return HolderUnconfirmed(seen)
            got = look()
            if not isinstance(got, Held):
                if isinstance(got, Acquired):
                    self.taken_over = seen
                return got  # taken over (the holder is gone, no marker), or done
            if got.slot != slot:
                return got  # another slot's run: ours is not running, and cannot now
            if got.token == seen.token and got.ttl_ms > seen.ttl_ms:
                return HolderAlive(got)  # renewed since the last look: it is running
            seen = got  # the same holder running down, or a new holder of this slot

    def _skipped(self, got: Held | SlotDone | Paused | HolderAlive | HolderUnconfirmed) -> Skip:
        if isinstance(got, Paused):
            until = f" until {utc(got.until)}" if got.until else ""
            reason = f"paused by {got.by or '?'}{until}" + (f": {got.note}" if got.note else "")
            return self._said(PAUSED, EXIT_OK, reason, f"skipped: the task is {reason}")
        if isinstance(got, HolderUnconfirmed):
            reason = (
                f"a run of this slot by {got.held.holder} holds the lease and neither renewed nor "
                f"released it within {self.settings.lease.held_wait:g}s (CRON_RUNNER_HELD_WAIT): "
                "not run, and not reported done"
            )
            return self._said(SKIPPED_HELD, EXIT_LEASE_LOST, reason, reason, logging.WARNING,
                              run_holder=got.held.holder)  # fmt: skip
        if isinstance(got, HolderAlive):
            return self._said(SKIPPED_HELD, EXIT_OK, f"running at {got.held.holder}",
                              "skipped: a run of this slot holds the lease and renews it",
                              run_holder=got.held.holder, ttl_ms=got.held.ttl_ms)  # fmt: skip
        if isinstance(got, Held) and got.note in (SUPERSEDED, GAVE_UP):
            # The acquire script has recorded the slot's skip (once per slot).
            if got.note == SUPERSEDED:
                reason = "superseded: a later slot waits for the lease or took it"
            else:
                reason = (
                    f"{got.holder} still held the lease after the overlap wait of "
                    f"{overlap_wait_s(self.settings):g}s (CRON_RUNNER_OVERLAP_WAIT)"
                )
            return self._said(SKIPPED_HELD, EXIT_OK, reason, f"skipped: {reason}",
                              run_holder=got.holder or None)  # fmt: skip
        if isinstance(got, Held):
            return self._said(SKIPPED_HELD, EXIT_OK, f"held by {got.holder}",
                              "skipped: another holder has the lease",
                              run_holder=got.holder, ttl_ms=got.ttl_ms)  # fmt: skip
        finished = utc(got.finished_at) if got.finished_at else "unknown"
        return self._said(SKIPPED_DONE, exit_code(SKIPPED_DONE),
                          f"slot done by {got.holder} at {finished}", "skipped: this slot already ran",
                          run_holder=got.holder, finished_at=finished)  # fmt: skip

    def _said(
        self,
        outcome: str,
        code: int,
        reason: str,
        line: str,
        level: int = logging.INFO,
        **fields: object,
    ) -> Skip:
        """A skip that says why in its own 'skipped' line, with ``fields``: no 'finished' line
        follows."""
        extra = {"event": "skipped", "outcome": outcome, "exit_code": code, **fields}
        self.log.log(level, line, extra=extra)
        return Skip(outcome, code, reason, logged=True)
