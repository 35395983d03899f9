"""The one stop flag, for runs and queue workers alike (docs/design.md, Every stop signal is
SIGTERM).

A stop signal only sets the flag; all the stopping happens in ordinary code that reads it
(``requested``) or waits on it (``wait``).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

# Each asks to stop as SIGTERM does. Left at their defaults, SIGHUP (a closed terminal or ssh
# session), SIGQUIT and SIGUSR1/2 would kill the process on the spot: a run's command would be
# left running and its lease held, a worker's jobs left in flight until their heartbeat expires.
STOP_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


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
        return signal.Signals(self.signum).name if self.signum else "a signal"
