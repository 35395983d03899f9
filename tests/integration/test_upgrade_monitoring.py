"""The previous release (b170e33, the last landed) and this code on one Redis: the new lease
token (it carries the start time), the ledger and the heartbeat change nothing for it, and
what it writes is read right by the new status, watchdog and serve.

The previous release's `runner` package comes from `git archive`, run with this venv's
libraries; the editable install's import hook is taken out so that it is the one imported."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path

import pytest
import redis

from runner.schedule.slots import Schedule
from runner.testing import RedisServer
from tests.helpers.proc import ROOT, events, outcome, run, runner_env, spawn
from tests.helpers.wait import schedule_far_from_edges, wait_for

PREVIOUS = "b170e33"
OLD_MAIN = (
    "import sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in repr(f)]\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
    "import runner.cli\n"
    "assert runner.cli.__file__.startswith(sys.path[0]), runner.cli.__file__\n"
    "sys.exit(runner.cli.main(sys.argv[1:]))\n"
)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("previous")
    archive = subprocess.run(["git", "archive", PREVIOUS, "runner"], cwd=ROOT,
                             capture_output=True, check=True).stdout  # fmt: skip
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    return out


def old(previous: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", OLD_MAIN, str(previous), *args], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_previous_release_reads_a_new_lease_and_skips(
    redis_server: RedisServer, r: redis.Redis, previous: Path
) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE=schedule_far_from_edges(300))
    proc = spawn(["exec", "--name", "mixed", "--holder", "pod-new", "--", "sleep", "30"], env)
    try:
        wait_for(lambda: r.exists("cron-runner:{default:mixed}:lease"), 10)
        skipped = old(
            previous, ["exec", "--name", "mixed", "--holder", "pod-old", "--", "true"], env
        )
        assert (skipped.returncode, outcome(skipped.stderr)) == (0, "skipped_held"), skipped.stderr
        held = [e for e in events(skipped.stderr) if e.get("event") == "skipped"]
        assert "pod-new" in json.dumps(held)
        status = json.loads(old(previous, ["status", "mixed", "-o", "json"], env).stdout)
        assert status["tasks"][0]["lease"]["holder"] == "pod-new"
        # The previous release's unlock --holder matches the new token's holder.
        unlocked = old(previous, ["unlock", "mixed", "--force", "--holder", "pod-new"], env)
        assert unlocked.returncode == 0, unlocked.stderr
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode != 0  # it found its lease gone, stopped its task


def test_slots_the_previous_release_ran_are_not_missed(
    redis_server: RedisServer, previous: Path
) -> None:
    hourly = schedule_far_from_edges(3600)  # the run for this hour must not claim the next one
    schedule = Schedule.parse(hourly, "UTC", 0)
    url = redis_server.url
    slots = [schedule.previous_at_or_before(time.time() - h * 3600) for h in (3, 2, 1)]
    for i, slot in enumerate(slots):
        pod = runner_env(url, CRON_RUNNER_JOB_NAME=f"release-hourly-{slot // 60}",
                         CRON_RUNNER_CRONJOB_NAME="release-hourly", CRON_RUNNER_SCHEDULE=hourly,
                         CRON_RUNNER_SLOT_RETENTION="24h")  # fmt: skip
        args = ["exec", "--name", "hourly", "--", "true"]
        res = old(previous, args, pod) if i % 2 == 0 else run(args, pod)  # the two, in turn
        assert res.returncode == 0, res.stderr
    plain = runner_env(url, CRON_RUNNER_SCHEDULE=hourly)
    # The current slot too, by the previous release, then the new watchdog judges them all.
    assert old(previous, ["exec", "--name", "hourly", "--", "true"], plain).returncode == 0
    dog = run(["watchdog", "-o", "json"], runner_env(url))
    assert (dog.returncode, json.loads(dog.stdout)["overdue"]) == (0, []), dog.stdout
    # And the previous release's watchdog and status read the state the new one left.
    assert old(previous, ["watchdog"], runner_env(url)).returncode == 0
    assert old(previous, ["status"], runner_env(url)).returncode == 0
