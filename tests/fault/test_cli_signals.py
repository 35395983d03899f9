"""Shutdown and lease loss through the CLI, with real processes and real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from runner.errors import Terminated
from runner.run.supervisor import children
from runner.testing import RedisServer
from tests.helpers.proc import (
    CRON_RUNNER,
    LEASE,
    LoggedRun,
    events,
    outcome,
    runner_env,
    side_effects,
    spawn,
    spawn_started,
)
from tests.helpers.wait import wait_for


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # Zombies still count for killpg; make sure a live (non-zombie) member exists.
    out = subprocess.run(
        ["ps", "-o", "stat=", "-g", str(pgid)], capture_output=True, text=True
    ).stdout
    return any(s and not s.startswith("Z") for s in out.split())


# A command that ignores SIGTERM, and whose children do too.
STUBBORN = "trap '' TERM; echo $$ > {pidfile}; sleep 60 & sleep 60 & wait"


def _shell(
    name: str, script: str, env: dict[str, str], tmp_path: Path, **kwargs: Any
) -> tuple[subprocess.Popen[str], int]:
    """``exec`` of ``sh -c script`` once the shell has written its pid where the script says
    ``{pidfile}``: the run, and the pid (the command's group id: it has a group of its own)."""
    pidfile = tmp_path / "child.pid"
    command = ["sh", "-c", script.format(pidfile=pidfile)]
    proc = spawn(["exec", "--name", name, "--", *command], env, **kwargs)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child start")
    return proc, int(pidfile.read_text())


def _stopped(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> str:
    """Send ``sig`` and wait for the run to end: its stderr."""
    proc.send_signal(sig)
    return proc.communicate(timeout=30)[1]


def test_sigterm_command_ignoring_it_is_killed_after_grace(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_SHUTDOWN_GRACE="1s")
    proc, child_pgid = _shell("stubborn", STUBBORN, env, tmp_path)
    sent = time.monotonic()
    stderr = _stopped(proc)
    assert proc.returncode == 143, stderr
    assert time.monotonic() - sent >= 1.0
    names = [e.get("event") for e in events(stderr)]
    # Killed first, released after: the lease never outlives the lock on the task.
    assert names.index("killed") < names.index("released") < names.index("terminated")
    assert r.get(LEASE % "stubborn") is None
    assert not _group_alive(child_pgid)


def test_members_of_the_group_killed_with_it_are_not_reported_as_left_outside(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # The shell dies first; its children, still in its group, come back to the subreaper as
    # they die. They never left the group: no warning that they did.
    env = runner_env(redis_server.url, CRON_RUNNER_SHUTDOWN_GRACE="1s")
    proc, child_pgid = _shell("grouped", STUBBORN, env, tmp_path)
    stderr = _stopped(proc)
    assert proc.returncode == Terminated.exit_code, stderr
    assert "descendants_stopped" not in [e.get("event") for e in events(stderr)], stderr
    assert not _group_alive(child_pgid)


def test_second_sigterm_does_not_skip_release(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    pidfile, log = tmp_path / "child.pid", tmp_path / "runner.log"
    env = runner_env(redis_server.url, CRON_RUNNER_SHUTDOWN_GRACE="1500ms")
    proc = LoggedRun(
        [
            "exec",
            "--name",
            "twice",
            "--",
            "sh",
            "-c",
            f"trap '' TERM; echo $$ > {pidfile}; sleep 60",
        ],
        env,
        log,
    )
    wait_for(pidfile.exists, what="child start")
    proc.send_signal(signal.SIGTERM)
    # The second arrives while the runner is already stopping its task on the first.
    wait_for(lambda: proc.logged("stopping"), what="the runner to act on the first SIGTERM")
    proc.send_signal(signal.SIGTERM)
    stderr = proc.finish()
    assert proc.returncode == 143, stderr
    assert "released" in [e.get("event") for e in events(stderr)]
    assert r.get(LEASE % "twice") is None


def test_python_task_ignoring_cancel_exits_143_without_release(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    env = runner_env(
        redis_server.url,
        SIDE_EFFECTS=str(effects),
        CRON_RUNNER_SHUTDOWN_GRACE="1s",
        TASK_SECONDS="60",
    )
    proc = spawn_started(["run", "stubborn"], env, effects)
    stderr = _stopped(proc)
    assert proc.returncode == 143, stderr
    assert "abandoned" in [e.get("event") for e in events(stderr)]
    # Left to expire by its TTL: the task may still be running for all Redis knows.
    assert r.get(LEASE % "stubborn") is not None
    assert cast(int, r.pttl(LEASE % "stubborn")) > 0


def test_sigstop_past_ttl_loses_lease_kills_child_exits_4(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    ticks = tmp_path / "ticks.log"
    script = f"echo $$ > {{pidfile}}; while true; do echo tick >> {ticks}; sleep 0.05; done"
    env = runner_env(
        redis_server.url, CRON_RUNNER_LEASE_TTL="1500ms", CRON_RUNNER_SCHEDULE="0 0 * * *"
    )
    proc, child_pgid = _shell("frozen", script, env, tmp_path, start_new_session=True)

    os.killpg(proc.pid, signal.SIGSTOP)
    os.killpg(child_pgid, signal.SIGSTOP)
    wait_for(lambda: r.get(LEASE % "frozen") is None, timeout_s=5, what="lease expiry in Redis")
    assert r.set(LEASE % "frozen", "other-replica:beef", px=30_000, nx=True)
    other_state = {
        k: r.dump(k)
        for k in cast(list[str], r.keys("cron-runner:{default:frozen}:*"))
        if not k.endswith(":lease")
    }

    resumed = time.monotonic()
    os.killpg(child_pgid, signal.SIGCONT)
    os.killpg(proc.pid, signal.SIGCONT)
    _, stderr = proc.communicate(timeout=30)
    elapsed = time.monotonic() - resumed
    assert proc.returncode == 75, stderr
    assert outcome(stderr) == "lease_lost"
    assert not _group_alive(child_pgid)
    # Within one renew interval (ttl/3 = 0.5 s), plus process scheduling slack.
    assert elapsed < 0.5 + 1.0
    # Its late finish changed nothing that is the new holder's.
    assert r.get(LEASE % "frozen") == "other-replica:beef"
    assert not r.keys("cron-runner:{default:frozen}:slot:*")
    after = {k: r.dump(k) for k in other_state}
    assert after == other_state


def test_runner_reaps_orphans_as_pid_1(redis_server: RedisServer, tmp_path: Path) -> None:
    # A command that leaves grandchildren behind, which re-parent to PID 1 (the runner).
    script = "for i in 1 2 3 4 5; do (sleep 0.1 &) ; done; sleep 0.5; ps -eo stat= | grep -c '^Z' || true"
    env = runner_env(redis_server.url)
    res = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            CRON_RUNNER,
            "exec",
            "--name",
            "pid1",
            "--",
            "sh",
            "-c",
            script,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0", f"zombies left under PID 1: {res.stdout}"


def test_a_python_task_keeps_its_subprocess_codes_under_a_pid_1_runner(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # The image runs the runner as PID 1. Reaping every exited child there would take a Python
    # task's own subprocesses from it: Popen then reports 0 for a child that exited 7.
    effects = tmp_path / "effects"
    env = runner_env(redis_server.url, SIDE_EFFECTS=str(effects))
    res = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", CRON_RUNNER, "run", "child-codes"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    (line,) = effects.read_text().splitlines()
    assert line.split()[0] == "codes:7,5,3"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


# signal(7): the signals whose default action does not end the process (ignore, stop,
# continue), those that cannot be caught, those Python ignores from the start and the runner
# keeps so (PIPE, XFSZ), and the processor's faults, which a handler cannot recover from.
NOT_STOPPING = {
    "SIGKILL", "SIGSTOP", "SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH", "SIGTSTP", "SIGTTIN",
    "SIGTTOU", "SIGPIPE", "SIGXFSZ", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL",
}  # fmt: skip
# Every other signal this system has would end the runner at once: each must stop the run as
# SIGTERM does. The real-time signals included.
STOPPING = {
    name: int(sig)
    for sig in sorted(signal.valid_signals())
    if (name := _signal_name(sig)) not in NOT_STOPPING
}
# Kept as they were: ignored while a run goes on.
KEPT = ("SIGPIPE", "SIGXFSZ", "SIGWINCH", "SIGCHLD", "SIGURG", "SIGCONT")


def _stopped_like_sigterm(stderr: str, code: int, r: redis.Redis, name: str, sig: str) -> None:
    assert code == Terminated.exit_code, stderr
    assert outcome(stderr) == "terminated"
    assert "Traceback" not in stderr
    assert "released" in [e.get("event") for e in events(stderr)]
    assert f"stopped by {sig}" in stderr
    assert r.get(LEASE % name) is None
    (entry,) = r.xrange(f"cron-runner:{{default:{name}}}:runs")  # type: ignore[misc]
    assert entry[1]["outcome"] == "terminated"
    assert entry[1]["error"].startswith(f"stopped by {sig}"), entry


@pytest.mark.parametrize("sig", list(STOPPING))
def test_every_signal_that_would_end_the_runner_stops_the_run_like_sigterm(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path, sig: str
) -> None:
    # Left at their defaults these killed the runner alone (exit 128 + N): the command ran on,
    # orphaned, nothing was recorded, and the lease stayed held until its TTL.
    env = runner_env(redis_server.url, CRON_RUNNER_SHUTDOWN_GRACE="2s")
    proc, child_pgid = _shell("sig", "echo $$ > {pidfile}; sleep 60 & wait", env, tmp_path)
    stderr = _stopped(proc, STOPPING[sig])
    _stopped_like_sigterm(stderr, proc.returncode, r, "sig", sig)
    assert not _group_alive(child_pgid)


@pytest.mark.parametrize("sig", KEPT)
def test_signals_that_do_not_end_a_process_leave_the_run_going(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path, sig: str
) -> None:
    env = runner_env(redis_server.url)
    proc, _ = _shell("kept", "echo $$ > {pidfile}; sleep 1", env, tmp_path)
    proc.send_signal(getattr(signal, sig))
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert outcome(stderr) == "ran"
    assert r.get(LEASE % "kept") is None


def test_sigxcpu_from_a_real_cpu_limit_stops_the_run_like_sigterm(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    # `ulimit -t` as a soft limit: the kernel sends SIGXCPU once the runner's own CPU time (a
    # Python task burning CPU in it) reaches a second.
    effects = tmp_path / "effects"
    env = runner_env(
        redis_server.url, CRON_RUNNER_TASK_MODULES="tests.stream_tasks", SIDE_EFFECTS=str(effects)
    )
    res = subprocess.run(
        ["sh", "-c", 'ulimit -S -t 1 && exec "$@"', "sh", CRON_RUNNER, "run", "spin"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert side_effects(effects, "start")
    _stopped_like_sigterm(res.stderr, res.returncode, r, "spin", "SIGXCPU")


@pytest.mark.parametrize("sig", ["SIGALRM", "SIGPWR", "SIGRTMAX"])
def test_a_pid_1_runner_stops_the_run_on_them_too(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path, sig: str
) -> None:
    # As PID 1 (a container's entrypoint) the kernel dropped them while no handler was set:
    # the same signal that stops a run elsewhere must not be lost there.
    pidfile = tmp_path / "child.pid"
    env = runner_env(redis_server.url, CRON_RUNNER_SHUTDOWN_GRACE="2s")
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", CRON_RUNNER, "exec", "--name", "pid1",
         "--", "sh", "-c", f"echo $$ > {pidfile}; sleep 10"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child start")
    (runner,) = children(proc.pid)  # unshare's one child: PID 1 of the new namespace
    os.kill(runner, STOPPING[sig])
    _, stderr = proc.communicate(timeout=30)
    _stopped_like_sigterm(stderr, proc.returncode, r, "pid1", sig)
