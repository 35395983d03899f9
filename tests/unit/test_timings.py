"""The timings a lease TTL decides (runner.config.timings), as a table: the keeper, the store
and the settings all read them from there."""

from __future__ import annotations

import pytest

from runner.config.settings import LeaseSettings
from runner.config.timings import MIN_TTL_S, LeaseTimings
from runner.lease import store

# ttl_s: renew interval, drift margin, socket timeout, WAIT timeout (ms), WAIT reply timeout
TABLE = [
    (1.0, (1 / 3, 0.1, 0.25, 166, 1 / 3)),
    (1.5, (0.5, 0.1, 0.375, 250, 0.5)),
    (2.0, (2 / 3, 0.1, 0.5, 333, 2 / 3)),
    (3.0, (1.0, 0.15, 0.75, 500, 1.0)),
    (6.0, (2.0, 0.3, 1.5, 1000, 2.0)),
    (30.0, (10.0, 1.5, 5.0, 4000, 10.0)),
    (300.0, (100.0, 15.0, 5.0, 4000, 100.0)),
]


@pytest.mark.parametrize(("ttl_s", "expected"), TABLE)
def test_timings_of_a_ttl(ttl_s: float, expected: tuple[float, float, float, int, float]) -> None:
    renew_s, margin_s, socket_s, wait_ms, wait_reply_s = expected
    t = LeaseTimings(ttl_s)
    assert t.renew_interval_s == pytest.approx(renew_s)
    assert t.drift_margin_s == pytest.approx(margin_s)
    assert t.socket_timeout_s == pytest.approx(socket_s)
    assert t.wait_timeout_ms == wait_ms
    assert t.wait_reply_timeout_s == pytest.approx(wait_reply_s)
    assert t.default_held_wait_s == pytest.approx(ttl_s + 10)
    assert store.wait_timeout_ms(ttl_s) == wait_ms
    assert store.wait_reply_timeout_s(ttl_s) == pytest.approx(wait_reply_s)


def test_the_smallest_ttl_leaves_a_socket_timeout_inside_a_renew_interval() -> None:
    t = LeaseTimings(MIN_TTL_S)
    assert t.socket_timeout_s < t.renew_interval_s


def test_a_client_without_a_lease_gets_the_longest_socket_timeout() -> None:
    assert store.socket_timeout_s(None) == LeaseTimings(30.0).socket_timeout_s == 5.0
    assert store.socket_timeout_s(3.0) == LeaseTimings(3.0).socket_timeout_s


def test_settings_read_the_same_timings() -> None:
    lease = LeaseSettings(ttl_s=12.0)
    assert lease.timings == LeaseTimings(12.0)
    assert lease.held_wait == 22.0
    assert lease._replace(held_wait_s=3.0).held_wait == 3.0
