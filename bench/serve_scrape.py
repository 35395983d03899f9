"""What one `cron-runner serve` scrape and page cost with many tasks, each with history.

Against one throwaway Redis: ``--tasks`` tasks (1,000), each with ``--runs`` recorded runs
(20) written by the runs' own finish script (``Lease.complete`` / ``release``, as a run's end
writes them), every fifth task last failed, every tenth with a missed slot in its ledger, one
in ten holding a lease. Then a real ``cron-runner serve`` process, and over HTTP:

- the first scrape of ``/metrics`` (reads each task's newest runs) and then ``--scrapes``
  more (each reads only what was added since), wall time per scrape, median and max;
- Redis commands per scrape: ``INFO commandstats`` deltas around one scrape (less the INFO);
- ``/`` (every task, its strip) and one ``/tasks/TASK`` page, wall time, median.

Run: ``.venv/bin/python bench/serve_scrape.py [--tasks 1000] [--runs 20] [--scrapes 10]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.keys import TaskKeys  # noqa: E402
from runner.lease.scripts import Lease, new_token  # noqa: E402
from runner.testing import RedisServer  # noqa: E402
from tests.helpers.proc import CRON_RUNNER, runner_env  # noqa: E402
from tests.helpers.wait import wait_for  # noqa: E402


def populate(client: Any, tasks: int, runs: int) -> None:
    now = time.time()
    for i in range(tasks):
        name = f"task-{i:04d}"
        keys = TaskKeys("cron-runner", "default", name)
        for n in range(runs):
            slot = int(now // 300 * 300) - (runs - n) * 300
            lease = Lease(client, keys, new_token(f"pod-{i}-{n}"), ttl_ms=30_000)
            client.set(keys.lease, lease.token, px=30_000)
            failed = i % 5 == 0 and n == runs - 1
            record: dict[str, str | int | float] = {"slot": slot, "holder": lease.holder, "fence": n + 1,
                      "outcome": "failed" if failed else "ran", "exit_code": 1 if failed else 0,
                      "started_at": f"{slot + 1:.3f}", "duration_ms": 1000 + n}  # fmt: skip
            kind = "failure" if failed else "success"
            state: dict[str, str | int | float] = {"last_run_at": f"{slot + 2:.3f}", "last_outcome": record["outcome"],
                     "last_holder": lease.holder, "last_slot": slot, "schedule": "*/5 * * * *",
                     "timezone": "Europe/Berlin" if i % 2 else "UTC", f"last_{kind}_at":
                     f"{slot + 2:.3f}", f"last_{kind}_duration_ms": 1000 + n,
                     f"last_{kind}_slot": slot}  # fmt: skip
            if failed:
                lease.release(record, {**state, "last_failure_outcome": "failed",
                                       "last_failure_exit_code": 1})  # fmt: skip
            else:
                lease.complete(slot, record, state)
        if i % 10 == 0:
            client.zadd(keys.missed, {str(int(now) - 7200): int(now) - 7200})
        if i % 10 == 5:
            client.set(keys.lease, new_token(f"pod-{i}-now"), px=600_000)


def commands(client: Any) -> int:
    stats = cast(dict[str, Any], client.info("commandstats"))
    return sum(int(v["calls"]) for v in stats.values())


def get(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        size = len(resp.read())
    return time.perf_counter() - started, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args()
    with RedisServer() as server:
        client = server.client()
        started = time.perf_counter()
        populate(client, args.tasks, args.runs)
        print(f"populated {args.tasks} tasks x {args.runs} runs in "
              f"{time.perf_counter() - started:.1f}s")  # fmt: skip
        log = Path("/tmp/serve-bench.log")
        with log.open("w") as out:
            proc = subprocess.Popen(
                [CRON_RUNNER, "serve", "--host", "127.0.0.1", "--port", "0"],
                env=runner_env(server.url), stderr=out, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            wait_for(lambda: "serving" in log.read_text(), 20)
            line = next(ln for ln in log.read_text().splitlines() if '"serving"' in ln)
            base = f"http://127.0.0.1:{json.loads(line)['port']}"
            before = commands(client)
            first, size = get(base + "/metrics")
            first_cmds = commands(client) - before - 1
            times, per = [], []
            for _ in range(args.scrapes):
                time.sleep(1.1)  # past the shared snapshot's minimum age
                before = commands(client)
                elapsed, size = get(base + "/metrics")
                per.append(commands(client) - before - 1)
                times.append(elapsed)
            page, task = [], []
            for _ in range(5):
                time.sleep(1.1)
                page.append(get(base + "/")[0])
                task.append(get(base + "/tasks/task-0005")[0])
            page_size = get(base + "/")[1]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        ms = 1000
        print(json.dumps({
            "tasks": args.tasks, "runs_each": args.runs,
            "first_scrape_ms": round(first * ms), "first_scrape_commands": first_cmds,
            "scrape_ms_median": round(statistics.median(times) * ms),
            "scrape_ms_max": round(max(times) * ms),
            "commands_per_scrape_median": statistics.median(per),
            "metrics_bytes": size,
            "page_ms_median": round(statistics.median(page) * ms), "page_bytes": page_size,
            "task_page_ms_median": round(statistics.median(task) * ms),
        }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
