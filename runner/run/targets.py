"""What a run executes: a Python callable in a worker thread, or a command in its own process group.

Both offer the same small interface to execution (``Target``): start, poll, cancel (polite),
kill (forced), and the outcome of a success. A command also offers ``supervised``: the run
tells it the lease's expiry, reaps its orphans and learns what it left behind.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

from runner.errors import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, Cancelled
from runner.outcomes import RAN
from runner.run.process import is_init, reap_orphans
from runner.run.supervisor import Supervisor, become_subreaper, stop_adopted
from runner.tasks import RunContext, TaskFn

log = logging.getLogger("runner")


class LeftBehind(NamedTuple):
    """What a command left outside its process group, which came back to the run (a subreaper)."""

    stopped: tuple[int, ...] = ()  # killed at the end of the run
    survivors: tuple[int, ...] = ()  # not confirmed stopped: the lease must expire by its TTL


class Supervised(Protocol):
    """A task in processes of its own (a command): the run supervises and reaps them."""

    def extend(self, expires_at: float) -> None:
        """The lease's local expiry: before the start, then after each confirmed renewal."""
        ...

    def reap(self) -> None:
        """Collect the task's exited orphans, while it runs, when they come to this process."""
        ...

    def left_behind(self) -> LeftBehind:
        """Once it has stopped: its descendants that had left its process group."""
        ...


class Target(Protocol):
    @property
    def outcome(self) -> str:
        """The outcome of a success: ``ran``, or ``enqueued`` for queue mode's send."""
        ...

    @property
    def supervised(self) -> Supervised | None:
        """A command's processes; None for a task on a thread of this process, whose children
        are its own (reaping them would take the exit codes of its subprocess calls)."""
        ...

    def start(self, ctx: RunContext) -> None:
        """Start a run of the task. Called again once it has stopped, for the next slot of the
        same run (catch-up): each start begins afresh."""
        ...

    def poll(self, timeout_s: float) -> bool:
        """Wait up to timeout_s; True once the task has stopped."""
        ...

    def cancel(self) -> None: ...

    def kill(self) -> bool:
        """Force the task to stop. False if it cannot be forced (a Python thread)."""
        ...

    def exit_code(self) -> int:
        """0 for success, the command's own code, or 1 when a Python task raised."""
        ...

    def error(self) -> str | None: ...


class OnThread:
    """The part of a Target that runs on a thread of this process: a Python task, or queue
    mode's send (runner.queue.enqueue)."""

    _thread: threading.Thread | None = None

    def _start_thread(self, work: Callable[..., None], *args: object, name: str) -> None:
        # Daemon: a task that ignores cancellation must not keep the process alive after the
        # runner has decided to exit. The thread runs in a copy of the caller's context, so a
        # span current around start() (telemetry's task span) is the task's parent.
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(work, *args), name=name, daemon=True
        )
        self._thread.start()

    def poll(self, timeout_s: float) -> bool:
        assert self._thread is not None
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


