"""Observing real Redis from lease tests: key dumps, command counts, event files, polling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import redis
from redis.connection import Connection

from tests.helpers.wait import wait_for

HELPERS = Path(__file__).resolve().parent
ROOT = HELPERS.parents[1]


def pttl_ms(client: redis.Redis, key: str | bytes) -> int:
    return int(cast(int, client.pttl(key)))


def stream_entries(client: redis.Redis, key: str) -> list[dict[str, str]]:
    entries = cast(list[tuple[str, dict[str, str]]], client.xrange(key))
    return [fields for _, fields in entries]


KeyDump = dict[bytes, tuple[bytes, bytes]]


def dump_keys(port: int) -> tuple[KeyDump, dict[bytes, int]]:
    """Every key's type and serialized value, and separately its PTTL (which runs down)."""
    raw = redis.Redis(port=port)
    try:
        values: KeyDump = {}
        ttls: dict[bytes, int] = {}
        for key in raw.scan_iter(count=1000):
            values[key] = (cast(bytes, raw.type(key)), cast(bytes, raw.dump(key)))
            ttls[key] = pttl_ms(raw, key)
        return values, ttls
    finally:
        raw.close()


def command_calls(client: redis.Redis) -> dict[str, int]:
    """``INFO commandstats`` as {command: calls}; Redis counts commands run inside scripts too."""
    stats = cast(dict[str, dict[str, Any]], client.info("commandstats"))
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def delta(before: dict[str, int], after: dict[str, int], *names: str) -> dict[str, int]:
    return {n: after.get(n, 0) - before.get(n, 0) for n in names}


class CountingConnection(Connection):
    """A real connection that logs each command it sends and each reply it reads."""

    sent: list[str]
    replies: int

    @classmethod
    def reset(cls) -> None:
        cls.sent.clear()
        cls.replies = 0

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        self.sent.append(str(args[0]).upper())
        super().send_command(*args, **kwargs)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        type(self).replies += 1
        return super().read_response(*args, **kwargs)


def counting_client(port: int) -> tuple[redis.Redis, type[CountingConnection]]:
    """A client on its own CountingConnection subclass, so counts never leak between tests."""
    conn_class = cast(
        type[CountingConnection],
        type("Counting", (CountingConnection,), {"sent": [], "replies": 0}),
    )
    pool = redis.ConnectionPool(port=port, connection_class=conn_class, decode_responses=True)
    client = redis.Redis(connection_pool=pool)
    client.ping()  # connect now, so CLIENT SETINFO and friends are not counted later
    conn_class.reset()
    return client, conn_class


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def wait_event(path: Path, name: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [e for e in read_events(path) if e["event"] == name]
        return bool(found)

    wait_for(seen, timeout_s=timeout_s, what=f"event {name!r} in {path}")
    return found[0]


def helper_command(script: str, *args: str) -> list[str]:
    return [sys.executable, str(HELPERS / script), *args]


def run_helper(script: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        helper_command(script, *args),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        check=False,
    )
