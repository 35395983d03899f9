"""A fleet on one Redis: 10,000 tasks firing every minute from 3 clusters of runners.

Each fire of each task is what three pods (one per cluster) do at its slot: the first to
arrive acquires, runs and completes (the run's 2 round trips); the others arrive while it
holds the lease (a skip, 1 round trip) or after it completed (a skip of a done slot), in a
random order and at random offsets within the minute. The load generator runs the runner's own
lease scripts (``runner.lease.scripts.Lease``) in-process, from several processes, each owning
a share of the tasks: 30,000 process starts a minute would measure the machine, not Redis.

Slots are replayed as fast as the generator can send them, not in real time, so the figures are
Redis's cost per run and the latency of one acquire while Redis is as busy as the generator can
make it. Reported, per minute of the fleet:

* Redis CPU per run (``INFO cpu``, user + system, over every acquire, skip and completion);
* the share of one Redis core that a real minute of this fleet takes (CPU per minute / 60 s);
* p50 and p99 of one acquire round trip under that load, as the generator saw it;
* the generator's own CPU, so that it is clear which side the machine spent its cores on.

Run: ``.venv/bin/python bench/fleet_acquire.py`` (about a minute at the defaults) or with
``--tasks 1000`` for a quick look. Not a test: the figures go to bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import resource
import statistics
import sys
import time
from typing import Any, cast

import redis

from runner.keys import TaskKeys
from runner.lease.scripts import Acquired, Fields, Lease, new_token
from runner.testing import RedisServer

TTL_MS = 30_000
CLUSTERS = ("eu-west", "us-east", "ap-south")
BASE_SLOT = 29_412_000 * 60
# What a chart's task stores as its definition: the same text for every runner of the task.
DEFINITION = "exec ['php', 'artisan', 'report:send'], schedule '* * * * *' in UTC"


def events_for(tasks: list[int], slot: int, rng: random.Random) -> list[tuple[float, int, str]]:
    """Each task's three arrivals within the minute, and its holder's finish 1 to 20 s after
    the first: (time, task, cluster or 'finish'). Sorted by time, as Redis would see them."""
    events: list[tuple[float, int, str]] = []
    for task in tasks:
        arrivals = sorted((rng.uniform(0, 10), cluster) for cluster in CLUSTERS)
        events.extend((at, task, cluster) for at, cluster in arrivals)
        events.append((arrivals[0][0] + rng.uniform(1, 20), task, "finish"))
    events.sort()
    return events


def record(task: int, slot: int, holder: str, fence: int, now: float) -> Fields:
    return {"task": f"t{task}", "slot": slot, "holder": holder, "fence": fence,
            "outcome": "success", "started_at": f"{now:.3f}", "finished_at": f"{now:.3f}",
            "duration_ms": 1000}  # fmt: skip


def generate(args: tuple[str, list[int], int, int, int]) -> dict[str, Any]:
    """One generator process: its share of the tasks, every slot, as fast as it can."""
    url, tasks, first_slot, slots, seed = args
    rng = random.Random(seed)
    client = redis.Redis.from_url(url, decode_responses=True)
    latencies: list[float] = []
    outcomes: dict[str, int] = {}
    started = resource.getrusage(resource.RUSAGE_SELF)
    for n in range(slots):
        slot = first_slot + 60 * n
        holders: dict[int, Lease] = {}
        for _, task, who in events_for(tasks, slot, rng):
            if who == "finish":
                lease = holders.pop(task)
                now = time.time()
                marker = {"holder": lease.holder, "finished_at": f"{now:.3f}"}
                state: Fields = {"last_outcome": "success", "last_slot": slot,
                                 "last_holder": lease.holder}  # fmt: skip
                lease.complete(
                    slot, record(task, slot, lease.holder, lease.fence, now), state, marker
                )
                continue
            keys = TaskKeys("cron-runner", "fleet", f"t{task}")
            lease = Lease(client, keys, new_token(f"{who}/pod-{task}", slot), ttl_ms=TTL_MS,
                          definition=DEFINITION)  # fmt: skip
            sent = time.perf_counter()
            result = lease.acquire(slot)
            latencies.append(time.perf_counter() - sent)
            kind = type(result).__name__
            outcomes[kind] = outcomes.get(kind, 0) + 1
            if isinstance(result, Acquired):
                holders[task] = lease
    used = resource.getrusage(resource.RUSAGE_SELF)
    client.close()  # type: ignore[no-untyped-call]
    cpu = used.ru_utime - started.ru_utime + used.ru_stime - started.ru_stime
    return {"latencies": latencies, "outcomes": outcomes, "cpu_s": cpu}


def redis_cpu(client: redis.Redis) -> float:
    info = cast(dict[str, Any], client.info("cpu"))
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=3, help="minutes of the fleet to replay")
    parser.add_argument("--processes", type=int, default=2, help="generator processes")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with RedisServer() as server:
        client = server.client()
        shares = [list(range(p, args.tasks, args.processes)) for p in range(args.processes)]
        # The first minute of a task writes its meta hash and index entry: warm them, as a
        # fleet that has run before has them, then measure the minutes after.
        with multiprocessing.Pool(args.processes) as pool:
            pool.map(generate, [(server.url, share, BASE_SLOT, 1, p)
                                for p, share in enumerate(shares)])  # fmt: skip
            cpu_before, wall_before = redis_cpu(client), time.perf_counter()
            parts = pool.map(generate, [(server.url, share, BASE_SLOT + 60, args.slots, 100 + p)
                                        for p, share in enumerate(shares)])  # fmt: skip
            wall = time.perf_counter() - wall_before
            cpu = redis_cpu(client) - cpu_before
        memory = int(cast(dict[str, Any], client.info("memory"))["used_memory"])
        client.close()  # type: ignore[no-untyped-call]
    latencies = sorted(x for part in parts for x in part["latencies"])
    outcomes: dict[str, int] = {}
    for part in parts:
        for kind, count in part["outcomes"].items():
            outcomes[kind] = outcomes.get(kind, 0) + count
    runs = args.tasks * args.slots
    per_minute_cpu = cpu / args.slots
    figures = {
        "tasks": args.tasks,
        "clusters": len(CLUSTERS),
        "minutes": args.slots,
        "acquire_calls": len(latencies),
        "outcomes": outcomes,
        "runs": runs,
        "redis_cpu_s": round(cpu, 2),
        "redis_cpu_per_run_us": round(cpu / runs * 1e6, 1),
        "redis_core_share_of_a_real_minute": round(per_minute_cpu / 60, 3),
        "acquire_p50_ms": round(statistics.median(latencies) * 1000, 3),
        "acquire_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 3),
        "generator_cpu_s": round(sum(part["cpu_s"] for part in parts), 2),
        "wall_s": round(wall, 2),
        "redis_used_memory_mib": round(memory / 2**20, 1),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for name, value in figures.items():
            print(f"{name:38} {value}")
    if outcomes.get("Acquired") != runs:
        print(f"expected {runs} acquisitions, one per task and minute: {outcomes}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
