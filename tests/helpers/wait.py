from __future__ import annotations

import math
import time
from collections.abc import Callable


def wait_for(
    predicate: Callable[[], object], timeout_s: float = 10.0, what: str = "condition"
) -> None:
    """Poll for an outcome; the timeout only bounds a broken test, it asserts no speed."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


def clear_of_slot_edge(period_s: int, tolerance_s: float = 30.0, needed_s: float = 20.0) -> None:
    """Sleep, if need be, until no slot edge falls within the next ``needed_s`` seconds.

    With a schedule, a run takes the latest fire time at or before now + tolerance, so the
    slot changes at each fire time minus the tolerance. Runs of one test that must share a
    slot start clear of that edge; a run on each side of it would each see a fresh slot.
    """
    now = time.time()
    edge = (math.floor((now + tolerance_s) / period_s) + 1) * period_s - tolerance_s
    if edge - now < needed_s:
        time.sleep(edge - now + 0.2)
