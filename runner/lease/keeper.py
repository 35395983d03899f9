"""The keeper: renews the lease on an interruptible wait and says when it is lost
(docs/design.md; the intervals are runner.config.timings').

Two local instants, both on ``clock.monotonic()`` and measured from when the last
confirmed renewal was *sent* (Redis set its expiry no earlier than that):

- ``expires_at`` = sent + ttl - drift margin: the lease may be gone in Redis after this,
  so the task must be stopped (killed if need be) by then;
- ``lose_at`` = expires_at - renew interval: if no renewal was confirmed by this instant
  the lease is declared lost, leaving one renew interval for the task to stop on its own.

The owner does not trust the thread alone: ``is_lost()`` also compares the clock with
``lose_at``, so a keeper blocked on a dead socket, or a process resumed after SIGSTOP,
cannot let the task carry on past its deadline.

Under overlap replace a renewal may answer that a run of a newer slot asks for the lease
(``Preempted``): the lease was renewed all the same, so the keeper goes on renewing while the
owner stops the task, and ``preempted`` says who asked (docs/design.md, Overlap policies).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from redis.exceptions import RedisError

from runner import clock
from runner.config.timings import LeaseTimings, retry_interval_s
from runner.errors import LeaseNotOwned, Preempted
from runner.lease.scripts import Lease

log = logging.getLogger("runner.keeper")


class Keeper:
    def __init__(
        self,
        lease: Lease,
        *,
        ttl_s: float,
        confirmed_at: float,
        renew_interval_s: float | None = None,
        on_lost: Callable[[str], None] | None = None,
        on_renewed: Callable[[], None] | None = None,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = log,
    ) -> None:
        self.lease = lease
        # A run passes its own (runner.logs.RunLogger), so these lines carry its fields too.
        self.log = logger
        self.ttl_s = ttl_s
        timings = LeaseTimings(ttl_s)
        self.renew_interval_s = renew_interval_s or timings.renew_interval_s
        self.margin_s = timings.drift_margin_s
        self.retry_interval_s = retry_interval_s(self.renew_interval_s)
        self._confirmed_at = confirmed_at
        self._on_lost = on_lost
        self._on_renewed = on_renewed
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._declare_lock = threading.Lock()
        self.lost_reason: str | None = None
        self.preempted: Preempted | None = None
        self.renewals = 0
        self.failed_renewals = 0
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    @property
    def expires_at(self) -> float:
        return self._confirmed_at + self.ttl_s - self.margin_s

    @property
    def lose_at(self) -> float:
        return self.expires_at - self.renew_interval_s

    def start(self) -> Keeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing. Returns once the thread is gone, or after one renew's worth of time."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.renew_interval_s)

    def is_lost(self) -> bool:
        if not self._lost.is_set() and clock.monotonic() >= self.lose_at:
            self._declare_lost("no renewal confirmed before the local deadline")
        return self._lost.is_set()

    def _declare_lost(self, reason: str) -> None:
        # The owner (is_lost) and the keeper thread may both see the deadline: report once.
        with self._declare_lock:
            if self._lost.is_set():
                return
            self.lost_reason = reason
            self._lost.set()
        self.log.warning("lease lost: %s", reason, extra={"event": "lease_lost"})
        if self._on_lost is not None:
            self._on_lost(reason)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            # A keeper that dies quietly is the classic bug: its death is a lost lease.
            self._declare_lost(f"keeper crashed: {exc!r}")
            raise

    def _loop(self) -> None:
        next_attempt = self._confirmed_at + self.renew_interval_s
        # Wake at lose_at at the latest: retries after errors are spaced by retry_interval_s,
        # and on_lost must not wait for the next one to tell the owner the deadline passed.
        while not self._stop.wait(max(0.0, min(next_attempt, self.lose_at) - clock.monotonic())):
            if self.is_lost():
                return
            sent_at = clock.monotonic()
            try:
                self.lease.renew()
            except Preempted as exc:
                if self.preempted is None:
                    self.preempted = exc
                    self.log.warning(str(exc), extra={"event": "preempted"})
            except LeaseNotOwned as exc:
                self.failed_renewals += 1
                self._declare_lost(str(exc))
                return
            except RedisError as exc:
                self.failed_renewals += 1
                self.log.warning(
                    "lease renewal failed, retrying: %s", exc, extra={"event": "renew_failed"}
                )
                next_attempt = clock.monotonic() + self.retry_interval_s
                continue
            if self._stop.is_set():
                return
            # The reply may have come back after our deadline (a long pause or a slow
            # server): the owner may already have been told the lease is lost. Keep it so.
            if self.is_lost():
                return
            self._confirmed_at = sent_at
            self.renewals += 1
            self.log.debug("lease renewed", extra={"event": "renewed"})
            if self._on_renewed is not None:
                self._on_renewed()
            next_attempt = sent_at + self.renew_interval_s