class PythonTarget(OnThread):
    outcome = RAN
    supervised: Supervised | None = None

    def __init__(self, fn: TaskFn) -> None:
        self.fn = fn
        self._exc: BaseException | None = None
        self._ctx: RunContext | None = None

    def start(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._exc = None
        self._start_thread(self._run, name="task")

    def _run(self) -> None:
        assert self._ctx is not None
        try:
            self.fn(self._ctx)
        except BaseException as exc:  # noqa: BLE001 - reported by exit_code()/error()
            self._exc = exc

    def cancel(self) -> None:
        """The context's ``cancelled`` event is what a Python task watches; set by execution."""

    def kill(self) -> bool:
        return False

    def exit_code(self) -> int:
        return 0 if self._exc is None else 1

    def error(self) -> str | None:
        if self._exc is None:
            return None
        if isinstance(self._exc, Cancelled):
            return f"cancelled: {self._exc}"
        return f"{type(self._exc).__name__}: {self._exc}"


class CommandTarget:
    outcome = RAN

    def __init__(self, argv: Sequence[str], *, adopt_descendants: bool = False) -> None:
        """``adopt_descendants``: this process is the runner alone (the CLI), so every other
        child it has came from the command. Never in a process with children of its own: the
        end of the run kills them all."""
        self.argv = list(argv)
        self.adopt_descendants = adopt_descendants
        self.proc: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        # (exit code, reason) when the command could not be started at all.
        self._not_started: tuple[int, str] | None = None
        # Set by the run before start: the lease's local expiry, pushed back by ``extend``.
        # With it, the command runs under the subreaper and the supervisor (runner.run.supervisor).
        self.lease_expires_at: float | None = None
        self._supervisor: Supervisor | None = None
        self._stopped_supervisor: int | None = None  # told to stop, maybe not reaped yet
        self._adopting = False
        self._ended = False
        self.adopted: set[int] = set()  # descendants that came back to us, stopped at the end
        self.outside: set[int] = set()  # of those, the ones that had left the command's group
        self.survivors: list[int] = []  # of those, the ones not confirmed stopped

    def start(self, ctx: RunContext) -> None:
        self._begin_again()
        env = dict(os.environ)
        env.update(
            CRON_RUNNER_TASK=ctx.task,
            CRON_RUNNER_FENCING_TOKEN=str(ctx.fencing_token),
            CRON_RUNNER_SLOT="" if ctx.slot is None else str(ctx.slot),
            CRON_RUNNER_HOLDER=ctx.holder,
        )
        under_lease = self.lease_expires_at is not None
        # As PID 1 neither prctl is needed (see _die_with_parent, become_subreaper).
        prctl = _prctl() if sys.platform.startswith("linux") and os.getpid() != 1 else None
        if under_lease and self.adopt_descendants:
            # Before the start, so that what the command detaches at once comes back too.
            self._adopting = become_subreaper(prctl)
        # Its own process group, so that cancel and kill reach every process it starts,
        # and a terminal's Ctrl-C reaches only the runner, which then decides.
        try:
            try:
                self.proc = self._popen(self.argv, env, prctl)
            except OSError as exc:
                if exc.errno != errno.ENOEXEC:
                    raise
                # A file with no #! line (an empty one too) is a shell script to execvp, and so
                # to env(1), timeout(1), a shell and crontab: run it as they do, with /bin/sh.
                self.proc = self._popen(
                    ["/bin/sh", _found(self.argv[0], env.get("PATH")), *self.argv[1:]], env, prctl
                )
        except OSError as exc:
            # A failed run like any other (released, recorded), with the codes of env(1).
            self._not_started = start_failure(self.argv[0], exc, env.get("PATH"))
            return
        if self.lease_expires_at is not None:
            try:
                self._supervisor = Supervisor(
                    self.proc.pid, self.lease_expires_at, kill_children=self._adopting
                )
            except OSError as exc:  # no process or descriptor left: the runner alone guards
                ctx.logger.warning(
                    f"could not start the command's supervisor, running without it: {exc}",
                    extra={"event": "supervisor_failed"},
                )
        # Readable when the child exits: poll() wakes at once instead of sleeping in steps, as
        # Popen.wait(timeout) does (Linux >= 5.3; elsewhere that stepped wait is the fallback).
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    @staticmethod
    def _popen(
        argv: list[str], env: dict[str, str], prctl: Callable[..., int] | None
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            # The hook makes one syscall and takes no lock, so the keeper thread is no hazard.
            argv,
            env=env,
            process_group=0,
            preexec_fn=_die_with_parent(prctl),  # noqa: PLW1509
        )

    def _begin_again(self) -> None:
        """Forget a previous start's process (catch-up runs one command per slot); the lease's
        expiry, which the run keeps current, stays. Its supervisor, told to stop, is reaped
        first: still our child, it would count as a process this command left behind."""
        if self._stopped_supervisor is not None:
            _reap(self._stopped_supervisor, timeout_s=1.0)
            self._stopped_supervisor = None
        self.proc = None
        self._close_pidfd()
        self._not_started = None
        self._supervisor = None
        self._adopting = False
        self._ended = False
        self.adopted, self.outside, self.survivors = set(), set(), []

    def extend(self, expires_at: float) -> None:
        """A renewal was confirmed: the lease's local expiry is now ``expires_at``."""
        self.lease_expires_at = expires_at
        supervisor = self._supervisor
        if supervisor is not None:
            supervisor.extend(expires_at)

    @property
    def supervised(self) -> CommandTarget:
        return self

    def reap(self) -> None:
        # As PID 1 or a subreaper, exited orphans are ours to reap. While a command runs,
        # every other child is one (or the command's supervisor, which we may reap too).
        if self._adopting or is_init():
            reap_orphans(self.pid)

    def left_behind(self) -> LeftBehind:
        if not self.adopted:
            return LeftBehind()
        return LeftBehind(tuple(sorted(self.outside)), tuple(self.survivors))

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def poll(self, timeout_s: float) -> bool:
        if self._not_started:
            return True
        assert self.proc is not None
        if self._pidfd is not None:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            if not poller.poll(timeout_s * 1000):
                return False
            self.proc.wait()
            self._close_pidfd()
        else:
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return False
        # The leader is gone: whatever it left behind in its group must not outlive the lease.
        self._signal_group(signal.SIGKILL)
        self._stop_the_rest()
        return True

    def cancel(self) -> None:
        self._signal_group(signal.SIGTERM)

    def kill(self) -> bool:
        if self._not_started:
            return True
        self._signal_group(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait()
        self._close_pidfd()
        self._stop_the_rest()
        return True

    def _stop_the_rest(self) -> None:
        """The command is gone: stop what left its group, then the supervisor, which guards
        the lease until everything is confirmed stopped."""
        if self._ended:
            return  # once: a second poll must not forget what the first one found
        self._ended = True
        supervisor = self._supervisor
        if self._adopting:
            assert self.proc is not None
            self.adopted, self.survivors, self.outside = stop_adopted(
                {supervisor.pid} if supervisor else set(), self.proc.pid
            )
        if supervisor is not None:
            supervisor.stop()
            self._supervisor = None
            self._stopped_supervisor = supervisor.pid

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def exit_code(self) -> int:
        if self._not_started:
            return self._not_started[0]
        assert self.proc is not None and self.proc.returncode is not None
        code = self.proc.returncode
        # Killed by a signal: report it as a shell would (128 + signal number).
        return 128 - code if code < 0 else code

    def error(self) -> str | None:
        if self._not_started:
            return self._not_started[1]
        code = self.exit_code()
        return None if code == 0 else f"command exited with code {code}"


def _reap(pid: int, *, timeout_s: float) -> None:
    """Wait for our child ``pid`` to exit, up to ``timeout_s``; never signalled."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] or time.monotonic() >= deadline:
                return
        except ChildProcessError:  # reaped already (as PID 1 or a subreaper, with the orphans)
            return
        time.sleep(0.01)


def start_failure(command: str, exc: OSError, path: str | None) -> tuple[int, str]:
    """The exit code and reason for a command that could not be started: 127 if there is no
    such file, 126 if there is one that cannot run (as a shell, timeout(1) and env(1) say)."""
    import shutil  # noqa: PLC0415 - only on this rare path

    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        found = command if "/" in command else shutil.which(command, mode=os.F_OK, path=path)
        if not found or not Path(found).exists():
            where = "" if "/" in command else " on PATH"
            return EXIT_NOT_FOUND, f"command not found{where}: {command}"
        # The file is there: execve's ENOENT is about the interpreter its #! line names.
        return EXIT_CANNOT_EXECUTE, (
            f"cannot execute {found}: its interpreter {_interpreter(found)!r} was not found"
        )
    return EXIT_CANNOT_EXECUTE, f"cannot execute {command}: {exc.strerror or exc}"


def _found(command: str, path: str | None) -> str:
    """The file execvp runs for ``command``: itself when it names a path, else the first
    executable on PATH."""
    import shutil  # noqa: PLC0415 - only on this rare path

    return command if "/" in command else (shutil.which(command, path=path) or command)


def _interpreter(path: str) -> str:
    try:
        with Path(path).open("rb") as f:
            first = f.readline(256)
    except OSError:
        return "?"
    if not first.startswith(b"#!"):
        return "?"
    return first[2:].strip().split(b" ", 1)[0].decode(errors="replace") or "?"


def _prctl() -> Callable[..., int] | None:
    import ctypes  # noqa: PLC0415 - only where prctl is used

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


def _die_with_parent(prctl: Callable[..., int] | None) -> Callable[[], None] | None:
    """On Linux, the command gets SIGKILL when the runner dies (OOM killer, kill -9), so it
    cannot run on unsupervised while the lease expires and another holder starts.

    Only the command's first process is covered: what it forks does not inherit this. The
    prctl call is prepared here so the child, between fork and exec, only makes one syscall.

    As PID 1 (a container's entrypoint) it is not needed: when PID 1 dies the kernel kills every
    process in its PID namespace. Skipping it there spares the ctypes import and lets Popen
    use vfork, which a pre-exec hook rules out.
    """
    if prctl is None or os.getpid() == 1:
        return None
    pr_set_pdeathsig = 1

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return set_pdeathsig
