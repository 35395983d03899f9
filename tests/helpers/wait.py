from __future__ import annotations

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


def schedule_far_from_edges(period_s: int, tolerance_s: float = 30.0) -> str:
    """A schedule firing every ``period_s`` (300 or 3600) whose slot edges sit far from now.

    A run takes the latest fire time at or before now + tolerance, so the slot changes at each
    fire time minus the tolerance. Runs of one test that must share a slot need that edge far
    away: the schedule's minute offset is chosen so the next edge is about half a period off
    (two to three minutes for a five-minute schedule), instead of waiting for the clock.
    """
    if period_s not in (300, 3600):
        raise ValueError(f"period_s must be 300 or 3600, not {period_s}")
    next_fire = time.time() + tolerance_s + period_s / 2
    offset_min = int(next_fire // 60) % (period_s // 60)
    if period_s == 3600:
        return f"{offset_min} * * * *"
    return f"{offset_min}-59/5 * * * *"
