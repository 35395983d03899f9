"""Fault matrix rows 1 and 2: the holder killed with SIGKILL, or frozen with SIGSTOP.

Real ``cron-runner exec`` processes; the task is tests/helpers/ticker.py, whose ticks carry
wall times (one clock for every process here) and, with a sink, go through a SQLite write
guarded by the fencing token. A second holder is started again and again, as a CronJob's
retries would be, until it takes over.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import redis

from runner.devserver import RedisServer
from tests.fault.common import (
    LEASE,
    assert_clean,
    event,
    event_time,
    overlap_ms,
    run_until_ran,
    sink_writes,
    stale_writes_accepted,
    start_when_free,
)
from tests.fault.conftest import Figure
from tests.helpers.proc import outcome, runner_env, spawn
from tests.helpers.ticker import children, read_ticks, ticker_command
from tests.helpers.wait import wait_for


def _exec(name: str, holder: str, command: list[str]) -> list[str]:
    return ["exec", "--name", name, "--holder", holder, "--", *command]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return stat[0] != "Z"


def test_row1_kill9_of_the_holder_next_run_takes_over_after_the_ttl_never_before(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path, figure: Figure
) -> None:
    ticks = tmp_path / "ticks"
    env = runner_env(redis_server.url, CRON_RUNNER_LEASE_TTL="2s")
    a = spawn(_exec("k9", "pod-a", ticker_command(ticks, "a")), env)
    wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
    (child,) = children(a.pid)

    # The pod dies: the runner and its task, at once (a container's processes die with it).
    os.killpg(child, signal.SIGKILL)
    a.kill()
    before_query = time.time()
    left_ms = int(r.pttl(LEASE % "k9"))  # type: ignore[arg-type]
    a.communicate(timeout=10)
    # Redis can let the lease go no earlier than this.
    expiry_not_before = before_query + left_ms / 1000

    b, outcomes = run_until_ran(_exec("k9", "pod-b", ticker_command(ticks, "b", seconds=0.2)), env)
    taken_at = event_time(b.stderr, "acquired")
    assert taken_at >= expiry_not_before - 0.001  # the log's ts is truncated to the ms
    assert outcomes and set(outcomes) == {"skipped_held"}, outcomes
    assert event(b.stderr, "acquired")["fence"] > read_ticks(ticks, "a")[0].fence
    gap = -overlap_ms(read_ticks(ticks, "a"), read_ticks(ticks, "b"))
    assert gap > 0
    figure(
        "1",
        duplicates=0,
        overlap_ms=0,
        gap_ms=gap,
        lease_left_at_kill_ms=left_ms,
        took_over_after_expiry_ms=round((taken_at - expiry_not_before) * 1000, 1),
        retries_refused=len(outcomes),
        exit_codes={"a": "SIGKILL", "b": b.returncode},
    )


def test_row1b_kill9_of_the_runner_alone_takes_its_command_with_it(
    redis_server: RedisServer, tmp_path: Path, figure: Figure
) -> None:
    """On a VM (crontab), the OOM killer may kill the runner and not its command, which runs
    in its own process group. The command is started with PR_SET_PDEATHSIG, so the kernel
    kills it with the runner: nothing runs on unsupervised while the lease expires and a
    second holder starts (docs/reliability.md)."""
    ticks, sink = tmp_path / "ticks", tmp_path / "sink.db"
    env = runner_env(redis_server.url, CRON_RUNNER_LEASE_TTL="1500ms")
    a = spawn(_exec("orphan", "vm-a", ticker_command(ticks, "a", sink=sink)), env)
    wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
    (child,) = children(a.pid)
    a.kill()
    a.wait(timeout=10)
    try:
        wait_for(lambda: not _alive(child), timeout_s=5, what="the command to die with its runner")
        b, _ = run_until_ran(
            _exec("orphan", "vm-b", ticker_command(ticks, "b", seconds=0.5, sink=sink)), env
        )
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
        a.communicate(timeout=10)
    assert_clean(b.stderr)
    a_ticks, b_ticks = read_ticks(ticks, "a"), read_ticks(ticks, "b")
    (fence_a,), (fence_b,) = {t.fence for t in a_ticks}, {t.fence for t in b_ticks}
    assert fence_b > fence_a
    assert stale_writes_accepted(sink, "a", "b") == 0
    overlap = overlap_ms(a_ticks, b_ticks)
    assert overlap <= 0
    figure(
        "1b",
        duplicates=0,
        overlap_ms=0,
        gap_ms=round(-overlap, 1),
        orphan_alive_after_takeover=False,
        exit_codes={"a": "SIGKILL", "b": b.returncode},
    )


def _freeze_and_take_over(
    redis_server: RedisServer,
    tmp_path: Path,
    name: str,
    *,
    freeze_child: bool,
) -> dict[str, object]:
    ticks, sink = tmp_path / "ticks", tmp_path / "sink.db"
    env = runner_env(redis_server.url, CRON_RUNNER_LEASE_TTL="1500ms")
    a = spawn(
        _exec(name, "pod-a", ticker_command(ticks, "a", sink=sink)), env, start_new_session=True
    )
    wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
    (child,) = children(a.pid)
    os.killpg(a.pid, signal.SIGSTOP)
    if freeze_child:
        os.killpg(child, signal.SIGSTOP)
    try:
        b, outcomes = start_when_free(
            _exec(name, "pod-b", ticker_command(ticks, "b", seconds=1.5, sink=sink)),
            env,
            ticks,
            "b",
        )
        assert set(outcomes) <= {"skipped_held"}, outcomes
        time.sleep(0.2)  # B is running: A wakes into it
        resumed_at = time.time()
    finally:
        if freeze_child:
            os.killpg(child, signal.SIGCONT)
        os.killpg(a.pid, signal.SIGCONT)
    _, a_err = a.communicate(timeout=30)
    _, b_err = b.communicate(timeout=30)
    assert_clean(a_err)
    assert_clean(b_err)
    assert (a.returncode, outcome(a_err)) == (75, "lease_lost"), a_err
    assert (b.returncode, outcome(b_err)) == (0, "ran"), b_err
    assert not _alive(child)
    a_ticks, b_ticks = read_ticks(ticks, "a"), read_ticks(ticks, "b")
    assert stale_writes_accepted(sink, "a", "b") == 0
    assert [f for _, f in sink_writes(sink)] == sorted(f for _, f in sink_writes(sink))
    after_resume = [t for t in a_ticks if t.t >= resumed_at]
    # Side effects of A while B ran: with A's task frozen too, only those after the resume.
    overlap = (
        round((max(t.t for t in after_resume) - resumed_at) * 1000, 1)
        if freeze_child and after_resume
        else max(overlap_ms(a_ticks, b_ticks), 0)
    )
    return {
        "overlap_ms": overlap,
        "a_ticks_after_resume": len(after_resume),
        "stale_writes_rejected": sum(t.outcome == "rejected" for t in a_ticks),
        "exit_codes": {"a": a.returncode, "b": b.returncode},
    }


def test_row2_holder_frozen_past_its_ttl_wakes_into_a_new_holder_and_exits_4(
    redis_server: RedisServer, tmp_path: Path, figure: Figure
) -> None:
    """The whole holder is frozen (a paused VM or pod: runner and task together). On SIGCONT
    the runner sees its deadline passed and kills the task within its supervision tick."""
    seen = _freeze_and_take_over(redis_server, tmp_path, "frozen", freeze_child=True)
    # The documented kill latency: one supervision tick (50 ms) plus signal delivery and
    # scheduling; the bound only catches a runner that did not stop its task at all.
    assert float(seen["overlap_ms"]) <= 1000, seen  # type: ignore[arg-type]
    figure("2", duplicates=0, **seen)


def test_row2b_runner_frozen_but_not_its_child_the_fence_keeps_the_child_out(
    redis_server: RedisServer, tmp_path: Path, figure: Figure
) -> None:
    """Only the runner's process group is stopped: its command runs on, unsupervised, while
    a second holder runs. The overlap lasts as long as the freeze; the fence rejects the stale
    writes (docs/reliability.md, Limits)."""
    seen = _freeze_and_take_over(redis_server, tmp_path, "half-frozen", freeze_child=False)
    assert float(seen["overlap_ms"]) > 0  # type: ignore[arg-type]
    assert int(seen["stale_writes_rejected"]) > 0  # type: ignore[call-overload]
    figure("2b", duplicates=1, **seen)
