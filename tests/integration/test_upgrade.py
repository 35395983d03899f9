"""A rolling upgrade (issue 11, item 11): a previous release's runner (from a git worktree in its
own venv) and this one share a Redis, started together for 20 slots, each side first in turn. Exactly one side effect per slot, and the ``status`` and ``history`` of each read
the other's records. With an overlap policy other than skip (issue 17), this release raises the
task's protocol minimum to 3: bf4bd60 refuses (78) and runs nothing; b170e33, which reads no
minimum, still never runs a slot twice beside it; 0373222, protocol 3 before the lease scripts
were rewritten for speed, runs the policy beside it.

Slots come from CRON_RUNNER_JOB_NAME (runner/schedule/slots.py), 20 recent minutes, so the test
needs no real minutes to pass. Each old release is built once per test session."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.errors import ConfigError
from runner.lease.scripts import PROTOCOL
from runner.testing import RedisServer
from tests.helpers.proc import CRON_RUNNER, ROOT, events, runner_env
from tests.helpers.wait import wait_for

# b170e33: before the protocol version (issue 11); bf4bd60: the last commit before the package
# layout of issue 15, whose keys, scripts and records the restructured runner must share;
# 0373222: protocol 3 (issue 17) with the lease scripts before their rewrite for speed.
PREVIOUS_RELEASES = ("b170e33", "bf4bd60", "0373222")
# The previous releases that speak protocol 3: they know the overlap policies.
PROTOCOL_3 = ("0373222",)
LEASE_KEY = "cron-runner:{default:mixed}:lease"
pytestmark = pytest.mark.upgrade


@pytest.fixture(scope="session", params=PREVIOUS_RELEASES)
def previous_runner(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    previous: str = request.param
    base = tmp_path_factory.mktemp(f"cron-runner-{previous}")
    tree, venv = base / "tree", base / "venv"
    git = ["git", "-C", str(ROOT)]
    subprocess.run([*git, "worktree", "add", "--detach", str(tree), previous],
                   check=True, capture_output=True)  # fmt: skip
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
             "-c", "constraints.txt", "-e", "."],
            cwd=tree, check=True, capture_output=True,
        )  # fmt: skip
        yield str(venv / "bin" / "cron-runner")
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(tree)], capture_output=True)


def _env(redis_url: str, **extra: str) -> dict[str, str]:
    env = runner_env(redis_url, CRON_RUNNER_SCHEDULE="* * * * *", **extra)
    # The old venv imports its own runner package, not this checkout's.
    for name in ("PYTHONPATH", "CRON_RUNNER_TASK_MODULES"):
        env.pop(name, None)
    return env


def _start(binary: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([binary, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _json(binary: str, args: list[str], env: dict[str, str]) -> Any:
    res = subprocess.run([binary, *args, "--output", "json"], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _took_or_ended(client: Any, proc: subprocess.Popen[str]) -> bool:
    return bool(client.exists(LEASE_KEY)) or proc.poll() is not None


def test_previous_and_new_runner_share_a_redis_without_running_a_slot_twice(
    redis_server: RedisServer, previous_runner: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    # One command, one definition: who ran it is in the environment, not the command line.
    command = ["sh", "-c", f'sleep 0.2; echo "$CRON_RUNNER_JOB_NAME $SIDE" >> {effects}']
    sides = {"old": previous_runner, "new": CRON_RUNNER}
    first_minute = int(time.time() // 60) - 25
    outcomes: dict[str, list[str]] = {"old": [], "new": []}
    client = redis_server.client()
    for i in range(20):
        job = f"mixed-{first_minute + i}"
        order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
        procs = {}
        for side in order:
            procs[side] = _start(sides[side], ["exec", "--name", "mixed", "--holder",
                                               f"pod-{side}", "--", *command],
                                 _env(redis_server.url, CRON_RUNNER_JOB_NAME=job, SIDE=side))  # fmt: skip
            # Every other pair of slots, the first side has taken the lease before the second
            # starts, so each version is seen holding it; in the rest both race from the start
            # (the new one, quicker to start, mostly wins those).
            if side == order[0] and i % 4 < 2:
                wait_for(functools.partial(_took_or_ended, client, procs[side]),
                         what=f"the {side} runner to take the lease")  # fmt: skip
        for side, proc in procs.items():
            _, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0, stderr
            assert "Traceback" not in stderr, stderr
            done = [e["outcome"] for e in events(stderr) if e.get("outcome") is not None]
            outcomes[side].append(done[-1])

    lines = effects.read_text().splitlines()
    by_job: dict[str, list[str]] = {}
    for line in lines:
        job, side = line.split()
        by_job.setdefault(job, []).append(side)
    assert len(by_job) == 20
    assert all(len(sides_) == 1 for sides_ in by_job.values()), by_job
    ran = {side: outcomes[side].count("ran") for side in outcomes}
    # Both sides ran some slots: they truly shared the work, not one side alone.
    assert ran["old"] > 0 and ran["new"] > 0, outcomes
    assert ran["old"] + ran["new"] == 20, outcomes
    for got in outcomes.values():
        assert set(got) <= {"ran", "skipped_held", "skipped_done"}, got

    # Each side's status and history read every record, the other side's too.
    env = _env(redis_server.url)
    last_slot = (first_minute + 19) * 60
    statuses = {side: _json(binary, ["status", "mixed"], env) for side, binary in sides.items()}
    for side, doc in statuses.items():
        (task,) = doc["tasks"]
        assert task["last_slot"] == last_slot, (side, task)
        assert task["last_success"]["slot"] == last_slot, (side, task)
        assert task["last_run"]["holder"] in ("pod-old", "pod-new"), (side, task)
    assert (
        statuses["old"]["tasks"][0]["fencing_token"] == statuses["new"]["tasks"][0]["fencing_token"]
    )
    histories = {
        side: _json(binary, ["history", "mixed", "-n", "50"], env)["runs"]
        for side, binary in sides.items()
    }
    # The same runs, field for field; a newer history may carry fields the old one does not
    # know (issue 17's pause records add `note` and `paused_until`), always empty for a run.
    assert [
        {k: run.get(k) for k in old}
        for run, old in zip(histories["new"], histories["old"], strict=True)
    ] == histories["old"]
    assert all(
        v is None
        for run, old in zip(histories["new"], histories["old"], strict=True)
        for k, v in run.items()
        if k not in old
    )
    assert len(histories["new"]) == 20
    assert {run["holder"] for run in histories["new"]} == {"pod-old", "pod-new"}
    # The new runner stored its protocol for runners that check it; the old one ignores it.
    assert client.hget("cron-runner:{default:mixed}:meta", "protocol") == str(PROTOCOL)
    assert os.path.exists(previous_runner)


def test_a_runner_refuses_a_task_a_newer_incompatible_protocol_has_marked(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """What protocol N+1 does if it cannot share keys with N: it stores protocol_min N+1, and
    runners of N, which check it in their acquire, refuse to run beside it (naming both)."""
    client = redis_server.client()
    newer = PROTOCOL + 1
    client.hset("cron-runner:{default:ahead}:meta",
                mapping={"protocol": str(newer), "protocol_min": str(newer)})  # fmt: skip
    effects = tmp_path / "effects"
    res = subprocess.run(
        [CRON_RUNNER, "exec", "--name", "ahead", "--", "sh", "-c", f"echo ran >> {effects}"],
        env=runner_env(redis_server.url), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == ConfigError.exit_code, res.stderr
    assert "Traceback" not in res.stderr
    assert f"speaks protocol {PROTOCOL}" in res.stderr
    assert f"needing protocol {newer}" in res.stderr
    assert not effects.exists()
    assert client.get("cron-runner:{default:ahead}:lease") is None
    assert client.get("cron-runner:{default:ahead}:fence") is None
    # A newer runner that keeps the older one's protocol as its minimum runs beside it.
    client.hset("cron-runner:{default:ahead}:meta", "protocol_min", str(PROTOCOL))
    ok = subprocess.run([CRON_RUNNER, "exec", "--name", "ahead", "--", "true"],
                        env=runner_env(redis_server.url), capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    # It never lowers what the newer runner stored.
    assert client.hget("cron-runner:{default:ahead}:meta", "protocol") == str(newer)


@pytest.mark.parametrize("overlap", ["replace", "allow-other-slots"])
def test_with_an_overlap_policy_the_previous_runner_is_refused_or_never_runs_a_slot_twice(
    redis_server: RedisServer, previous_runner: str, tmp_path: Path, overlap: str
) -> None:
    effects = tmp_path / "effects"
    command = ["sh", "-c", f'sleep 0.2; echo "$CRON_RUNNER_JOB_NAME $SIDE" >> {effects}']
    sides = {"old": previous_runner, "new": CRON_RUNNER}
    first_minute = int(time.time() // 60) - 15
    client = redis_server.client()
    outcomes: dict[str, list[tuple[str | None, int]]] = {"old": [], "new": []}
    for i in range(6):
        job = f"mixed-{first_minute + i}"
        # The new runner first in the first pair, so the policy's minimum is stored from then on.
        order = ["new", "old"] if i % 2 == 0 else ["old", "new"]
        procs = {}
        for side in order:
            knows = side == "new" or speaks_protocol_3(previous_runner)
            extra = {"CRON_RUNNER_OVERLAP": overlap} if knows else {}
            procs[side] = _start(sides[side], ["exec", "--name", "mixed", "--holder",
                                               f"pod-{side}", "--", *command],
                                 _env(redis_server.url, CRON_RUNNER_JOB_NAME=job, SIDE=side,
                                      **extra))  # fmt: skip
            if side == order[0]:
                wait_for(functools.partial(_took_or_ended, client, procs[side]),
                         what=f"the {side} runner to take the lease")  # fmt: skip
        for side, proc in procs.items():
            _, stderr = proc.communicate(timeout=60)
            assert "Traceback" not in stderr, stderr
            done = [e["outcome"] for e in events(stderr) if e.get("outcome") is not None]
            outcomes[side].append((done[-1] if done else None, proc.returncode))
            refused = previous_runner_checks_protocol(previous_runner)
            if side == "old" and refused and not speaks_protocol_3(previous_runner):
                assert proc.returncode == ConfigError.exit_code, stderr
                assert "needing protocol 3" in stderr, stderr

    by_job: dict[str, list[str]] = {}
    for line in effects.read_text().splitlines():
        job, side = line.split()
        by_job.setdefault(job, []).append(side)
    assert all(len(ran) == 1 for ran in by_job.values()), by_job
    assert client.hget("cron-runner:{default:mixed}:meta", "protocol_min") == "3"
    if speaks_protocol_3(previous_runner):
        # Both speak the policy: they share the lease and the markers, each slot runs once.
        assert len(by_job) == 6
        for got, code in outcomes["old"] + outcomes["new"]:
            assert (got, code) in {("ran", 0), ("skipped_held", 0), ("skipped_done", 0)}
    elif previous_runner_checks_protocol(previous_runner):
        # Refused every time: the old runner never ran a slot, the new one ran them all.
        assert {ran[0] for ran in by_job.values()} == {"new"}
        assert len(by_job) == 6
        assert {code for _, code in outcomes["old"]} == {ConfigError.exit_code}
    else:
        # b170e33 reads no minimum: it shares the lease and the markers, so never a slot twice.
        for got, code in outcomes["old"]:
            assert (got, code) in {("ran", 0), ("skipped_held", 0), ("skipped_done", 0)}


def previous_runner_checks_protocol(binary: str) -> bool:
    """bf4bd60 checks the task's protocol minimum (protocol 2); b170e33 predates it."""
    return "b170e33" not in binary


def speaks_protocol_3(binary: str) -> bool:
    return any(release in binary for release in PROTOCOL_3)
