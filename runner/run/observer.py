"""What a run tells its observers as it goes: telemetry and pings (docs/design.md, Monitoring).

The run calls an observer on its own thread. Each observer is optional and imported only when
configured (runner.cli.launch.run_observer): OpenTelemetry for telemetry, runner.run.ping for
pings, and neither for a run that has none.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, Protocol

from runner.outcomes import SKIPPED_DONE, SKIPPED_HELD, SKIPPED_STALE, TOO_LATE


class RunObserver(Protocol):
    """What a run tells an observer (telemetry) as it goes. Called on the run's own thread."""

    def started(self, slot: int | None) -> None: ...

    def phase(self, name: str) -> AbstractContextManager[object]:
        """Around 'connect', 'acquire', 'task', 'complete' and 'release'."""
        ...

    def acquired(self, fence: int) -> None: ...

    def finished(
        self, outcome: str, exit_code: int, *, renewals: int, failed_renewals: int
    ) -> None: ...

    def close(self) -> None:
        """Deliver what was observed, within a bounded time."""
        ...


class NullObserver:
    """The default: telemetry off."""

    def started(self, slot: int | None) -> None:
        pass

    def phase(self, name: str) -> AbstractContextManager[object]:
        return nullcontext()

    def acquired(self, fence: int) -> None:
        pass

    def finished(
        self, outcome: str, exit_code: int, *, renewals: int, failed_renewals: int
    ) -> None:
        pass

    def close(self) -> None:
        pass


class Observers:
    """Tells every observer the same things (telemetry and pings together)."""

    def __init__(self, *observers: RunObserver) -> None:
        self.observers = observers

    def started(self, slot: int | None) -> None:
        for o in self.observers:
            o.started(slot)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with ExitStack() as stack:
            for o in self.observers:
                stack.enter_context(o.phase(name))
            yield

    def acquired(self, fence: int) -> None:
        for o in self.observers:
            o.acquired(fence)

    def finished(
        self, outcome: str, exit_code: int, *, renewals: int, failed_renewals: int
    ) -> None:
        for o in self.observers:
            o.finished(outcome, exit_code, renewals=renewals, failed_renewals=failed_renewals)

    def close(self) -> None:
        for o in self.observers:
            o.close()


# No finish ping from a run that did not run its slot and cannot know whether another did:
# a replica whose slot another runner has (running it, or done) leaves the ping to that
# runner; a slot too late to start or too old to prove unrun (exit 0) is no success, and a
# failure ping would page for a slot that another server may well have run. Silence lets the
# dead-man's switch judge: no success ping from anyone, and the check goes down.
_NOT_RUN_HERE = (SKIPPED_HELD, SKIPPED_DONE, TOO_LATE, SKIPPED_STALE)


class PingHook(NullObserver):
    """CRON_RUNNER_PING_URL: runner.run.ping is imported once the run takes its lease (or ends
    without one, Redis unreachable), never for a replica that skips."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.pinger: Any = None

    def _pinger(self) -> Any:
        if self.pinger is None:
            from runner.run.ping import Pinger  # noqa: PLC0415 - only when a run pings

            self.pinger = Pinger(self.url, self.timeout_s)
        return self.pinger

    def acquired(self, fence: int) -> None:
        self._pinger().start()

    def finished(
        self, outcome: str, exit_code: int, *, renewals: int, failed_renewals: int
    ) -> None:
        if outcome in _NOT_RUN_HERE:
            return
        self._pinger().finish(exit_code)

    def close(self) -> None:
        if self.pinger is not None:
            self.pinger.close()
