"""Many replicas of one task: exactly one runs it per slot (the guarantees in the README)."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from runner.testing import RedisServer
from tests.helpers.proc import events, outcome, run, runner_env, side_effects, spawn
from tests.helpers.wait import schedule_far_from_edges, wait_for


def _effect_cmd(effects: Path, hold_s: float = 0.5) -> list[str]:
    # Holds the lease a little, so replicas that start late still find it held.
    return [
        "sh",
        "-c",
        f'echo "ran $CRON_RUNNER_HOLDER $CRON_RUNNER_FENCING_TOKEN" >> {effects}; sleep {hold_s}',
    ]


def test_50_exec_replicas_run_the_command_once(redis_server: RedisServer, tmp_path: Path) -> None:
    effects = tmp_path / "effects.log"
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE=schedule_far_from_edges(300))
    procs = [
        spawn(
            ["exec", "--name", "report", "--holder", f"replica-{i}", "--", *_effect_cmd(effects)],
            env,
        )
        for i in range(50)
    ]
    results = [(p.wait(timeout=90), p.communicate()[1]) for p in procs]
    assert [code for code, _ in results] == [0] * 50, [e for _, e in results if e][:2]
    assert len(side_effects(effects)) == 1
    outcomes = sorted(outcome(err) or "none" for _, err in results)
    assert outcomes.count("ran") == 1
    assert set(outcomes) <= {"ran", "skipped_held", "skipped_done"}


def test_late_replica_skips_same_slot_and_next_slot_runs(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    hourly = schedule_far_from_edges(3600, tolerance_s=5)
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE=hourly, CRON_RUNNER_SKEW_TOLERANCE="5s")
    first = run(["exec", "--name", "hourly", "--", *_effect_cmd(effects, 0)], env)
    late = run(["exec", "--name", "hourly", "--", *_effect_cmd(effects, 0)], env)
    assert (first.returncode, late.returncode) == (0, 0)
    assert outcome(late.stderr) == "skipped_done"
    assert len(side_effects(effects)) == 1

    # Another slot: faking the clock at the seam is not possible across processes, so use a
    # Job name for the slot before (a later one is refused: it has not come yet).
    slot = next(e["slot"] for e in events(first.stderr) if e.get("event") == "acquired")
    next_env = {
        **env,
        "CRON_RUNNER_JOB_NAME": f"hourly-{(slot - 3600) // 60}",
        "CRON_RUNNER_CRONJOB_NAME": "hourly",
    }
    nxt = run(["exec", "--name", "hourly", "--", *_effect_cmd(effects, 0)], next_env)
    assert nxt.returncode == 0
    assert outcome(nxt.stderr) == "ran"
    assert len(side_effects(effects)) == 2


def test_two_pods_of_one_job_run_once(redis_server: RedisServer, tmp_path: Path) -> None:
    effects = tmp_path / "effects.log"
    minutes = int(time.time() // 60)
    env = runner_env(
        redis_server.url,
        CRON_RUNNER_JOB_NAME=f"nightly-{minutes}",
        CRON_RUNNER_CRONJOB_NAME="nightly",
    )
    a = run(["exec", "--name", "nightly", "--holder", "pod-a", "--", *_effect_cmd(effects, 0)], env)
    b = run(["exec", "--name", "nightly", "--holder", "pod-b", "--", *_effect_cmd(effects, 0)], env)
    assert (a.returncode, b.returncode) == (0, 0)
    assert (outcome(a.stderr), outcome(b.stderr)) == ("ran", "skipped_done")
    ran = next(e for e in events(a.stderr) if e.get("event") == "acquired")
    assert ran["slot"] == minutes * 60
    assert len(side_effects(effects)) == 1


def test_manual_job_runs_and_is_still_exclusive(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    env = runner_env(
        redis_server.url,
        CRON_RUNNER_JOB_NAME="nightly-manual-x7k2",
        CRON_RUNNER_CRONJOB_NAME="nightly",
    )
    holder = spawn(["exec", "--name", "nightly", "--", *_effect_cmd(effects, 3)], env)
    try:
        wait_for(lambda: side_effects(effects), what="the holder's task to start")
        second = run(["exec", "--name", "nightly", "--", *_effect_cmd(effects, 0)], env)
        assert second.returncode == 0
        assert outcome(second.stderr) == "skipped_held"
    finally:
        _, stderr = holder.communicate(timeout=30)
    assert holder.returncode == 0
    assert [e.get("slot") for e in events(stderr) if e.get("event") == "acquired"] == ["manual"]
    assert len(side_effects(effects)) == 1
    # A manual run writes no slot marker: the next manual run may run again.
    assert not r.keys("cron-runner:{default:nightly}:slot:*")
    again = run(["exec", "--name", "nightly", "--", *_effect_cmd(effects, 0)], env)
    assert outcome(again.stderr) == "ran"


def test_two_names_for_one_registered_task_keep_their_own_slots(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Chart tasks `daily-report` and `weekly-report` both run task `ok`; firing in the same
    minute, each runs once (`run ok --name <key>`, as the chart renders it)."""
    effects = tmp_path / "effects.log"
    minutes = int(time.time() // 60)
    outcomes: dict[str, list[str | None]] = {}
    for key in ("daily-report", "weekly-report", "daily-report"):
        env = runner_env(
            redis_server.url,
            CRON_RUNNER_JOB_NAME=f"{key}-{minutes}",
            CRON_RUNNER_CRONJOB_NAME=key,
            SIDE_EFFECTS=str(effects),
        )
        res = run(["run", "ok", "--name", key, "--holder", f"{key}-pod"], env)
        assert res.returncode == 0, res.stderr
        outcomes.setdefault(key, []).append(outcome(res.stderr))
    assert outcomes == {"daily-report": ["ran", "skipped_done"], "weekly-report": ["ran"]}
    assert len(side_effects(effects)) == 2
    bad = run(["run", "ok", "--name", "bad{name}"], runner_env(redis_server.url))
    assert bad.returncode == 78
    assert "--name" in bad.stderr
