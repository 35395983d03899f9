"""A task's rate limit in queue mode, ``N/DURATION``: at most N job starts in any DURATION,
shared by every worker (docs/queue.md; docs/design.md). Read from ``@task(rate_limit=)``
and CRON_RUNNER_RATE_LIMIT; runner.queue.limits enforces it.

The window is whole seconds because Dramatiq's WindowRateLimiter counts in one-second buckets
and reads every bucket of the window at each start: an hour is 3,600 keys a look, the most
accepted.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from runner.config.sources import parse_duration
from runner.errors import ConfigError

MAX_LIMIT = 1_000_000
MAX_WINDOW_S = 3600
RATE_LIMIT_FORM = (
    "N/DURATION: a whole number of starts from 1 to 1000000, then a window of whole seconds "
    "from 1s to 1h, e.g. '10/1m', '100/1h', '5/30s'"
)
_RATE_RE = re.compile(r"^[ \t]*([0-9]{1,7})[ \t]*/[ \t]*(\S.*?)[ \t]*\Z")


class RateLimit(NamedTuple):
    limit: int
    window_s: int

    def __str__(self) -> str:
        return f"{self.limit}/{self.window_s}s"


def parse_rate_limit(value: str, origin: str) -> RateLimit:
    """``N/DURATION``, e.g. '10/1m'; anything else raises ConfigError naming ``origin``."""

    def bad() -> ConfigError:
        return ConfigError(f"{origin}={value[:40]!r} is not valid: expected {RATE_LIMIT_FORM}")

    match = _RATE_RE.match(value)
    if not match:
        raise bad()
    limit = int(match.group(1))
    try:
        window_s = parse_duration(match.group(2), origin)
    except ConfigError:
        raise bad() from None
    if (
        not 1 <= limit <= MAX_LIMIT
        or window_s != int(window_s)
        or not 1 <= window_s <= MAX_WINDOW_S
    ):
        raise bad()
    return RateLimit(limit, int(window_s))
