"""The keeper in-process, on real Redis: renewals, refusal, deadlines, prompt stop, crashes.

Loss is observed through ``on_lost``, which records the monotonic instant and the thread
that reported it, so a loss the keeper thread found by itself is told apart from one that
the owner's own ``is_lost()`` found.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import redis

from runner import clock
from runner.config.timings import LeaseTimings
from runner.keys import TaskKeys
from runner.lease.keeper import Keeper
from runner.lease.scripts import Acquired, Lease, new_token
from runner.testing import free_port
from tests.helpers.lease_tools import pttl_ms
from tests.helpers.wait import wait_for

KEYS = TaskKeys("cron-runner", "keeper", "report")
KEEPER_THREAD = "lease-keeper"


@dataclass
class Reports:
    lost: threading.Event = field(default_factory=threading.Event)
    losses: list[tuple[float, str, str]] = field(default_factory=list)
    renewed_at: list[float] = field(default_factory=list)

    def on_lost(self, reason: str) -> None:
        self.losses.append((time.monotonic(), threading.current_thread().name, reason))
        self.lost.set()

    def on_renewed(self) -> None:
        self.renewed_at.append(time.monotonic())

    def wait_lost(self, timeout_s: float = 10.0) -> tuple[float, str, str]:
        """(instant, reporting thread, reason) of the one loss report."""
        assert self.lost.wait(timeout_s), "the keeper never reported the loss"
        assert len(self.losses) == 1, self.losses
        return self.losses[0]


class Holder:
    """Makes leases with keepers whose reports land in ``Reports``; stops them all at teardown."""

    def __init__(self) -> None:
        self.keepers: list[Keeper] = []

    def __call__(
        self,
        lease: Lease,
        *,
        acquire: bool = True,
        confirmed_at: float | None = None,
        start: bool = True,
        on_lost: Callable[[str], None] | None = None,
        on_renewed: Callable[[], None] | None = None,
    ) -> tuple[Keeper, Reports]:
        sent_at = time.monotonic()
        if acquire:
            assert isinstance(lease.acquire(None), Acquired)
        reports = Reports()
        keeper = Keeper(
            lease,
            ttl_s=lease.ttl_ms / 1000,
            confirmed_at=sent_at if confirmed_at is None else confirmed_at,
            on_lost=on_lost or reports.on_lost,
            on_renewed=on_renewed or reports.on_renewed,
        )
        self.keepers.append(keeper)
        if start:
            keeper.start()
        return keeper, reports


@pytest.fixture
def hold() -> Iterator[Holder]:
    holder = Holder()
    yield holder
    for keeper in holder.keepers:
        keeper.stop()


def lease_on(client: redis.Redis, ttl_ms: int, holder: str = "keeper-test") -> Lease:
    return Lease(client, KEYS, new_token(holder), ttl_ms=ttl_ms)


def unreachable_client() -> redis.Redis:
    """A real client for a port nothing listens on: every command is refused by the kernel."""
    return redis.Redis(port=free_port(), socket_connect_timeout=1, socket_timeout=1)


# -- healthy ------------------------------------------------------------------------------


def test_keeper_holds_the_lease_well_past_its_ttl(r: redis.Redis, hold: Holder) -> None:
    lease = lease_on(r, ttl_ms=1500)
    keeper, reports = hold(lease)
    # Four renewals at ttl/3 cover more than a whole TTL past the acquisition.
    wait_for(lambda: keeper.renewals >= 4, what="four renewals")
    assert r.get(KEYS.lease) == lease.token
    assert 0 < pttl_ms(r, KEYS.lease) <= 1500
    assert not keeper.is_lost()
    assert reports.losses == []
    assert keeper.failed_renewals == 0
    assert len(reports.renewed_at) == keeper.renewals


# -- (c) refused renewal ------------------------------------------------------------------


def test_refused_renewal_is_lost_at_once_and_leaves_the_new_lease_alone(
    r: redis.Redis, hold: Holder
) -> None:
    lease = lease_on(r, ttl_ms=3000)
    keeper, reports = hold(lease)
    wait_for(lambda: keeper.renewals >= 1, what="a first renewal")

    # Another holder takes over, as after an expiry the keeper did not see.
    r.delete(KEYS.lease)
    other = lease_on(r, ttl_ms=60_000, holder="pod-other")
    assert isinstance(other.acquire(None), Acquired)

    lost_at, thread, reason = reports.wait_lost()
    assert thread == KEEPER_THREAD
    assert "renew refused" in reason
    assert "pod-other" in reason
    # Refused, not timed out: reported before the local deadline was reached.
    assert lost_at < keeper.lose_at
    assert keeper.is_lost()
    assert keeper.lost_reason == reason
    assert keeper.failed_renewals == 1
    wait_for(lambda: not keeper._thread.is_alive(), what="the keeper thread to end")
    assert r.get(KEYS.lease) == other.token
    assert pttl_ms(r, KEYS.lease) > 3000


def test_lease_deleted_under_the_keeper_is_lost(r: redis.Redis, hold: Holder) -> None:
    # Started with its first renewal due at once, after the lease has gone.
    keeper, reports = hold(lease_on(r, ttl_ms=3000), confirmed_at=time.monotonic() - 1, start=False)
    r.delete(KEYS.lease)  # `unlock --force`, or an evicting maxmemory-policy
    keeper.start()
    _, thread, reason = reports.wait_lost()
    assert thread == KEEPER_THREAD
    assert "lease is free" in reason
    assert not r.exists(KEYS.lease)


# -- deadline -----------------------------------------------------------------------------


def test_keeper_thread_reports_at_its_deadline_not_at_its_next_retry(hold: Holder) -> None:
    # Redis unreachable: every renewal fails, so only the local deadline can end the lease.
    # A 20 s TTL retries once a second; the deadline is put 0.3 s ahead, so a keeper that
    # only looked at the clock when it woke to retry would report 0.7 s late.
    ttl_s = 20.0
    lease = Lease(unreachable_client(), KEYS, new_token("keeper-test"), ttl_ms=int(ttl_s * 1000))
    lose_after_confirmed_s = ttl_s - LeaseTimings(ttl_s).drift_margin_s - ttl_s / 3
    confirmed_at = time.monotonic() + 0.3 - lose_after_confirmed_s
    keeper, reports = hold(lease, acquire=False, confirmed_at=confirmed_at)
    assert keeper.retry_interval_s == 1.0

    lost_at, thread, reason = reports.wait_lost()
    assert thread == KEEPER_THREAD
    assert reason == "no renewal confirmed before the local deadline"
    assert keeper.failed_renewals >= 1
    assert keeper.lose_at <= lost_at < keeper.lose_at + keeper.retry_interval_s / 2
    assert lost_at < keeper.expires_at


def test_unexpected_redis_error_is_retried_until_the_deadline(r: redis.Redis, hold: Holder) -> None:
    keeper, reports = hold(lease_on(r, ttl_ms=1200))
    # The lease key replaced by a hash: every renewal now fails with WRONGTYPE.
    r.delete(KEYS.lease)
    r.hset(KEYS.lease, "not", "a lease")
    lost_at, thread, reason = reports.wait_lost()
    assert thread == KEEPER_THREAD
    assert reason == "no renewal confirmed before the local deadline"
    assert keeper.failed_renewals >= 1
    assert lost_at >= keeper.lose_at


# -- (d) stop -----------------------------------------------------------------------------


def test_stop_interrupts_the_wait_between_renewals(r: redis.Redis, hold: Holder) -> None:
    # The next renewal is 20 s away; stop() joins for at most that long, so a keeper on a
    # plain sleep would still be alive when stop() returns.
    keeper, _ = hold(lease_on(r, ttl_ms=60_000))
    assert keeper._thread.is_alive()
    keeper.stop()
    assert not keeper._thread.is_alive()
    assert keeper.renewals == 0
    assert not keeper._lost.is_set()


def test_stop_interrupts_retries_while_redis_is_unreachable(hold: Holder) -> None:
    lease = Lease(unreachable_client(), KEYS, new_token("keeper-test"), ttl_ms=60_000)
    keeper, reports = hold(lease, acquire=False, confirmed_at=time.monotonic() - 20)
    wait_for(lambda: keeper.failed_renewals >= 1, what="a failed renewal")
    keeper.stop()
    assert not keeper._thread.is_alive()
    assert reports.losses == []


def test_no_renewal_after_stop(r: redis.Redis, hold: Holder) -> None:
    keeper, _ = hold(lease_on(r, ttl_ms=1200))
    wait_for(lambda: keeper.renewals >= 1, what="a renewal")
    keeper.stop()
    renewals = keeper.renewals
    wait_for(lambda: not r.exists(KEYS.lease), what="the lease to expire in Redis")
    assert keeper.renewals == renewals


def test_stop_from_the_keepers_own_callback_does_not_deadlock(r: redis.Redis, hold: Holder) -> None:
    stopped = threading.Event()
    keepers: list[Keeper] = []

    def stop_on_loss(reason: str) -> None:
        keepers[0].stop()
        stopped.set()

    keeper, _ = hold(lease_on(r, ttl_ms=900), on_lost=stop_on_loss)
    keepers.append(keeper)
    r.delete(KEYS.lease)
    assert stopped.wait(10)
    wait_for(lambda: not keeper._thread.is_alive(), what="the keeper thread to end")


# -- (e) crashes --------------------------------------------------------------------------


class ExplodingLease(Lease):
    """A real lease whose renew fails in a way the keeper does not expect."""

    def renew(self) -> None:
        raise KeyError("boom")


@pytest.fixture
def thread_crashes(monkeypatch: pytest.MonkeyPatch) -> list[threading.ExceptHookArgs]:
    """Uncaught thread exceptions, captured instead of pytest's warning about them."""
    seen: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    return seen


