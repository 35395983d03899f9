"""What recording skips costs in Redis memory (issue 17): 1,000 slots of one task, each started by
10 replicas, driven through the Lease API against a throwaway ``redis-server``.

Two schedules of events, each measured twice: as the runner writes it (protocol 3: a skip
counted on the slot marker, HINCRBY, and a slot that did not run recorded once, HSETNX + XADD)
and as an ACL user without ``+hincrby +hsetnx`` leaves it (nothing written by a skip, as
before protocol 3), so the difference is the cost of the bookkeeping:

- ``done``: every slot runs once; its 9 other replicas find it done (started with it, they
  wait for the run of their slot and see it done at their next look).
- ``held``: every other slot runs and is still running when the next slot starts: that slot's
  10 replicas skip it (policy skip), and the next run's 9 others find their slot done.

Every marker is kept alive to the end (a long retention), the worst case: in a real task a
marker expires after max(1 h, twice the schedule's gap), so at most about 60 are alive for an
every-minute schedule. The run stream is capped (1,000 entries) as a task's is.

Run: ``.venv/bin/python bench/skip_memory.py`` (about 20 s).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import redis

from runner.keys import TaskKeys
from runner.lease.scripts import Acquired, Lease, new_token
from runner.testing import RedisServer

SLOTS = 1000
REPLICAS = 10
FIRST_SLOT = 1_767_261_600
RETENTION_MS = 7 * 86_400_000
HOLDER = "eu-west/cron-runner-report-29412345-x7k2p"


def usage(client: Any, key: str) -> int:
    return int(client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)


def lease(client: Any, keys: TaskKeys, replica: int, slot: int) -> Lease:
    token = new_token(f"{HOLDER}-{replica}", slot)
    return Lease(client, keys, token, ttl_ms=30_000, retention_ms=RETENTION_MS,
                 skip_ttl_ms=RETENTION_MS, indexed=False)  # fmt: skip


def record(slot: int, replica: int) -> dict[str, str | int]:
    return {"slot": slot, "holder": f"{HOLDER}-{replica}", "fence": 0, "exit_code": 0,
            "started_at": f"{slot + 1.25:.3f}", "duration_ms": 1234}  # fmt: skip


def run_slot(client: Any, keys: TaskKeys, slot: int) -> Lease:
    """Replica 0 takes the slot; returns its lease, still held."""
    winner = lease(client, keys, 0, slot)
    assert isinstance(winner.acquire(slot, skip_record=record(slot, 0)), Acquired)
    return winner


def finish(winner: Lease, slot: int) -> None:
    winner.complete(slot, {**record(slot, 0), "fence": winner.fence, "outcome": "ran"},
                    {"last_outcome": "ran", "last_slot": slot, "last_fence": winner.fence},
                    {"fence": winner.fence})  # fmt: skip


def skip_all(client: Any, keys: TaskKeys, slot: int, replicas: range) -> None:
    for replica in replicas:
        got = lease(client, keys, replica, slot).acquire(slot, skip_record=record(slot, replica))
        assert not isinstance(got, Acquired), got


def drive(client: Any, keys: TaskKeys, schedule: str) -> None:
    for i in range(SLOTS):
        slot = FIRST_SLOT + 60 * i
        if schedule == "held" and i % 2 == 1:
            continue  # skipped while the previous slot ran: done below
        winner = run_slot(client, keys, slot)
        if schedule == "held" and i + 1 < SLOTS:
            skip_all(client, keys, slot + 60, range(REPLICAS))
        finish(winner, slot)
        skip_all(client, keys, slot, range(1, REPLICAS))


def measure(server: RedisServer, schedule: str, counted: bool) -> dict[str, Any]:
    admin: Any = server.client()
    scope = f"{schedule}-{'counted' if counted else 'uncounted'}"
    keys = TaskKeys("cron-runner", scope, "report")
    rule = "+evalsha +eval +get +set +pexpire +pttl +incr +time +hmget +hget +del +xadd +hset"
    if counted:
        rule += " +hincrby +hsetnx"
    admin.execute_command("ACL", "SETUSER", scope, "reset", "on", ">pw", "~*", *rule.split())
    client: Any = redis.Redis(port=server.port, username=scope, password="pw",
                              decode_responses=True)  # fmt: skip
    drive(client, keys, schedule)
    markers = list(admin.scan_iter(match=f"{keys.base}:slot:*", count=1000))
    marker_bytes = sum(usage(admin, m) for m in markers)
    others = {
        name: usage(admin, getattr(keys, name)) for name in ("runs", "state", "meta", "fence")
    }
    skips = sum(int(admin.hget(m, "skips") or 0) for m in markers)
    client.close()
    return {
        "markers": len(markers),
        "marker_bytes": marker_bytes,
        "marker_bytes_each": round(marker_bytes / max(1, len(markers)), 1),
        "runs_stream_entries": int(admin.xlen(keys.runs)),
        "skips_counted": skips,
        **{f"{name}_bytes": size for name, size in others.items()},
        "task_total_bytes": marker_bytes + sum(others.values()),
    }


def main() -> int:
    figures: dict[str, Any] = {}
    with RedisServer() as server:
        admin: Any = server.client()
        version = admin.info("server")["redis_version"]
        for schedule in ("done", "held"):
            figures[schedule] = {
                "protocol 3 (skips counted and recorded)": measure(server, schedule, True),
                "without +hincrby +hsetnx (nothing per skip)": measure(server, schedule, False),
            }
    json.dump({"redis_version": version, "slots": SLOTS, "replicas": REPLICAS,
               "figures": figures}, sys.stdout, indent=2)  # fmt: skip
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
