"""The timings a lease TTL decides (runner.config.timings), as a table: the keeper, the store
and the settings all read them from there."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TypeGuard

import pytest

from runner.config import timings
from runner.config.settings import LeaseSettings
from runner.config.timings import MIN_TTL_S, LeaseTimings, retry_interval_s
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


# ttl_s: renewal under replace, holder poll, default overlap wait with a 25 s grace
WAITS = [
    (1.0, (1 / 3, 1 / 12, 36.0)),
    (1.2, (0.4, 0.1, 36.2)),
    (3.0, (1.0, 0.25, 38.0)),
    (6.0, (1.0, 0.5, 41.0)),
    (30.0, (1.0, 1.0, 65.0)),
    (300.0, (1.0, 1.0, 335.0)),
]


@pytest.mark.parametrize(("ttl_s", "expected"), WAITS)
def test_what_runs_and_workers_wait_follows_from_the_ttl(
    ttl_s: float, expected: tuple[float, float, float]
) -> None:
    replace_renew_s, poll_s, overlap_wait_s = expected
    t = LeaseTimings(ttl_s)
    assert t.replace_renew_interval_s == pytest.approx(replace_renew_s)
    assert t.holder_poll_s == pytest.approx(poll_s)
    assert t.default_overlap_wait_s(25.0) == pytest.approx(overlap_wait_s)


@pytest.mark.parametrize(
    ("renew_s", "retry_s"), [(0.1, 0.05), (1 / 3, 1 / 12), (1.0, 0.25), (10.0, 1.0)]
)
def test_a_failed_renewal_is_retried_four_times_per_renew_interval(
    renew_s: float, retry_s: float
) -> None:
    assert retry_interval_s(renew_s) == pytest.approx(retry_s)


def _ttl_arithmetic(node: ast.AST) -> TypeGuard[ast.BinOp]:
    """An expression that works out a number from a TTL: ``ttl_s`` with a constant or divided
    (``ttl_s / 3``, ``ttl_s + grace + 10.0``), not a conversion to milliseconds."""
    if not isinstance(node, ast.BinOp):
        return False
    names = [n for n in ast.walk(node) if isinstance(n, ast.Name | ast.Attribute)]
    if not any((n.id if isinstance(n, ast.Name) else n.attr) == "ttl_s" for n in names):
        return False
    constants = [
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, int | float)
    ]
    divided = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in ast.walk(node))
    return divided or any(c != 1000 for c in constants)


def test_every_interval_of_the_ttl_is_worked_out_in_timings() -> None:
    """One home for what the TTL decides: a run, a worker and the keeper must not each work
    out their own renewal, poll or wait from it, and drift apart."""
    root = Path(timings.__file__).parent.parent
    found = [
        f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}"
        for path in sorted(root.rglob("*.py"))
        if path != Path(timings.__file__)
        for node in ast.walk(ast.parse(path.read_text()))
        if _ttl_arithmetic(node)
    ]
    assert not found, "worked out outside runner/config/timings.py:\n" + "\n".join(found)
