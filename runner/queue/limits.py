"""The per-task rate limit of queue mode, shared by every worker: Dramatiq's own
WindowRateLimiter on its Redis backend, on the workers' Redis (docs/queue.md;
docs/design.md).

A job over the limit is not failed (that would spend its retries and end in the dead-letter
queue): it goes back to its queue with a delay, its retries untouched (runner.queue.worker).

The limiter counts starts in one-second buckets by the workers' clocks and sums the buckets
of its window. A window of W buckets lets N starts through at the end of one second and N
more at the start of the W-th second after it, less than W seconds apart; so the limiter is
given W + 1 buckets, and no W seconds ever hold more than N starts. The price is a sustained
rate of N per W + 1 seconds: 59/60 of the rate for a minute, half of it for one second.
The buckets are keys under the task's hash tag, ``{prefix}:{scope:task}:rate@<second>``.
"""

from __future__ import annotations

import random
import threading
from typing import Any

from dramatiq.rate_limits import WindowRateLimiter
from dramatiq.rate_limits.backends import RedisBackend

from runner.config.rates import RateLimit
from runner.keys import TaskKeys

#: The message option that counts how often a message went back for its rate limit.
LIMITED = "rate_limited"


class RateLimits:
    """One limiter per task and limit, on ``client``. Thread-safe: worker threads share it."""

    def __init__(self, client: Any, prefix: str, scope: str) -> None:
        self.backend = RedisBackend(client=client)
        self.prefix = prefix
        self.scope = scope
        self._limiters: dict[tuple[str, RateLimit], WindowRateLimiter] = {}
        self._lock = threading.Lock()

    def _limiter(self, task: str, rate: RateLimit) -> WindowRateLimiter:
        with self._lock:
            limiter = self._limiters.get((task, rate))
            if limiter is None:
                key = f"{TaskKeys(self.prefix, self.scope, task).base}:rate"
                limiter = WindowRateLimiter(
                    self.backend, key, limit=rate.limit, window=rate.window_s + 1
                )
                self._limiters[(task, rate)] = limiter
            return limiter

    def admit(self, task: str, rate: RateLimit) -> bool:
        """Count one start of ``task`` if its window has room; False if it has none."""
        with self._limiter(task, rate).acquire(raise_on_failure=False) as acquired:
            return bool(acquired)


def delay_ms(rate: RateLimit, times_limited: int) -> int:
    """How long a job over its limit waits on the queue: from half a second, doubling each time
    it comes back over the limit, up to the window; jittered so that the jobs held back
    together do not all come back in the same second."""
    base_s = min(float(rate.window_s + 1), 0.5 * 2.0 ** min(times_limited, 16))
    return int(base_s * 1000 * random.uniform(1.0, 2.0))
