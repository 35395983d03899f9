"""Keeper under real faults: a holder frozen by SIGSTOP, Redis killed, Redis hung.

Timestamps are ``time.monotonic()``, CLOCK_MONOTONIC on Linux, one clock for every process
on the machine, so instants recorded by a subprocess compare with the test's own. The
assertions order events against the keeper's deadlines; none measures how fast anything ran.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.keys import TaskKeys
from runner.lease.keeper import Keeper
from runner.lease.scripts import Acquired, Lease, new_token
from runner.testing import RedisServer
from tests.helpers.lease_tools import (
    ROOT,
    helper_command,
    pttl_ms,
    read_events,
    wait_event,
)
from tests.helpers.wait import wait_for


@pytest.fixture
def holder_proc(
    redis_server: RedisServer, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    events, effects = tmp_path / "events.jsonl", tmp_path / "effects.log"
    args = [str(redis_server.port), "paused", "1500", str(events), str(effects)]
    proc = subprocess.Popen(
        helper_command("paused_holder.py", *args),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        yield proc, events, effects
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.communicate(timeout=10)


def effect_times(path: Path) -> list[float]:
    return (
        [float(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []
    )


@pytest.mark.parametrize("work_waiting", [True, False], ids=["work-waiting", "idle"])
def test_holder_frozen_past_its_ttl_does_no_work_after_it_resumes(
    holder_proc: tuple[subprocess.Popen[str], Path, Path], r: redis.Redis, work_waiting: bool
) -> None:
    proc, events, effects = holder_proc
    assert proc.stdin is not None
    stdin = proc.stdin
    keys = TaskKeys("cron-runner", "faults", "paused")
    acquired = wait_event(events, "acquired")

    def work(expect_effects: int | None) -> None:
        stdin.write("work\n")
        stdin.flush()
        if expect_effects is not None:
            wait_for(
                lambda: len(effect_times(effects)) == expect_effects,
                what=f"side effect {expect_effects}",
            )

    # Healthy: work goes on while the keeper renews, past a whole TTL after the acquisition.
    work(1)
    wait_for(
        lambda: sum(e["event"] == "renewed" for e in read_events(events)) >= 4,
        what="four renewals (more than one TTL)",
    )
    work(2)
    work(3)
    assert effect_times(effects)[-1] > acquired["t"] + 1.5
    assert r.get(keys.lease) == acquired["token"]

    # Frozen between two units of work, until Redis lets the lease expire.
    stopped_at = time.monotonic()
    os.kill(proc.pid, signal.SIGSTOP)
    wait_for(lambda: not r.exists(keys.lease), what="the frozen holder's lease to expire")
    other = Lease(r, keys, new_token("pod-other"), ttl_ms=60_000)
    other_sent_at = time.monotonic()
    taken = other.acquire(None)
    assert isinstance(taken, Acquired) and taken.fence > acquired["fence"]

    if work_waiting:
        # The next unit of work is already queued when it wakes: the owner's own check
        # races the keeper thread, and must refuse whichever of them notices first.
        work(None)
    resumed_at = time.monotonic()
    os.kill(proc.pid, signal.SIGCONT)

    lost = wait_event(events, "lost")
    assert lost["t"] >= resumed_at
    assert lost["reason"] == "no renewal confirmed before the local deadline"
    if not work_waiting:
        # Nobody asked: the keeper thread found it by itself.
        assert lost["thread"] == "lease-keeper"
        work(None)
    refused = wait_event(events, "refused_work")
    assert refused["reason"] == "lease lost"
    assert refused["lost_reason"] == lost["reason"]

    stdin.write("exit\n")
    stdin.flush()
    assert proc.wait(timeout=10) == 4
    release = wait_event(events, "release_refused")
    assert release["current_holder"] == "pod-other"

    # No side effect at all after the pause: three before it, none after.
    times = effect_times(effects)
    assert len(times) == 3
    assert max(times) < stopped_at < other_sent_at
    # The frozen holder's keeper never touched the new holder's lease.
    assert r.get(keys.lease) == other.token
    assert pttl_ms(r, keys.lease) > 1500


def keeper_with_reports(
    client: redis.Redis, ttl_ms: int
) -> tuple[Lease, Keeper, list[tuple[float, str]], threading.Event]:
    lease = Lease(
        client, TaskKeys("cron-runner", "faults", "report"), new_token("t"), ttl_ms=ttl_ms
    )
    sent_at = time.monotonic()
    assert isinstance(lease.acquire(None), Acquired)
    reports: list[tuple[float, str]] = []
    lost = threading.Event()

    def on_lost(reason: str) -> None:
        reports.append((time.monotonic(), threading.current_thread().name))
        lost.set()

    keeper = Keeper(lease, ttl_s=ttl_ms / 1000, confirmed_at=sent_at, on_lost=on_lost)
    return lease, keeper, reports, lost


def test_redis_killed_keeper_reports_loss_by_its_local_deadline(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client(socket_connect_timeout=1, socket_timeout=1)
    _, keeper, reports, lost = keeper_with_reports(client, ttl_ms=2000)
    keeper.start()
    try:
        wait_for(lambda: keeper.renewals >= 1, what="a first renewal")
        redis_server.stop(kill=True)
        killed_at = time.monotonic()
        assert lost.wait(10)
    finally:
        keeper.stop()
        client.close()

    (lost_at, thread), *more = reports
    assert more == []
    assert thread == "lease-keeper"
    assert keeper.lost_reason == "no renewal confirmed before the local deadline"
    assert keeper.failed_renewals >= 1
    # Not before the deadline (nothing refused the lease), and at it: the thread wakes at
    # lose_at, leaving the task the rest of a renew interval to stop before expires_at.
    assert killed_at < keeper.lose_at <= lost_at < keeper.lose_at + 0.25
    assert lost_at < keeper.expires_at


def test_redis_hung_owner_learns_of_the_loss_by_its_deadline(
    redis_server: RedisServer,
) -> None:
    # socket_timeout longer than the TTL: the keeper's renewal hangs on the socket, so only
    # the owner's own view of the clock (is_lost, as a run asks it every tick) can notice the
    # deadline.
    client = redis_server.client(socket_connect_timeout=1, socket_timeout=8)
    _, keeper, reports, _ = keeper_with_reports(client, ttl_ms=1500)
    assert redis_server.proc is not None
    keeper.start()
    try:
        wait_for(lambda: keeper.renewals >= 1, what="a first renewal")
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        wait_for(keeper.is_lost, what="the owner to see the deadline pass")
        noticed_at = time.monotonic()
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
        keeper.stop()
        client.close()

    assert keeper.renewals == 1
    assert keeper.lost_reason == "no renewal confirmed before the local deadline"
    (lost_at, thread), *more = reports
    assert more == []
    assert thread == "MainThread"
    assert frozen_at < keeper.lose_at <= lost_at <= noticed_at < keeper.expires_at
