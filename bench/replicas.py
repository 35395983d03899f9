"""50 `cron-runner exec` replicas of one task started together: wall time until all decided.

    .venv/bin/python bench/replicas.py [--replicas 50] [--rounds 5]

Each round uses a fresh slot (a new task name), so exactly one replica runs and the rest skip.
Reports the median over rounds of: time to the last exit, and the count of each outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from runner.testing import RedisServer

CRON_RUNNER = str(Path(sys.executable).parent / "cron-runner")


def one_round(url: str, name: str, replicas: int) -> tuple[float, Counter[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRON_RUNNER_")}
    env.update(CRON_RUNNER_REDIS_URL=url, CRON_RUNNER_LOG_FORMAT="json")
    cmd = [CRON_RUNNER, "exec", "--name", name, "--schedule", "*/5 * * * *", "--", "true"]
    started = time.perf_counter()
    procs = [
        subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True) for _ in range(replicas)
    ]
    outcomes: Counter[str] = Counter()
    for proc in procs:
        _, stderr = proc.communicate()
        last = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        outcomes[next((e["outcome"] for e in reversed(last) if e.get("outcome")), "none")] += 1
    return time.perf_counter() - started, outcomes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    walls: list[float] = []
    with RedisServer() as server:
        for i in range(args.rounds):
            wall, outcomes = one_round(server.url, f"bench-{i}", args.replicas)
            walls.append(wall)
            print(f"round {i + 1}: {wall:.2f} s  {dict(sorted(outcomes.items()))}")
    print(
        f"{args.replicas} replicas, all decided: median {statistics.median(walls):.2f} s "
        f"over {args.rounds} rounds on {os.cpu_count()} cores (load {os.getloadavg()[0]:.1f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
