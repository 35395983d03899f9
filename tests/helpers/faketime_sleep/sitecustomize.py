"""Loaded (via PYTHONPATH) into runners started under libfaketime 0.9.10 (Debian bookworm).

That libfaketime shifts the absolute deadline of ``clock_nanosleep(CLOCK_MONOTONIC,
TIMER_ABSTIME)`` by the fake wall-clock offset even with FAKETIME_DONT_FAKE_MONOTONIC=1, and
Python >= 3.11's ``time.sleep`` sleeps that way: every sleep fails with EINVAL. ``select``
takes a relative timeout, which libfaketime passes through. Only sleeping changes: the wall
clock stays faked, the monotonic clock real.
"""

from __future__ import annotations

import select
import time
from typing import SupportsIndex


def _sleep(seconds: float | SupportsIndex) -> None:
    delay = float(seconds)
    if delay > 0:
        select.select([], [], [], delay)


time.sleep = _sleep
