"""Operations subcommands: check (status, history, unlock and watchdog build on the same state)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from runner import clock
from runner.settings import Settings

AddFlags = Callable[[argparse.ArgumentParser, Sequence[str]], None]


def add_commands(sub: Any, add_flags: AddFlags) -> None:
    p = sub.add_parser(
        "check",
        help="check configuration and Redis connectivity (used by helm test)",
        description="Parse the configuration, reach Redis, and report the round-trip latency.",
    )
    add_flags(p, ("CONNECT_TIMEOUT", "LEASE_TTL"))
    p.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace, settings: Settings) -> int:
    from runner import store  # noqa: PLC0415

    del args
    client = store.connect(settings.redis, settings.lease.ttl_s)
    try:
        deadline = clock.monotonic() + settings.redis.connect_timeout_s
        store.with_deadline(
            client.ping, deadline_s=deadline, what="check", where=settings.redis.display_url
        )
        started = time.perf_counter()
        client.ping()
        latency_ms = (time.perf_counter() - started) * 1000
    finally:
        client.close()
    sys.stdout.write(f"ok: configuration parses; Redis at {settings.redis.display_url} answers "
                     f"in {latency_ms:.2f} ms\n")  # fmt: skip
    return 0
