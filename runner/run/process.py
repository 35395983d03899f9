"""The runner as a process: reaping orphans (as PID 1, or a subreaper), and the hard exit when
a task cannot be stopped (docs/design.md, Descendants and the supervisor).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import NoReturn


def is_init() -> bool:
    """PID 1, a container's entrypoint: every orphan in the container comes to us."""
    return os.getpid() == 1


def reap_orphans(keep_pid: int | None) -> int:
    """Collect exited orphans that were re-parented to us. Never touches ``keep_pid``, whose
    status belongs to its Popen."""
    reaped = 0
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid == keep_pid:
            return reaped
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)
        reaped += 1


def reap_after_task() -> None:
    """As PID 1, once the task has stopped: collect every orphan left. (Before, a Python task's
    children are its own: reaping them would take the exit codes of its subprocess calls.)"""
    if is_init():
        reap_orphans(None)


def exit_now(code: int) -> NoReturn:
    """Leave the process at once, the logs flushed: a task that ignored its cancellation still
    runs on its thread, and nothing may wait for it, nor release the lease under it."""
    logging.shutdown()
    os._exit(code)
