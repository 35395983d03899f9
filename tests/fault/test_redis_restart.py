"""Fault matrix row 3: Redis restarted while a task runs, with AOF (everysec) and without
persistence. The holder is a real ``cron-runner exec``; Redis is a real ``redis-server``
killed or stopped and started again on the same port and data directory."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runner.testing import RedisServer
from tests.fault.common import (
    assert_clean,
    event,
    finished,
    overlap_ms,
    stale_writes_accepted,
    start_when_free,
)
from tests.fault.conftest import Figure
from tests.helpers.proc import LEASE, LoggedRun, events, outcome, run, runner_env, spawn
from tests.helpers.ticker import read_ticks, ticker_command
from tests.helpers.wait import wait_for


def _warm_fence(env: dict[str, str], name: str, runs: int) -> None:
    for _ in range(runs):
        assert run(["exec", "--name", name, "--", "true"], env).returncode == 0


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
def test_row3a_redis_restarted_with_aof_holder_keeps_its_lease_and_the_fence_goes_on(
    tmp_path: Path, figure: Figure, stop: str
) -> None:
    ticks, a_log = tmp_path / "ticks", tmp_path / "a.log"
    with RedisServer(appendonly=True) as server:
        client = server.client()
        env = runner_env(server.url, CRON_RUNNER_LEASE_TTL="3s")
        _warm_fence(env, "aof", 2)
        # Longer than the TTL: the lease must be renewed across the restart to finish.
        a = LoggedRun(
            ["exec", "--name", "aof", "--", *ticker_command(ticks, "a", seconds=4)], env, a_log
        )
        wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
        token = client.get(LEASE % "aof")
        down_at = time.monotonic()
        server.stop(kill=stop == "SIGKILL")
        # Down until a renewal has failed (within a renew interval, ttl/3 = 1 s), so that it is
        # retried, and back well before the keeper's deadline (ttl - margin - ttl/3 = 1.85 s).
        wait_for(lambda: a.logged("renew_failed"), what="A's renewal to fail")
        server.start()
        down_ms = round((time.monotonic() - down_at) * 1000, 1)
        client = server.client()
        assert client.get(LEASE % "aof") == token  # the lease came back from the AOF
        a_err = a.finish()
        assert_clean(a_err)
        assert (a.returncode, outcome(a_err)) == (0, "ran"), a_err
        failed = sum(e.get("event") == "renew_failed" for e in events(a_err))
        assert failed >= 1
        fence = event(a_err, "acquired")["fence"]
        nxt = run(["exec", "--name", "aof", "--", "true"], env)
        assert event(nxt.stderr, "acquired")["fence"] > fence
        client.close()
    figure(
        "3a",
        redis_stop=stop,
        duplicates=0,
        overlap_ms=0,
        redis_down_ms=down_ms,
        renewals_failed_then_retried=failed,
        fence_before=fence,
        fence_after=event(nxt.stderr, "acquired")["fence"],
        exit_codes={"a": a.returncode},
    )


def test_row3b_redis_restarted_without_persistence_holder_detects_the_loss(
    tmp_path: Path, figure: Figure
) -> None:
    """Everything is gone after the restart: the lease, the slot markers and the fence counter.
    The holder learns it at its next renewal (refused: not the owner) and stops its task. The
    new holder's fence is still above the old one (it is never below the server's clock in
    ms), so a sink guarded by the fence takes the new holder's writes and refuses the stale
    holder's from the new holder's first write on."""
    ticks, sink = tmp_path / "ticks", tmp_path / "sink.db"
    with RedisServer(appendonly=False) as server:
        env = runner_env(server.url, CRON_RUNNER_LEASE_TTL="3s")
        _warm_fence(env, "volatile", 2)
        a = spawn(
            ["exec", "--name", "volatile", "--holder", "pod-a", "--",
             *ticker_command(ticks, "a", sink=sink)], env,
        )  # fmt: skip
        wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
        server.restart(kill=True)
        b, _ = start_when_free(
            ["exec", "--name", "volatile", "--holder", "pod-b", "--",
             *ticker_command(ticks, "b", seconds=1.5, sink=sink)], env, ticks, "b",
        )  # fmt: skip
        a_err, b_err = finished(a, b)
    assert (a.returncode, outcome(a_err)) == (75, "lease_lost"), a_err
    # Refused at the next renewal: the lease is free, or already B's.
    assert "renew refused: not the lease owner" in event(a_err, "lease_lost")["msg"]
    assert (b.returncode, outcome(b_err)) == (0, "ran"), b_err
    fence_a, fence_b = event(a_err, "acquired")["fence"], event(b_err, "acquired")["fence"]
    # The fence went on up across the loss of Redis's data ...
    assert fence_b > fence_a
    # ... so the sink takes the new holder's writes and none of the stale holder's after them.
    b_ticks = read_ticks(ticks, "b")
    assert b_ticks and {t.outcome for t in b_ticks} == {"accepted"}
    assert stale_writes_accepted(sink, "a", "b") == 0
    a_ticks = read_ticks(ticks, "a")
    overlap = overlap_ms(a_ticks, b_ticks)
    figure(
        "3b",
        duplicates=1 if overlap > 0 else 0,
        overlap_ms=max(overlap, 0),
        fence_before=fence_a,
        fence_after=fence_b,
        new_holder_writes_accepted=len(b_ticks),
        stale_writes_refused=sum(t.outcome == "rejected" for t in a_ticks),
        exit_codes={"a": a.returncode, "b": b.returncode},
    )
