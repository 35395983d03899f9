"""What keeps a command inside its lease when the runner itself cannot (docs/design.md,
Descendants and the supervisor).

- The runner is a child subreaper (Linux): a descendant that leaves the command's process
  group (``setsid daemon &``) comes back to it as a child when its parent exits, so that
  ``stop_adopted`` can find and stop it before the lease is released.
- A supervisor, forked beside the command, kills the command's process group and the
  runner's other children at the lease's local expiry unless the runner keeps pushing that
  deadline back (``extend``, on each confirmed renewal). A runner frozen by SIGSTOP, or stuck,
  cannot push it: its command dies before the lease can expire in Redis, however long the
  freeze. If the runner dies, the supervisor sees the pipe close and does the same at once.

The supervisor is a fork of the runner that runs only ``_watch``: system calls through ``os``
and ``select``, no import, no lock, no logging, so the threads of the parent are no hazard.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

# Shown by ps and top (15 characters at most), and how the tests tell it from the command.
NAME = b"cron-runner-sup"
# How long the end of a run waits for adopted descendants killed with SIGKILL to be reaped.
STOP_CONFIRM_S = 2.0


def become_subreaper(prctl: Callable[..., int] | None) -> bool:
    """PR_SET_CHILD_SUBREAPER. Not needed as PID 1, which adopts every orphan already."""
    if os.getpid() == 1:
        return True
    if prctl is None:
        return False
    pr_set_child_subreaper = 36
    return prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0


def children(pid: int) -> list[int]:
    """The direct children of ``pid``, zombies included (Linux /proc; none elsewhere)."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_bytes().split()]
        except OSError:
            continue
    return found


def _kill(pid: int) -> None:
    """SIGKILL ``pid``, and its process group if it leads one (a ``setsid`` daemon's)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def stop_adopted(
    exclude: set[int], group: int, timeout_s: float = STOP_CONFIRM_S
) -> tuple[set[int], list[int], set[int]]:
    """Kill and reap every child of ours but ``exclude``: descendants of the command that came
    back to us. Repeats until none is left, since each one killed hands its own children to us.
    Returns the pids stopped, those not confirmed gone (reaped) within ``timeout_s``, and those
    of the stopped that had left the command's process ``group``: members of the group, killed
    with it, come back too when their parent dies first, and are no news."""
    deadline = time.monotonic() + timeout_s
    me = os.getpid()
    seen: set[int] = set()
    outside: set[int] = set()
    while True:
        left = [pid for pid in children(me) if pid not in exclude]
        for pid in set(left) - seen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                # Before the reap below: a zombie still has its group.
                if os.getpgid(pid) != group:
                    outside.add(pid)
        seen.update(left)
        for pid in left:
            _kill(pid)
        for pid in left:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        left = [pid for pid in children(me) if pid not in exclude]
        if not left or time.monotonic() >= deadline:
            return seen, left, outside
        time.sleep(0.01)


class Supervisor:
    """The runner's side: fork the supervisor, push its deadline back, stop it."""

    def __init__(self, pgid: int, deadline: float, *, kill_children: bool) -> None:
        """``kill_children``: at the deadline, kill the runner's other children too (the
        descendants back from outside the group), for a runner that is a subreaper."""
        self._lock = threading.Lock()
        read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # a stuck supervisor must not block the keeper
        runner = os.getpid()
        with warnings.catch_warnings():
            # Python 3.12 warns of fork() beside threads (the keeper): the child runs nothing
            # that takes a lock, and under -W error the warning would raise after the fork.
            warnings.simplefilter("ignore", DeprecationWarning)
            self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child never returns
            try:
                os.close(self._write_fd)
                _detach(read_fd)
                _watch(read_fd, pgid, runner if kill_children else None, deadline)
            finally:
                os._exit(0)
        os.close(read_fd)

    def extend(self, deadline: float) -> None:
        self._send(f"{deadline:.6f}\n".encode())

    def stop(self) -> None:
        """The command is gone: let the supervisor exit without killing anything."""
        self._send(b"stop\n")
        with self._lock:  # the keeper may be sending: never write to a closed (reused) fd
            if self._write_fd < 0:
                return
            os.close(self._write_fd)
            self._write_fd = -1
        # Not waited for: it exits on reading "stop" and kills nothing after it; the runner
        # reaps it (as PID 1 or a subreaper, with the orphans) or exits first and init does.
        # Never signalled by pid: reaped meanwhile, its pid could be a stranger's.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)

    def _send(self, message: bytes) -> None:
        # Full pipe (the supervisor is not reading) or a dead supervisor: nothing to tell it.
        with self._lock, contextlib.suppress(OSError):
            if self._write_fd >= 0:
                os.write(self._write_fd, message)


def _detach(keep_fd: int) -> None:
    """Its own process group, so that a freeze or kill of the runner's group spares it; none
    of the runner's descriptors but the pipe (a Redis socket, the terminal)."""
    os.setpgid(0, 0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, 1 << 16)
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_bytes(NAME)


def _watch(read_fd: int, pgid: int, runner: int | None, deadline: float) -> None:
    pending = b""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        data = os.read(read_fd, 4096)
        if not data:
            break  # the runner died: its command (and what it started) must not run on
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line == b"stop":
                return
            deadline = float(line)
    # The runner did not confirm the lease in time (frozen, stuck) or is dead.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    # Its other children are descendants of the command that left the group. A frozen runner
    # cannot reap them, so their pids cannot be reused under us; what each one killed leaves
    # behind comes to the runner too, hence the rounds.
    if runner is None:
        return
    me = os.getpid()
    for _ in range(50):
        alive = [pid for pid in children(runner) if pid != me and not _zombie(pid)]
        if not alive:
            return
        for pid in alive:
            _kill(pid)
        time.sleep(0.01)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True