def test_unexpected_exception_in_the_keeper_is_a_loss_with_a_reason(
    r: redis.Redis, hold: Holder, thread_crashes: list[threading.ExceptHookArgs]
) -> None:
    lease = ExplodingLease(r, KEYS, new_token("keeper-test"), ttl_ms=3000)
    keeper, reports = hold(lease, confirmed_at=time.monotonic() - 1)  # first renewal at once
    lost_at, thread, reason = reports.wait_lost()
    assert thread == KEEPER_THREAD
    assert reason.startswith("keeper crashed: KeyError('boom')")
    # Found by the thread itself, well before the deadline would have told the owner.
    assert lost_at < keeper.lose_at
    assert keeper.is_lost()
    assert keeper.lost_reason == reason
    wait_for(lambda: not keeper._thread.is_alive(), what="the crashed thread to end")
    # And the crash is loud as well: re-raised to threading.excepthook, not swallowed.
    assert [type(c.exc_value) for c in thread_crashes] == [KeyError]


def test_exception_in_on_renewed_is_a_loss_too(
    r: redis.Redis, thread_crashes: list[threading.ExceptHookArgs], hold: Holder
) -> None:
    def broken_callback() -> None:
        raise RuntimeError("metrics exporter down")

    keeper, reports = hold(
        lease_on(r, ttl_ms=3000), confirmed_at=time.monotonic() - 1, on_renewed=broken_callback
    )
    _, thread, reason = reports.wait_lost()
    assert thread == KEEPER_THREAD
    assert "metrics exporter down" in reason
    assert keeper.is_lost()
    wait_for(lambda: bool(thread_crashes), what="the crash to reach excepthook")
    assert [type(c.exc_value) for c in thread_crashes] == [RuntimeError]


