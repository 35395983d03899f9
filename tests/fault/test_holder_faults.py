"""Fault matrix rows 1 and 2: the holder killed with SIGKILL, or frozen with SIGSTOP.

Real ``cron-runner exec`` processes; the task is tests/helpers/ticker.py, whose ticks carry
wall times (one clock for every process here) and, with a sink, go through a SQLite write
guarded by the fencing token. A second holder is started again and again, as a CronJob's
retries would be, until it takes over.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from runner.errors import LeaseLost
from runner.testing import RedisServer
from tests.fault.common import (
    assert_clean,
    event,
    event_time,
    finished,
    freeze_outside_a_sink_write,
    overlap_ms,
    run_until_ran,
    sink_writes,
    stale_writes_accepted,
    start_when_free,
)
from tests.fault.conftest import Figure
from tests.helpers.proc import LEASE, events, exec_args, outcome, run, runner_env, spawn
from tests.helpers.ticker import command_of, read_ticks, supervisor_of, ticker_command
from tests.helpers.wait import wait_for


def _b_takes_over(
    name: str, env: dict[str, str], ticks: Path, *, seconds: float, sink: Path | None = None
) -> subprocess.Popen[str]:
    """Pod B's run of ``name`` once it has the lease and its task ticks; B's runs before it
    could only find the lease held."""
    args = exec_args(name, "pod-b", ticker_command(ticks, "b", seconds=seconds, sink=sink))
    b, outcomes = start_when_free(args, env, ticks, "b")
    assert set(outcomes) <= {"skipped_held"}, outcomes
    return b


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except FileNotFoundError:  # reaped between the signal and the read
        return False
    return stat[0] != "Z"


def test_row1_kill9_of_the_holder_next_run_takes_over_after_the_ttl_never_before(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path, figure: Figure
) -> None:
    ticks = tmp_path / "ticks"
    env = runner_env(redis_server.url, CRON_RUNNER_LEASE_TTL="2s")
    a = spawn(exec_args("k9", "pod-a", ticker_command(ticks, "a")), env)
    wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
    child = command_of(a.pid)

    # The pod dies: the runner and its task, at once (a container's processes die with it).
    os.killpg(child, signal.SIGKILL)
    a.kill()
    before_query = time.time()
    left_ms = int(r.pttl(LEASE % "k9"))  # type: ignore[arg-type]
    a.communicate(timeout=10)
    # Redis can let the lease go no earlier than this.
    expiry_not_before = before_query + left_ms / 1000

    b, outcomes = run_until_ran(
        exec_args("k9", "pod-b", ticker_command(ticks, "b", seconds=0.2)), env
    )
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
    a = spawn(exec_args("orphan", "vm-a", ticker_command(ticks, "a", sink=sink)), env)
    wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
    child = command_of(a.pid)
    a.kill()
    a.wait(timeout=10)
    try:
        wait_for(lambda: not _alive(child), timeout_s=5, what="the command to die with its runner")
        b, _ = run_until_ran(
            exec_args("orphan", "vm-b", ticker_command(ticks, "b", seconds=0.5, sink=sink)), env
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


def test_row1d_a_daemon_that_left_the_process_group_is_stopped_before_the_release(
    redis_server: RedisServer, tmp_path: Path, figure: Figure
) -> None:
    """`exec -- sh -c "setsid daemon & sleep 1"`: the daemon leaves the command's process
    group, so killing the group misses it. The runner is a child subreaper: the daemon comes
    back to it when its shell exits, and is stopped before the lease is released."""
    ticks, pidfile = tmp_path / "ticks", tmp_path / "daemon.pid"
    daemon = tmp_path / "daemon.sh"
    # Its output elsewhere, as a daemon's: the runner's stderr pipe closes when the runner exits.
    ticker = shlex.join(ticker_command(ticks, "a"))
    daemon.write_text(f"echo $$ > {pidfile}\nexec {ticker} </dev/null >/dev/null 2>&1\n")
    env = runner_env(redis_server.url)
    command = ["sh", "-c", f"setsid sh {daemon} & sleep 1"]
    try:
        a = run(exec_args("daemon", "vm-a", command), env)
        ended = time.time()
        daemon_pid = int(pidfile.read_text())
        assert_clean(a.stderr)
        assert (a.returncode, outcome(a.stderr)) == (0, "ran"), a.stderr
        assert read_ticks(ticks, "a"), "the daemon never started"
        assert not _alive(daemon_pid), "the daemon outlived its runner"
        released_at = event_time(a.stderr, "released")
        # The log's ts is truncated to the ms.
        assert max(t.t for t in read_ticks(ticks, "a")) < released_at + 0.001
        assert daemon_pid in event(a.stderr, "descendants_stopped")["pids"]
        b = run(exec_args("daemon", "vm-b", ticker_command(ticks, "b", seconds=0.3)), env)
    finally:
        if pidfile.exists() and _alive(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert (b.returncode, outcome(b.stderr)) == (0, "ran"), b.stderr
    overlap = overlap_ms(read_ticks(ticks, "a"), read_ticks(ticks, "b"))
    assert overlap < 0
    assert not [t for t in read_ticks(ticks, "a") if t.t > ended]
    figure("1d", duplicates=0, overlap_ms=0, gap_ms=-overlap,
           exit_codes={"a": a.returncode, "b": b.returncode})  # fmt: skip


def test_row2_holder_frozen_past_its_ttl_wakes_into_a_new_holder_and_exits_4(
    redis_server: RedisServer, tmp_path: Path, figure: Figure
) -> None:
    """The whole holder is frozen (a paused VM or pod: runner, supervisor and task together).
    On SIGCONT the runner sees its deadline passed and kills the task within its supervision
    tick."""
    ticks, sink = tmp_path / "ticks", tmp_path / "sink.db"
    env = runner_env(redis_server.url, CRON_RUNNER_LEASE_TTL="1500ms")
    a = spawn(
        exec_args("frozen", "pod-a", ticker_command(ticks, "a", sink=sink)),
        env,
        start_new_session=True,
    )
    wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
    child, supervisor = command_of(a.pid), supervisor_of(a.pid)
    groups = (a.pid, supervisor, child)
    freeze_outside_a_sink_write(groups, child, sink)
    try:
        b = _b_takes_over("frozen", env, ticks, seconds=1.5, sink=sink)
        # B is running (start_when_free returned on its first tick, after its first write to
        # the sink): A wakes into it.
        resumed_at = time.time()
    finally:
        for group in reversed(groups):
            os.killpg(group, signal.SIGCONT)
    a_err, b_err = finished(a, b)
    assert (a.returncode, outcome(a_err)) == (LeaseLost.exit_code, "lease_lost"), a_err
    assert (b.returncode, outcome(b_err)) == (0, "ran"), b_err
    assert not _alive(child)
    a_ticks = read_ticks(ticks, "a")
    assert stale_writes_accepted(sink, "a", "b") == 0
    assert [f for _, f in sink_writes(sink)] == sorted(f for _, f in sink_writes(sink))
    after_resume = [t for t in a_ticks if t.t >= resumed_at]
    # Side effects of A while B ran: with A's task frozen too, only those after the resume.
    # The documented kill latency: one supervision tick (50 ms) plus signal delivery and
    # scheduling; the bound only catches a runner that did not stop its task at all.
    overlap = round((max(t.t for t in after_resume) - resumed_at) * 1000, 1) if after_resume else 0
    assert overlap <= 1000
    figure(
        "2",
        duplicates=0,
        overlap_ms=overlap,
        a_ticks_after_resume=len(after_resume),
        stale_writes_rejected=sum(t.outcome == "rejected" for t in a_ticks),
        exit_codes={"a": a.returncode, "b": b.returncode},
    )


@pytest.mark.parametrize("past_ttl_s", [1, 10])
def test_row2b_runner_frozen_alone_its_supervisor_kills_the_command_before_the_lease_expires(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path, figure: Figure, past_ttl_s: int
) -> None:
    """Only the runner's process group is stopped, for 1 s or 10 s past the TTL: its command
    would run on, unsupervised, beside the next holder for as long as the freeze lasts. The
    supervisor kills it at the lease's local expiry, which the frozen runner cannot push back,
    before the lease can expire in Redis; so before any second holder starts."""
    ttl_s = 1.5
    ticks, sink = tmp_path / "ticks", tmp_path / "sink.db"
    env = runner_env(redis_server.url, CRON_RUNNER_LEASE_TTL=f"{int(ttl_s * 1000)}ms")
    a = spawn(
        exec_args("half-frozen", "pod-a", ticker_command(ticks, "a", sink=sink)),
        env,
        start_new_session=True,
    )
    wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
    child = command_of(a.pid)
    os.killpg(a.pid, signal.SIGSTOP)
    frozen_at = time.time()
    # Redis lets the lease go no earlier than this (a renewal in flight only moves it later).
    expiry_not_before = frozen_at + int(r.pttl(LEASE % "half-frozen")) / 1000  # type: ignore[arg-type]
    try:
        b = _b_takes_over("half-frozen", env, ticks, seconds=1.0, sink=sink)
        time.sleep(max(0.0, frozen_at + ttl_s + past_ttl_s - time.time()))
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    frozen_s = time.time() - frozen_at
    a_err, b_err = finished(a, b)
    assert (a.returncode, outcome(a_err)) == (LeaseLost.exit_code, "lease_lost"), a_err
    assert (b.returncode, outcome(b_err)) == (0, "ran"), b_err
    assert not _alive(child)
    assert "task killed by its supervisor" in a_err
    a_ticks, b_ticks = read_ticks(ticks, "a"), read_ticks(ticks, "b")
    last_a = max(t.t for t in a_ticks)
    assert last_a < expiry_not_before
    overlap = overlap_ms(a_ticks, b_ticks)
    assert overlap < 0, "A's command ran beside B"
    assert stale_writes_accepted(sink, "a", "b") == 0
    assert not [t for t in a_ticks if t.outcome == "rejected"]
    figure(
        f"2b-{past_ttl_s}s",
        duplicates=0,
        overlap_ms=0,
        gap_ms=-overlap,
        frozen_ms=round(frozen_s * 1000),
        killed_before_expiry_ms=round((expiry_not_before - last_a) * 1000, 1),
        exit_codes={"a": a.returncode, "b": b.returncode},
    )


def test_row1b_kill9_of_the_runner_alone_takes_the_commands_whole_group(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """PR_SET_PDEATHSIG reaches the command's first process only; what it forked, in its
    group, ran on after the runner died. The supervisor sees the runner's end of its pipe
    close and kills the group."""
    pidfile = tmp_path / "sleep.pid"
    env = runner_env(redis_server.url)
    script = f"sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {pidfile}; wait"
    a = spawn(exec_args("group", "vm-a", ["sh", "-c", script]), env)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the command's child")
    grandchild = int(pidfile.read_text())
    a.kill()
    a.communicate(timeout=10)
    try:
        wait_for(
            lambda: not _alive(grandchild), timeout_s=5, what="the group to die with the runner"
        )
    finally:
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_row1d_a_descendant_that_cannot_be_confirmed_stopped_keeps_the_lease(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    """A daemon traced by another process (an operator's strace or gdb) dies of the runner's
    SIGKILL, but its parent cannot reap it, so cannot confirm it gone, until the tracer lets
    go. Then the runner keeps the lease (no release, no marker) and lets it expire by its TTL."""
    libc = ctypes.CDLL(None, use_errno=True)
    ptrace_seize, wall = 0x4206, 0x40000000
    pidfile, daemon = tmp_path / "daemon.pid", tmp_path / "daemon.sh"
    daemon.write_text(f"echo $$ > {pidfile}\nexec sleep 60 </dev/null >/dev/null 2>&1\n")
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE="0 0 * * *")
    a = spawn(exec_args("traced", "vm-a", ["sh", "-c", f"setsid sh {daemon} & sleep 1"]), env)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the daemon")
    daemon_pid = int(pidfile.read_text())
    assert libc.ptrace(ptrace_seize, daemon_pid, None, None) == 0, ctypes.get_errno()
    try:
        _, stderr = a.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon_pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(daemon_pid, wall)  # as its tracer: lets it go
    assert_clean(stderr)
    assert (a.returncode, outcome(stderr)) == (1, "failed"), stderr
    assert str(daemon_pid) in event(stderr, "descendants_not_stopped")["msg"]
    assert "released" not in [e.get("event") for e in events(stderr)]
    assert r.get(LEASE % "traced") is not None
    assert int(r.pttl(LEASE % "traced")) > 0  # type: ignore[arg-type]
    assert not r.keys("cron-runner:{default:traced}:slot:*")
    (entry,) = r.xrange("cron-runner:{default:traced}:runs")  # type: ignore[misc]
    assert entry[1]["outcome"] == "failed"
    assert str(daemon_pid) in entry[1]["error"]


def test_row2b_runner_frozen_alone_its_supervisor_also_kills_what_left_the_group(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    """The command has started a daemon outside its group. With the runner frozen, the
    supervisor kills the command's group; the daemon, its parent gone, comes back to the frozen
    runner (a subreaper), and the supervisor kills it there too, before the lease expires."""
    ticks, pidfile, daemon = tmp_path / "ticks", tmp_path / "daemon.pid", tmp_path / "daemon.sh"
    ticker = shlex.join(ticker_command(ticks, "d"))
    daemon.write_text(f"echo $$ > {pidfile}\nexec {ticker} </dev/null >/dev/null 2>&1\n")
    command = ["sh", "-c", f"setsid sh {daemon} & exec {shlex.join(ticker_command(ticks, 'a'))}"]
    env = runner_env(redis_server.url, CRON_RUNNER_LEASE_TTL="1500ms")
    a = spawn(exec_args("half-frozen", "pod-a", command), env, start_new_session=True)
    wait_for(lambda: read_ticks(ticks, "a") and read_ticks(ticks, "d"), what="A and its daemon")
    daemon_pid = int(pidfile.read_text())
    try:
        os.killpg(a.pid, signal.SIGSTOP)
        frozen_at = time.time()
        expiry_not_before = frozen_at + int(r.pttl(LEASE % "half-frozen")) / 1000  # type: ignore[arg-type]
        b, _ = start_when_free(
            exec_args("half-frozen", "pod-b", ticker_command(ticks, "b", seconds=0.5)),
            env,
            ticks,
            "b",
        )
        # Still frozen, B running: the supervisor, not the runner, must have killed the daemon
        # (that it died before the lease expired is asserted from the ticks below).
        wait_for(lambda: not _alive(daemon_pid), what="the daemon to be killed")
    finally:
        os.killpg(a.pid, signal.SIGCONT)
        if _alive(daemon_pid):
            os.kill(daemon_pid, signal.SIGKILL)
    _, a_err = a.communicate(timeout=30)
    b.communicate(timeout=30)
    assert (a.returncode, outcome(a_err)) == (LeaseLost.exit_code, "lease_lost"), a_err
    first_b = min(t.t for t in read_ticks(ticks, "b"))
    for label in ("a", "d"):
        last = max(t.t for t in read_ticks(ticks, label))
        assert last < expiry_not_before, label
        assert last < first_b, label
