"""The time seam. Local deadlines use monotonic time; stored and shown times use UTC wall time.

Callers use ``clock.monotonic()`` / ``clock.wall()`` through the module so tests can swap them.
"""

from __future__ import annotations

import time


def monotonic() -> float:
    return time.monotonic()


def wall() -> float:
    """Seconds since the Unix epoch (UTC)."""
    return time.time()
