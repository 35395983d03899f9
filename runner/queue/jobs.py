"""The task's lease around a queue worker's job (docs/design.md, Queue mode).

A message a run sent (an enqueueing CronJob, a trigger, a backfill: it names the run, or has
a slot) is a run of its task. The worker takes the task's lease for it (the slot's under
allow-other-slots) with the same scripts as a run, renews it with the Keeper while the job
runs, and completes or releases it after, so that the overlap policy holds between jobs, and
between jobs and runs, wherever they run. The fencing token is this acquire's: a message
delivered again (its worker died) runs under a higher one.

The job's slot marker is a key of its own (``JobKeys``): the enqueueing run's marker says that
the slot was sent, the job's that it ran (or was replaced), so that a message delivered again
for a done slot is acknowledged without running. Everything else (the lease, the fence, meta
with the pause, the run stream and state hash) is the task's.

``Gate`` asks the lease for a job's turn and waits where the policy says, one acquire per
poll: buffer-one and replace up to the overlap wait, and a lease held for this very slot (a
holder that died, whose lease has not expired yet) up to the held wait.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Final, NamedTuple

from runner import clock
from runner.errors import Preempted
from runner.keys import TaskKeys
from runner.lease.scripts import (
    BUFFERED,
    GAVE_UP,
    PREEMPTING,
    SUPERSEDED,
    Acquired,
    AcquireResult,
    Held,
    Lease,
    Paused,
    SlotDone,
)
from runner.outcomes import PAUSED, SKIPPED_DONE, SKIPPED_HELD

# A job's marker outlives what could deliver its message again: a dead worker's messages come
# back within the heartbeat timeout (60 s), a retried send finds the enqueue's own marker.
JOB_MARKER_RETENTION_MS: Final = 3_600_000
POLL_S: Final = 0.25


class JobKeys(TaskKeys):
    """A task's keys, with the job's own slot marker."""

    __slots__ = ()

    def slot(self, slot_epoch_s: int) -> str:
        return f"{self.base}:job:{slot_epoch_s}"


class JobLease(Lease):
    """The task's lease as a job holds it.

    Under replace, a renewal that answers preempted has kept the lease all the same: it is
    remembered in ``preempted`` and passed to ``on_preempted`` once (the job's context is
    cancelled), and the keeper goes on renewing while the job stops.

    The state hash is written unfenced, as a worker always wrote it: the next slot's enqueue
    takes a higher fence while this job still runs (allow-other-slots), and would otherwise
    keep this job's outcome out of the state forever (runner.lease.journal).
    """

    fenced_state = False
    preempted: Preempted | None = None
    on_preempted: Callable[[Preempted], None] | None = None

    def renew(self) -> None:
        try:
            super().renew()
        except Preempted as exc:
            if self.preempted is None:
                self.preempted = exc
                if self.on_preempted is not None:
                    self.on_preempted(exc)


class Run(NamedTuple):
    """The lease is this job's: run it."""

    fence: int
    sent_at: float  # clock.monotonic() when the acquire that took it was sent


class Skip(NamedTuple):
    """Acknowledge the message without running it. ``recorded``: the acquire script put the
    skip in the run stream already (once per slot)."""

    outcome: str
    reason: str
    recorded: bool


class PutBack(NamedTuple):
    """Put the message back on its queue (after ``delay_ms``), its retries untouched."""

    delay_ms: int | None
    reason: str


Turn = Run | Skip | PutBack


@dataclass
class Gate:
    """One job's turn at the lease. ``look(final)`` is one acquire (``final``: the last look
    of a policy's wait, whose held reply the script records as this slot's skip)."""

    look: Callable[[bool], AcquireResult]
    slot: int | None
    _: KW_ONLY
    wait_s: float
    held_wait_s: float
    stopping: threading.Event
    poll_s: float = POLL_S
    # A slot the user asked for (backfilled, caught up): another slot's lease sends it back
    # to its queue for later, never skips it.
    waits_turn: bool = False

    def take(self) -> Turn:
        deadline: float | None = None
        final = False
        while True:
            sent_at = clock.monotonic()
            reply = self.look(final)
            if isinstance(reply, Acquired):
                return Run(reply.fence, sent_at)
            turn = self._answer(reply)
            if turn is not None:
                return turn
            assert isinstance(reply, Held)
            for_policy = reply.note in (BUFFERED, PREEMPTING)
            now = clock.monotonic()
            if deadline is None:
                deadline = now + (self.wait_s if for_policy else self.held_wait_s)
            if now >= deadline:
                if for_policy and not final:
                    final = True  # one last look, whose held reply is this slot's skip
                    continue
                return self._gave_up(reply)
            if self.stopping.wait(min(self.poll_s, deadline - now)):
                return PutBack(None, "worker shutting down")

    def _answer(self, reply: AcquireResult) -> Turn | None:
        """What a reply other than Acquired means; None: wait for the holder and look again."""
        if isinstance(reply, SlotDone):
            return Skip(SKIPPED_DONE, f"the slot already ran on {reply.holder}", False)
        if isinstance(reply, Paused):
            return Skip(PAUSED, _paused(reply), self.slot is not None)
        assert isinstance(reply, Held)
        if reply.note == SUPERSEDED:
            return Skip(SKIPPED_HELD, f"superseded: a later slot ({reply.slot}) waits or ran "
                        "under the overlap policy", True)  # fmt: skip
        if reply.note == GAVE_UP:
            return Skip(SKIPPED_HELD, f"held by {reply.holder} past the overlap wait "
                        f"({self.wait_s:g}s)", True)  # fmt: skip
        if reply.note in (BUFFERED, PREEMPTING) or self.slot is None or reply.slot == self.slot:
            return None
        # skip: another slot runs. The script recorded it once per slot (not for a token of
        # b170e33, which names no slot: it may be running this one).
        skip = Skip(SKIPPED_HELD, _held(reply), True)
        return turn_later(reply.ttl_ms, reply.holder) if self.waits_turn else skip

    def _gave_up(self, reply: Held) -> Turn:
        if self.slot is not None:
            # This slot's holder renews (a copy of this message runs elsewhere), or its lease
            # has yet to expire: back on the queue until that one is done or gone.
            delay_ms = max(1000, reply.ttl_ms) + random.randint(0, 1000)
            return PutBack(delay_ms, f"slot {self.slot} is held by {reply.holder}")
        return Skip(SKIPPED_HELD, f"{_held(reply)}, past the wait of {self.held_wait_s:g}s", False)


def turn_later(ttl_ms: int, holder: str) -> PutBack:
    """A slot that waits its turn, behind another slot's run: back on the queue until about
    when the lease would expire, at most 5 s, so that it follows the holder soon after."""
    delay_ms = min(max(1000, ttl_ms), 5000) + random.randint(0, 500)
    return PutBack(delay_ms, f"waiting for its turn: {holder} holds the lease")


def _held(reply: Held) -> str:
    what = f"the slot {reply.slot}" if reply.slot is not None else "a manual run"
    return f"held by {reply.holder} for {what}"


def _paused(reply: Paused) -> str:
    until = f" until {reply.until:.0f}" if reply.until is not None else ""
    note = f": {reply.note}" if reply.note else ""
    return f"the task is paused by {reply.by or '?'}{until}{note}"
