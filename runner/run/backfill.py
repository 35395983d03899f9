"""Backfill: run each slot of a past range that never ran, oldest first, one run per slot
(docs/design.md, Catch-up, trigger and backfill).

Each slot is a run of its own (runner.run.execution, ``Asked(slot)``): its own acquire, which
checks the slot's marker inside Redis, its own task and its own complete. A slot already done is
counted and left alone; a lease held by another run is waited for, up to the wait given, never
skipped. A backfill repeated over the same range therefore runs nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, NamedTuple

from runner import clock
from runner.config.settings import Settings
from runner.errors import EXIT_LEASE_LOST, EXIT_OK, StoreUnavailable, Terminated
from runner.keys import TaskKeys
from runner.lease.scripts import holder_of
from runner.lease.store import with_deadline
from runner.outcomes import (
    ENQUEUED,
    PAUSED,
    RAN,
    SKIPPED_DONE,
    SKIPPED_HELD,
    TERMINATED,
    UNAVAILABLE,
)
from runner.run.execution import Asked, Execution, RunResult
from runner.run.targets import Target
from runner.signals import Shutdown

log = logging.getLogger("runner")

TICK_S: Final = 0.05
#: Markers read per round trip, before the runs: done slots are counted without a run each.
READ_CHUNK: Final = 1000


class Tally(NamedTuple):
    """What a backfill did, slot by slot, and its exit code: 0 when every slot ran or was done,
    else the first failure's code; a stop (a signal, Redis out of reach, a lease held past the
    wait, a pause) ends it early with its own."""

    ran: int = 0
    skipped: int = 0
    failed: int = 0
    left: int = 0  # not reached: the backfill stopped first
    exit_code: int = EXIT_OK
    stopped: str = ""  # why it stopped early
    sent: int = 0  # queue mode: sent to the workers, which run them (or dead-letter them)
    queued: bool = False  # queue mode (CRON_RUNNER_MODE=enqueue)

    def line(self, task: str, total: int) -> str:
        # In queue mode a slot's marker says that it was sent, not that it ran: say so.
        done = (
            f"{self.sent} sent to the workers, {self.skipped} skipped (already sent)"
            if self.queued
            else f"{self.ran} ran, {self.skipped} skipped (done)"
        )
        text = f"backfill {task}: {total} slots: {done}, {self.failed} failed"
        if self.stopped:
            text += f"; stopped, {self.left} not run: {self.stopped}"
        return text


class Backfill:
    """The slots of one task, run one after another through ``client``: ``target`` starts
    afresh for each. ``wait_s`` bounds the wait for a lease held by another run, per slot.
    """

    def __init__(
        self,
        settings: Settings,
        client: Any,
        task_name: str,
        target: Target,
        shutdown: Shutdown,
        *,
        what: str,
        wait_s: float,
    ) -> None:
        self.settings = settings
        self.client = client
        self.task_name = task_name
        self.shutdown = shutdown
        self.wait_s = wait_s
        # Each slot is a run of its own: the same task, target and stop flag, its own slot.
        self.execution = partial(
            Execution, settings, client, task_name, target, shutdown, what=what
        )
        self.keys = TaskKeys(settings.lease.prefix, settings.lease.scope, task_name)
        self.where = settings.redis.display_target
        self.queued = target.outcome == ENQUEUED

    def run(self, slots: Sequence[int]) -> Tally:
        done = self._done(slots)
        ran = skipped = failed = 0
        first_failure = EXIT_OK
        for i, slot in enumerate(slots):
            if slot in done:
                skipped += 1
                continue
            try:
                result = self._one(slot)
            except (Terminated, StoreUnavailable) as exc:
                stop = TERMINATED if isinstance(exc, Terminated) else UNAVAILABLE
                result = RunResult(stop, exc.exit_code, reason=str(exc))
            if result.outcome in (RAN, ENQUEUED):
                ran += 1
            elif result.outcome == SKIPPED_DONE:
                skipped += 1
            elif result.outcome in (TERMINATED, UNAVAILABLE, PAUSED, SKIPPED_HELD):
                # A pause stops it with 75 (try again later), as a lease held past the wait does.
                code = result.exit_code or EXIT_LEASE_LOST
                why = f"{result.outcome}: {result.reason or result.outcome}"
                return self._tally(Tally(ran, skipped, failed, len(slots) - i, code, why))
            else:
                failed += 1
                first_failure = first_failure or result.exit_code
        return self._tally(Tally(ran, skipped, failed, 0, first_failure))

    def _tally(self, tally: Tally) -> Tally:
        """In queue mode the slots done were sent, not run."""
        if self.queued:
            return tally._replace(ran=0, sent=tally.ran, queued=True)
        return tally

    def _done(self, slots: Sequence[int]) -> set[int]:
        """The slots whose marker names a holder (the acquire script checks each again)."""
        done: set[int] = set()
        for start in range(0, len(slots), READ_CHUNK):
            chunk = slots[start : start + READ_CHUNK]

            def read(chunk: Sequence[int] = chunk) -> list[Any]:
                pipe = self.client.pipeline(transaction=False)
                for slot in chunk:
                    pipe.hexists(self.keys.slot(slot), "holder")
                return list(pipe.execute())

            marks = self._store(read, "read slot markers")
            done.update(slot for slot, mark in zip(chunk, marks, strict=True) if mark)
        return done

    def _one(self, slot: int) -> RunResult:
        """Run ``slot``; a lease held by another run is waited for, up to the wait, first with a
        read of the lease (so that the acquire script records no skip of a slot that runs once
        the lease is free), and again if a run took it between that read and the acquire."""
        until = clock.monotonic() + self.wait_s
        while True:
            holder = self._wait_free(until)
            if holder is not None:
                return RunResult(
                    SKIPPED_HELD,
                    EXIT_LEASE_LOST,
                    reason=f"{holder} held the lease past the wait of {self.wait_s:g}s (--wait)",
                )
            result = self.execution(asked=Asked(slot)).run()
            if result.outcome != SKIPPED_HELD or result.exit_code != EXIT_OK:
                return result
            if clock.monotonic() >= until:
                # Skipped again and again with the lease free between: the slot is not to run
                # now (a newer slot superseded it, under buffer-one or replace).
                return result._replace(exit_code=EXIT_LEASE_LOST)
            self._pause(min(clock.monotonic() + self._poll_s(), until))

    def _wait_free(self, until: float) -> str | None:
        """Wait for the task's lease to be free: None once it is, else who held it at the end."""
        said = False
        while True:
            token = self._store(lambda: self.client.get(self.keys.lease), "read the lease")
            if token is None:
                return None
            holder = holder_of(token.decode() if isinstance(token, bytes) else str(token))
            if clock.monotonic() >= until:
                return holder
            if not said:
                log.info(
                    f"waiting: {holder} holds the lease of {self.task_name}; waiting up to "
                    f"{self.wait_s:g}s (--wait)",
                    extra={"event": "waiting", "task": self.task_name, "run_holder": holder},
                )
                said = True
            self._pause(min(clock.monotonic() + self._poll_s(), until))

    def _poll_s(self) -> float:
        return self.settings.lease.timings.holder_poll_s

    def _pause(self, until: float) -> None:
        while clock.monotonic() < until:
            if self.shutdown.requested:
                raise Terminated("stopped while waiting for the lease")
            time.sleep(TICK_S)

    def _store(self, call: Callable[[], Any], what: str) -> Any:
        deadline = clock.monotonic() + self.settings.redis.connect_timeout_s
        return with_deadline(
            call, deadline_s=deadline, what=what, where=self.where,
            stop=lambda: self.shutdown.requested,
        )  # fmt: skip
