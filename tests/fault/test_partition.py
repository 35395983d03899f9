"""Fault matrix row 6: the network between the holder and Redis partitioned, slowed or cut,
through a TCP proxy (tests/helpers/tcpproxy.py). The holder reaches Redis only through the
proxy; the second holder, on the other side of the partition, reaches Redis directly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.testing import RedisServer
from tests.fault.common import (
    assert_clean,
    event_time,
    overlap_ms,
    run_until_ran,
)
from tests.fault.conftest import Figure
from tests.helpers.proc import LEASE, LoggedRun, events, exec_args, outcome, runner_env, spawn
from tests.helpers.tcpproxy import TcpProxy
from tests.helpers.ticker import read_ticks, ticker_command
from tests.helpers.wait import wait_for

TTL_S = 2.0


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[TcpProxy]:
    with TcpProxy(redis_server.port) as p:
        yield p


@pytest.mark.parametrize("task", ["stops-on-sigterm", "ignores-sigterm"])
def test_row6a_blackhole_keeper_declares_loss_by_its_deadline_and_kills_before_the_ttl(
    redis_server: RedisServer,
    r: redis.Redis,
    proxy: TcpProxy,
    tmp_path: Path,
    *,
    figure: Figure,
    task: str,
) -> None:
    """At the keeper's deadline (lose_at) the task gets SIGTERM; one that ignores it is killed
    at expires_at, the TTL less the drift margin: before Redis can let anyone else in."""
    ticks = tmp_path / "ticks"
    stubborn = task == "ignores-sigterm"
    through_proxy = runner_env(f"redis://127.0.0.1:{proxy.port}/0", CRON_RUNNER_LEASE_TTL="2s")
    direct = runner_env(redis_server.url, CRON_RUNNER_LEASE_TTL="2s")
    a = spawn(exec_args("cut", "pod-a", ticker_command(ticks, "a", ignore_term=stubborn)),
              through_proxy)  # fmt: skip
    wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")

    proxy.blackhole()
    before_query = time.time()
    left_ms = int(r.pttl(LEASE % "cut"))  # type: ignore[arg-type]
    # No renewal reaches Redis from now on: the lease expires there at this instant, or later.
    expires_not_before = before_query + left_ms / 1000

    b, outcomes = run_until_ran(exec_args("cut", "pod-b", ticker_command(ticks, "b", seconds=0.3)),
                                direct)  # fmt: skip
    _, a_err = a.communicate(timeout=30)
    assert_clean(a_err)
    assert (a.returncode, outcome(a_err)) == (75, "lease_lost"), a_err
    assert "no renewal confirmed before the local deadline" in a_err
    a_ticks, b_ticks = read_ticks(ticks, "a"), read_ticks(ticks, "b")
    a_last = max(t.t for t in a_ticks)
    lost_at = event_time(a_err, "lease_lost")
    # Stopped on its own clock, before Redis could let anyone else in ...
    assert lost_at < expires_not_before
    assert a_last < expires_not_before
    # ... and the second holder started only after: a gap, never an overlap.
    assert event_time(b.stderr, "acquired") >= expires_not_before - 0.001
    gap_ms = -overlap_ms(a_ticks, b_ticks)
    assert gap_ms > 0
    assert set(outcomes) == {"skipped_held"}
    if stubborn:
        assert "task killed" in a_err
    figure(
        "6a",
        task=task,
        duplicates=0,
        overlap_ms=0,
        gap_ms=gap_ms,
        lost_before_expiry_ms=round((expires_not_before - lost_at) * 1000, 1),
        task_stopped_before_expiry_ms=round((expires_not_before - a_last) * 1000, 1),
        exit_codes={"a": a.returncode, "b": b.returncode},
    )


def test_row6b_latency_below_the_socket_timeout_the_run_completes(
    proxy: TcpProxy, tmp_path: Path, figure: Figure
) -> None:
    ticks = tmp_path / "ticks"
    latency_s = 0.15  # each way: 300 ms a round trip, under the 500 ms socket timeout (ttl/4)
    proxy.set_latency(latency_s)
    env = runner_env(f"redis://127.0.0.1:{proxy.port}/0", CRON_RUNNER_LEASE_TTL="2s")
    # Longer than the TTL: renewals must be confirmed across the latency.
    res = run_until_ran(exec_args("slow", "pod-a", ticker_command(ticks, "a", seconds=2.5)), env)[0]
    assert_clean(res.stderr)
    assert res.returncode == 0
    assert not [e for e in events(res.stderr) if e.get("event") in ("renew_failed", "lease_lost")]
    figure("6b", duplicates=0, overlap_ms=0, latency_ms_each_way=latency_s * 1000,
           exit_codes={"a": res.returncode})  # fmt: skip


def test_row6c_connections_dropped_and_refused_briefly_the_keeper_reconnects(
    proxy: TcpProxy, tmp_path: Path, figure: Figure
) -> None:
    ticks, a_log = tmp_path / "ticks", tmp_path / "a.log"
    env = runner_env(f"redis://127.0.0.1:{proxy.port}/0", CRON_RUNNER_LEASE_TTL="2s")
    a = LoggedRun(exec_args("blip", "pod-a", ticker_command(ticks, "a", seconds=3)), env, a_log)
    wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
    proxy.refuse()
    proxy.drop()
    cut_at = time.monotonic()
    # Cut until a renewal has failed (within a renew interval, 0.67 s), so that it is retried,
    # and healed well before the keeper's deadline (1.23 s).
    wait_for(lambda: a.logged("renew_failed"), what="A's renewal to fail")
    outage_ms = round((time.monotonic() - cut_at) * 1000)
    proxy.heal()
    a_err = a.finish()
    assert_clean(a_err)
    assert (a.returncode, outcome(a_err)) == (0, "ran"), a_err
    retried = sum(e.get("event") == "renew_failed" for e in events(a_err))
    assert retried >= 1
    figure("6c", duplicates=0, overlap_ms=0, outage_ms=outage_ms, renewals_retried=retried,
           exit_codes={"a": a.returncode})  # fmt: skip
