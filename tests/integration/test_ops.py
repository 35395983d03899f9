"""status, history and unlock through the real CLI, against state left by real runs."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from runner.ops.state import Reader
from runner.testing import RedisServer
from tests.helpers.proc import (
    LEASE,
    events,
    outcome,
    run,
    runner_env,
    side_effects,
    spawn,
    spawn_started,
)
from tests.helpers.wait import schedule_far_from_edges, wait_for

FENCE = "cron-runner:{default:%s}:fence"
ISO_Z = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"

STATUS_KEYS = {
    "task", "lease", "fencing_token", "schedule", "timezone", "last_slot", "last_run",
    "last_success", "last_failure", "next_slot", "overdue", "missed", "schedule_error", "running_since", "max_runtime_s",
    "over_max_runtime", "paused",
}  # fmt: skip
RESULT_KEYS = {"at", "slot", "duration_ms", "outcome", "exit_code"}
RUN_KEYS = {
    "id", "started_at", "slot", "holder", "fencing_token", "outcome", "exit_code",
    "duration_ms", "error", "unlocked", "note", "paused_until",
}  # fmt: skip


def _json(args: list[str], env: dict[str, str]) -> Any:
    res = run([*args, "--output", "json"], env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _is_iso(value: object) -> bool:
    import re  # noqa: PLC0415

    return isinstance(value, str) and re.match(ISO_Z, value) is not None


@pytest.fixture
def scheduled(redis_server: RedisServer, tmp_path: Path) -> dict[str, str]:
    return runner_env(
        redis_server.url,
        CRON_RUNNER_SCHEDULE=schedule_far_from_edges(300),
        SIDE_EFFECTS=str(tmp_path / "effects.log"),
    )


def test_status_and_history_after_ran_skipped_and_failed(
    scheduled: dict[str, str], r: redis.Redis
) -> None:
    env = scheduled
    ran = run(["exec", "--name", "report", "--holder", "pod-a", "--", "true"], env)
    skipped = run(["exec", "--name", "report", "--holder", "pod-b", "--", "true"], env)
    assert (outcome(ran.stderr), outcome(skipped.stderr)) == ("ran", "skipped_done")
    failed = run(
        ["exec", "--name", "billing", "--holder", "pod-c", "--", "sh", "-c", "exit 3"], env
    )
    assert failed.returncode == 3
    slot = next(e["slot"] for e in events(ran.stderr) if e.get("event") == "start")
    fence = next(e["fence"] for e in events(ran.stderr) if e.get("event") == "acquired")

    doc = _json(["status"], env)
    assert {"scope", "now", "tasks"} <= set(doc)  # queue mode adds its queues
    assert doc["scope"] == "default"
    assert _is_iso(doc["now"])
    by_task = {t["task"]: t for t in doc["tasks"]}
    assert sorted(by_task) == ["billing", "report"]
    for task in by_task.values():
        assert set(task) == STATUS_KEYS

    report = by_task["report"]
    assert report["lease"] is None
    assert report["fencing_token"] == int(cast(str, r.get(FENCE % "report"))) == fence
    assert (report["schedule"], report["timezone"]) == (env["CRON_RUNNER_SCHEDULE"], "UTC")
    assert report["last_slot"] == slot
    assert report["last_run"]["outcome"] == "ran"
    assert report["last_run"]["holder"] == "pod-a"
    success = report["last_success"]
    assert set(success) == RESULT_KEYS
    assert _is_iso(success["at"])
    assert (success["slot"], success["outcome"], success["exit_code"]) == (slot, "ran", 0)
    assert isinstance(success["duration_ms"], int)
    assert report["last_failure"] is None
    assert report["next_slot"] == slot + 300
    assert report["overdue"] is False
    assert report["missed"] == {"due_slot": report["missed"]["due_slot"], "slots": [],
                                "more": False, "running_slot": None}  # fmt: skip

    billing = by_task["billing"]
    assert billing["last_success"] is None
    assert billing["last_failure"]["outcome"] == "failed"
    assert billing["last_failure"]["exit_code"] == 3

    # A skip is not a run: it leaves no record, and the history shows pod-a's run only.
    history = _json(["history", "report"], env)
    assert set(history) == {"task", "scope", "runs"}
    (record,) = history["runs"]
    assert set(record) == RUN_KEYS
    assert record["holder"] == "pod-a"
    assert (record["slot"], record["fencing_token"], record["outcome"]) == (slot, fence, "ran")
    assert record["exit_code"] == 0
    assert _is_iso(record["started_at"])
    assert record["error"] is None
    failure = _json(["history", "billing"], env)["runs"][0]
    assert (failure["outcome"], failure["exit_code"]) == ("failed", 3)
    assert failure["error"] == "command exited with code 3"

    table = run(["status"], env)
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["TASK", "LEASE", "FENCE"]
    assert [line.split()[0] for line in lines[1:3]] == ["billing", "report"]
    assert "failed exit 3" in lines[1]
    assert lines[3:] == ["", "watchdog: MISSING: no heartbeat (no `cron-runner watchdog` has run "
                         "within its --heartbeat-ttl)"]  # fmt: skip


def test_history_of_lease_lost_and_terminated_runs(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    env = runner_env(redis_server.url, SIDE_EFFECTS=str(effects), TASK_SECONDS="30")
    lost = spawn_started(
        ["run", "slow", "--lease-ttl", "1500ms", "--holder", "pod-lost"],
        env,
        effects,
        what="first task start",
    )
    r.set(LEASE % "slow", "thief:0000", px=2_000)
    lost.communicate(timeout=30)
    assert lost.returncode == 75

    wait_for(lambda: r.get(LEASE % "slow") is None, what="the thief's lease to expire")
    effects.unlink()
    stopped = spawn_started(
        ["run", "slow", "--holder", "pod-term"], env, effects, what="second task start"
    )
    stopped.send_signal(signal.SIGTERM)
    stopped.communicate(timeout=30)
    assert stopped.returncode == 143

    runs = _json(["history", "slow"], env)["runs"]
    assert [(x["holder"], x["outcome"], x["exit_code"]) for x in runs] == [
        ("pod-term", "terminated", 143),
        ("pod-lost", "lease_lost", 75),
    ]
    assert runs[0]["fencing_token"] > runs[1]["fencing_token"] > 0
    status = _json(["status", "slow"], env)["tasks"][0]
    assert status["last_failure"]["outcome"] == "terminated"
    assert status["schedule"] is None
    assert status["overdue"] is None  # no schedule: the watchdog cannot judge it
    assert _json(["history", "slow"], {**env, "CRON_RUNNER_SCOPE": "other"})["runs"] == []
    table = run(["history", "slow", "-n", "1"], env)
    assert len(table.stdout.splitlines()) == 2
    assert "terminated" in table.stdout


def test_status_shows_the_holder_while_a_run_holds_the_lease(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    env = runner_env(redis_server.url, SIDE_EFFECTS=str(effects), TASK_SECONDS="30")
    proc = spawn(["run", "slow", "--holder", "pod-x"], env)
    try:
        wait_for(lambda: side_effects(effects, "start"), what="task start")
        doc = _json(["status"], env)
        (task,) = doc["tasks"]  # found by its lease: it has no state yet
        assert task["task"] == "slow"
        assert task["lease"]["holder"] == "pod-x"
        assert 0 < task["lease"]["ttl_ms"] <= 30_000
        assert task["fencing_token"] > 0
        assert "pod-x (" in run(["status", "slow"], env).stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_unlock_is_refused_without_force_and_logged(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    env = runner_env(redis_server.url, SIDE_EFFECTS=str(effects), TASK_SECONDS="30")
    proc = spawn_started(["run", "slow", "--holder", "pod-stuck"], env, effects)

    refused = run(["unlock", "slow"], env)
    assert refused.returncode == 78
    assert "--force" in refused.stderr
    assert r.get(LEASE % "slow") is not None

    wrong = run(["unlock", "slow", "--force", "--holder", "pod-other"], env)
    assert wrong.returncode == 1
    assert "held by pod-stuck" in wrong.stdout
    assert r.get(LEASE % "slow") is not None

    admin_env = {**env, "CRON_RUNNER_HOLDER": "admin-1"}
    done = run(["unlock", "slow", "--force", "--holder", "pod-stuck"], admin_env)
    assert done.returncode == 0, done.stderr
    logged = next(e for e in events(done.stderr) if e.get("event") == "unlock")
    assert (logged["level"], logged["run_holder"], logged["holder"]) == (
        "warning",
        "pod-stuck",
        "admin-1",
    )
    assert r.get(LEASE % "slow") is None
    # The holder finds its lease gone at its next renewal and stops its task.
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 75, stderr

    runs = _json(["history", "slow"], env)["runs"]
    assert [(x["outcome"], x["holder"], x["unlocked"]) for x in runs] == [
        ("lease_lost", "pod-stuck", None),
        ("unlocked", "admin-1", "pod-stuck"),
    ]
    again = run(["unlock", "slow", "--force"], env)
    assert again.returncode == 0
    assert "already free" in again.stdout


def test_unlock_without_holder_removes_any_lease(redis_server: RedisServer, r: redis.Redis) -> None:
    env = runner_env(redis_server.url)
    r.set(LEASE % "orphan", "gone-pod:1234:abcd", px=60_000)
    res = run(["unlock", "orphan", "--force"], env)
    assert res.returncode == 0
    assert "held by gone-pod:1234" in res.stdout
    assert r.get(LEASE % "orphan") is None


def test_next_slot_follows_a_slot_claimed_ahead_of_the_clock(r: redis.Redis) -> None:
    # A run 10 s before 01:10 claims the 01:10 slot (within the tolerance); status read
    # at that moment must not offer 01:10 as the next slot: it has already run.
    edge = 1796001000
    reader = Reader(r, "cron-runner", "default")
    r.hset(reader.keys("early").state,
           mapping={"schedule": "*/5 * * * *", "timezone": "UTC", "last_slot": edge})  # fmt: skip
    assert reader.status("early", now_s=edge - 10, tolerance_s=30).next_slot == edge + 300
    assert reader.status("early", now_s=edge + 301, tolerance_s=30).next_slot == edge + 600


def test_ops_commands_exit_69_when_redis_is_unreachable() -> None:
    from runner.testing import free_port  # noqa: PLC0415

    env = runner_env(f"redis://127.0.0.1:{free_port()}/0", CRON_RUNNER_CONNECT_TIMEOUT="300ms")
    started = time.monotonic()
    for args in (["status"], ["history", "x"], ["unlock", "x", "--force"], ["watchdog"]):
        res = run(args, env)
        assert res.returncode == 69, (args, res.stderr)
        assert "unreachable" in res.stderr
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["history", "bad{name}"], "TASK"),
        (["status", "bad{name}"], "TASK"),
        (["history", "x", "-n", "0"], "-n 0"),
        (["watchdog", "--tolerance", "soon"], "--tolerance"),
        (["status", "--output", "yaml"], "invalid choice"),
    ],
)
def test_ops_bad_values_exit_78_and_usage_errors_64(
    redis_server: RedisServer, args: list[str], named: str
) -> None:
    res = run(args, runner_env(redis_server.url))
    assert res.returncode == (64 if named == "invalid choice" else 78), res.stderr
    assert named in res.stderr
