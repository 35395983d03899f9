"""How much Redis memory one task's state takes, measured (docs/operating.md, Sizing).

Runs a task N times through the real run flow (``Execution`` with ``true`` as the command,
each run in a slot of its own, as CronJob pods would) against a throwaway ``redis-server``,
and reads ``MEMORY USAGE`` of each of the task's keys after 10, 100, 1,000 and 3,000 runs.
The holder and schedule look like a chart's: ``eu-west/cron-runner-report-29412345-x7k2p``.

Run: ``.venv/bin/python bench/state_size.py`` (about half a minute).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from runner.config.settings import load_settings
from runner.keys import TaskKeys
from runner.lease import store
from runner.run.execution import Execution
from runner.run.targets import CommandTarget
from runner.signals import Shutdown
from runner.testing import RedisServer

TASK = "report"
CHECKPOINTS = (10, 100, 1000, 3000)
BASE_MINUTE = 29_412_000  # Job names carry minutes since the epoch


def usage(client: Any, key: str) -> int:
    value = client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0")
    return int(value or 0)


def measure(redis_url: str) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    client: Any = None
    done = 0
    for checkpoint in CHECKPOINTS:
        while done < checkpoint:
            minute = BASE_MINUTE + done
            env = {
                "CRON_RUNNER_REDIS_URL": redis_url,
                "CRON_RUNNER_JOB_NAME": f"cron-runner-{TASK}-{minute}",
                "CRON_RUNNER_CRONJOB_NAME": f"cron-runner-{TASK}",
                "CRON_RUNNER_SCHEDULE": "* * * * *",
                "CRON_RUNNER_HOLDER": f"cron-runner-{TASK}-{minute}-x7k2p",
                "CRON_RUNNER_CLUSTER_NAME": "eu-west",
                "CRON_RUNNER_SCOPE": "cron-system",
                "CRON_RUNNER_LOG_LEVEL": "error",
            }
            settings = load_settings(env)
            client = client or store.connect(settings.redis, settings.lease.ttl_s)
            result = Execution(settings, client, TASK, CommandTarget(["true"]), Shutdown()).run()
            assert result.exit_code == 0, result
            done += 1
        keys = TaskKeys("cron-runner", "cron-system", TASK)
        markers = list(client.scan_iter(match=keys.slot(0).rsplit(":", 1)[0] + ":*", count=1000))
        figures[str(checkpoint)] = {
            "runs_stream_bytes": usage(client, keys.runs),
            "runs_stream_entries": int(client.xlen(keys.runs)),
            "state_hash_bytes": usage(client, keys.state),
            "fence_bytes": usage(client, keys.fence),
            "slot_marker_bytes": usage(client, markers[0]) if markers else 0,
            "slot_markers": len(markers),
            "marker_ttl_s": int(client.ttl(markers[0])) if markers else None,
            "used_memory_bytes": int(client.info("memory")["used_memory"]),
        }
    client.close()
    return figures


def main() -> int:
    with RedisServer() as server:
        admin: Any = server.client()
        version = admin.info("server")["redis_version"]
        admin.close()
        figures = measure(server.url)
    json.dump({"redis_version": version, "after_runs": figures}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
