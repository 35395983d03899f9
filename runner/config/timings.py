"""Every interval and timeout the lease TTL decides, worked out here once (docs/design.md,
Decisions inside the lease; docs/reliability.md says why each one is what it is).

The store (socket timeouts, WAIT), the keeper (renewal, retries, drift margin), the runs and
the workers (the renewal under replace, the overlap wait, polling a holder) and the settings
(the smallest TTL, the held wait) read them from here.
"""

from __future__ import annotations

from typing import NamedTuple

#: The shortest TTL accepted: renewed every TTL/3, a shorter one leaves too little room for
#: a renewal's round trip and the socket timeout (SOCKET_TIMEOUT_MIN_S) within one interval.
MIN_TTL_S = 1.0
SOCKET_TIMEOUT_MIN_S = 0.2
SOCKET_TIMEOUT_MAX_S = 5.0
DRIFT_MARGIN_MIN_S = 0.1
#: The shortest pause of a loop that polls Redis: fast enough to follow, never a spin.
POLL_MIN_S = 0.05
#: The longest pause of such a loop, whatever the TTL: a release is seen within a second.
POLL_MAX_S = 1.0


def retry_interval_s(renew_interval_s: float) -> float:
    """The keeper retries a failed renewal four times per renew interval (50 ms to 1 s): faster
    than renewals, so one lost reply costs little, but never a spin."""
    return max(POLL_MIN_S, min(POLL_MAX_S, renew_interval_s / 4))


class LeaseTimings(NamedTuple):
    """What follows from one lease TTL."""

    ttl_s: float

    @property
    def renew_interval_s(self) -> float:
        """The keeper renews every TTL/3: two renewals can fail before the lease is lost."""
        return self.ttl_s / 3

    @property
    def replace_renew_interval_s(self) -> float:
        """Under replace the holder renews every second at most: a newer slot's request to
        stop is seen at the next renewal, so it waits about a second, not a third of the TTL."""
        return min(self.ttl_s / 3, POLL_MAX_S)

    @property
    def holder_poll_s(self) -> float:
        """A run waiting for a holder (its own slot's, buffer-one, replace, a backfill) looks
        again every TTL/12, four looks per renew interval, 50 ms to 1 s."""
        return max(POLL_MIN_S, min(POLL_MAX_S, self.ttl_s / 12))

    def default_overlap_wait_s(self, shutdown_grace_s: float) -> float:
        """How long replace waits (and buffer-one, without a schedule) for a holder that was
        asked to stop: it sees the request at its next renewal, stops its task within its
        shutdown grace and releases, or its lease expires: the TTL + the grace + 10 s."""
        return self.ttl_s + shutdown_grace_s + 10.0

    @property
    def drift_margin_s(self) -> float:
        """Room for clock-rate drift between us and Redis, and for the kill to land."""
        return max(DRIFT_MARGIN_MIN_S, self.ttl_s * 0.05)

    @property
    def socket_timeout_s(self) -> float:
        """A renewal must come back well inside one renew interval (TTL/4, 0.2 to 5 s)."""
        return max(SOCKET_TIMEOUT_MIN_S, min(SOCKET_TIMEOUT_MAX_S, self.ttl_s / 4))

    @property
    def wait_timeout_ms(self) -> int:
        """How long WAIT may block: a sixth of the TTL at most, so that its reply has as long
        again to arrive (wait_reply_timeout_s) and the lease is still fresh when the task
        starts."""
        return int(min(self.socket_timeout_s * 0.8, self.ttl_s / 6) * 1000)

    @property
    def wait_reply_timeout_s(self) -> float:
        """How long the WAIT reply may take: one renew interval (TTL/3), twice the WAIT timeout.

        With the socket timeout instead (TTL/4), a 1.5 s TTL left 75 ms between WAIT's own
        timeout and the socket's: a reply delayed by a busy host was read as no replica at all.
        """
        return max(self.socket_timeout_s, self.ttl_s / 3)

    @property
    def default_held_wait_s(self) -> float:
        """How long a run waits for a holder of its own slot, unless CRON_RUNNER_HELD_WAIT says:
        enough to see it renew, release or expire when its TTL is ours."""
        return self.ttl_s + 10.0
