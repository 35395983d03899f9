"""The one stop flag, for runs and queue workers alike (docs/design.md, Every stop signal is
SIGTERM).

A stop signal only sets the flag; all the stopping happens in ordinary code that reads it
(``requested``) or waits on it (``wait``).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


def _present(*names: str) -> set[int]:
    return {getattr(signal, n) for n in names if hasattr(signal, n)}


# Default action ignore, stop or continue: none of them ends the process.
_NOT_FATAL = _present(
    "SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGINFO"
)
_UNCATCHABLE = _present("SIGKILL", "SIGSTOP")
# Ignored by Python from the start, and left so: a write to a pipe whose reader is gone, or
# past RLIMIT_FSIZE, fails where it is made (EPIPE, EFBIG), which is handled there
# (runner/streams.py); a command gets them back at their defaults.
_IGNORED = _present("SIGPIPE", "SIGXFSZ")
# The processor's own report of a fault in this process: a handler returns to the same
# instruction, which faults again for ever. Their default (a core dump) is the only way out.
_FAULTS = _present("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")

# Each asks to stop as SIGTERM does: every catchable signal whose default action ends the
# process (terminate or core), the real-time ones included, found from what this system has
# rather than listed. Left at their defaults, SIGHUP (a closed terminal or ssh session),
# SIGQUIT, SIGUSR1/2, SIGALRM, SIGXCPU (RLIMIT_CPU, `ulimit -t`), SIGPWR and the others would
# kill the process on the spot: a run's command left running and its lease held, a worker's
# jobs left in flight until their heartbeat expires.
STOP_SIGNALS: tuple[int, ...] = tuple(
    sorted(signal.valid_signals() - _NOT_FATAL - _UNCATCHABLE - _IGNORED - _FAULTS)
)


def signal_name(signum: int) -> str:
    """SIGTERM, SIGRTMIN+3: as kill -l and the kernel's documentation name them."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        pass
    if signal.SIGRTMIN < signum < signal.SIGRTMAX:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
    return f"signal {signum}"


class Shutdown:
    """Set by a stop signal (STOP_SIGNALS), or by ``request``; nothing else happens in the
    handler."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.event = threading.Event()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask to stop as the signal ``signum`` does; the first signal is the one named."""
        self.signum = self.signum or signum
        self.event.set()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.request(signum)

    def install(self) -> Shutdown:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        return self

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until a stop is requested (True), or ``timeout_s`` passes (False)."""
        return self.event.wait(timeout_s)

    @property
    def name(self) -> str:
        return signal_name(self.signum) if self.signum else "a signal"