# -- pure timing, on a controlled clock ---------------------------------------------------


class FakeClock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_deadlines_follow_the_last_confirmed_renewal(
    r: redis.Redis, hold: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeClock(1000.0)
    monkeypatch.setattr(clock, "monotonic", fake)
    keeper, reports = hold(lease_on(r, ttl_ms=3000), confirmed_at=1000.0, start=False)
    assert keeper.renew_interval_s == pytest.approx(1.0)
    assert keeper.margin_s == LeaseTimings(3.0).drift_margin_s == pytest.approx(0.15)
    assert keeper.expires_at == pytest.approx(1000.0 + 3.0 - 0.15)
    assert keeper.lose_at == pytest.approx(keeper.expires_at - 1.0)

    fake.now = keeper.lose_at - 1e-6
    assert not keeper.is_lost()
    fake.now = keeper.lose_at
    assert keeper.is_lost()
    assert keeper.lost_reason == "no renewal confirmed before the local deadline"
    assert [thread for _, thread, _ in reports.losses] == ["MainThread"]
    fake.now += 3600
    assert keeper.is_lost()
    assert len(reports.losses) == 1


class PausedMidRenewal(Lease):
    """The renewal reaches Redis and succeeds, but its reply comes back after the deadline
    (a GC pause, a slow network): the clock is moved on while the call is in flight."""

    keeper: Keeper
    fake: FakeClock

    def renew(self) -> None:
        self.fake.now = self.keeper.lose_at + 0.5
        super().renew()


def test_a_renewal_confirmed_after_the_deadline_does_not_revive_the_lease(
    r: redis.Redis, hold: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeClock(time.monotonic())
    monkeypatch.setattr(clock, "monotonic", fake)
    lease = PausedMidRenewal(r, KEYS, new_token("keeper-test"), ttl_ms=3000)
    # The first renewal is due at once; the fake clock stands still until it is sent.
    keeper, reports = hold(lease, confirmed_at=fake.now - 1.0, start=False)
    lease.keeper, lease.fake = keeper, fake
    lose_at_before = keeper.lose_at
    keeper.start()

    _, thread, reason = reports.wait_lost()
    assert thread == KEEPER_THREAD
    assert reason == "no renewal confirmed before the local deadline"
    assert keeper.renewals == 0
    assert reports.renewed_at == []
    assert keeper.lose_at == lose_at_before
    assert keeper.is_lost()
