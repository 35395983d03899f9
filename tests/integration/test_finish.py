"""The finish step, all or nothing where it matters (issue 11, items 2 and 4), through the CLI on
a real Redis: whatever write fails inside it, a slot whose task succeeded is never run again, the
lease is never released before the marker is safe, and a stale holder never overwrites the state
a newer holder wrote."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
import redis

from runner.errors import FinishIncomplete, LeaseLost
from runner.testing import RedisServer
from tests.helpers.proc import events, outcome, run, runner_env, side_effects, spawn
from tests.helpers.wait import wait_for
from tests.integration.test_redis_shapes import ACL_RULE

BASE = "cron-runner:{default:fin}"
TTL_S = 30


def _slot_env(redis_server: RedisServer, tmp_path: Path, **extra: str) -> dict[str, str]:
    # A Job-name slot, so that the retry is a retry of the very same slot.
    minutes = int(time.time() // 60) - 1
    return runner_env(
        redis_server.url,
        CRON_RUNNER_JOB_NAME=f"fin-{minutes}",
        CRON_RUNNER_LEASE_TTL=f"{TTL_S}s",
        CRON_RUNNER_REDIS_USERNAME="cron-runner",
        CRON_RUNNER_REDIS_PASSWORD="s3cret",
        # The retry of a slot whose lease was kept as its marker waits this long, then gives up.
        CRON_RUNNER_HELD_WAIT="1s",
        **extra,
    )


def _task(tmp_path: Path) -> list[str]:
    started, effects = tmp_path / "started", tmp_path / "effects"
    return ["sh", "-c", f"touch {started}; sleep 1; echo ran >> {effects}"]


def _acl(r: redis.Redis, *rules: str) -> None:
    r.execute_command("ACL", "SETUSER", "cron-runner", *rules)


def _wrong_type(r: redis.Redis, key: str) -> None:
    r.set(key, "a string where a hash or a stream belongs")


def _refuse(command: str) -> Callable[[redis.Redis, int], None]:
    return lambda r, _slot: _acl(r, f"-{command}")


BREAKS: dict[str, Callable[[redis.Redis, int], None]] = {
    # Every write command the finish uses, refused to the ACL user while the task runs ...
    **{f"-{cmd}": _refuse(cmd) for cmd in ("hset", "pexpire", "del", "xadd", "hmget", "get")},
    # ... and each key it writes, of the wrong type.
    "runs-wrong-type": lambda r, _slot: _wrong_type(r, f"{BASE}:runs"),
    "state-wrong-type": lambda r, _slot: _wrong_type(r, f"{BASE}:state"),
    "marker-wrong-type": lambda r, slot: _wrong_type(r, f"{BASE}:slot:{slot}"),
}  # fmt: skip
# Where the marker itself cannot be written, the lease stands in for it.
MARKER_UNWRITABLE = {"-hset", "marker-wrong-type"}


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_a_failing_write_in_the_finish_never_lets_the_slot_run_again(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path, broken: str
) -> None:
    r.execute_command("ACL", "SETUSER", "cron-runner", "reset", "on", ">s3cret", *ACL_RULE.split())
    env = _slot_env(redis_server, tmp_path)
    first = spawn(["exec", "--name", "fin", "--", *_task(tmp_path)], env)
    wait_for((tmp_path / "started").exists, what="the task to start")
    slot = int(env["CRON_RUNNER_JOB_NAME"].rsplit("-", 1)[1]) * 60
    BREAKS[broken](r, slot)
    _, stderr = first.communicate(timeout=30)
    assert "Traceback" not in stderr, stderr
    assert side_effects(tmp_path / "effects") == ["ran"]
    # The task ran, but the finish is incomplete: a configuration to fix, named.
    assert first.returncode == FinishIncomplete.exit_code, stderr
    (error,) = [e for e in events(stderr) if e.get("event") == "finish_incomplete"]
    assert "these writes failed" in error["msg"]

    marker = f"{BASE}:slot:{slot}"
    if broken in MARKER_UNWRITABLE:
        # No marker: the lease is kept for the marker's retention instead, far past its TTL.
        assert "the lease is kept" in error["msg"]
        assert r.get(f"{BASE}:lease") is not None
        assert int(r.pttl(f"{BASE}:lease")) > TTL_S * 1000  # type: ignore[arg-type]
    else:
        assert "the slot is marked done" in error["msg"]
        assert r.hget(marker, "holder") is not None
        # Not deleted when it could not be read or deleted: it expires by its TTL.
        assert (r.get(f"{BASE}:lease") is None) == (broken not in ("-get", "-del"))

    # The fault is fixed (ACL restored), and the Job retries the slot: it does not run again.
    r.execute_command("ACL", "SETUSER", "cron-runner", "reset", "on", ">s3cret", *ACL_RULE.split())
    for key in ("runs", "state"):
        if r.type(f"{BASE}:{key}") == "string":
            r.delete(f"{BASE}:{key}")
    retry = run(["exec", "--name", "fin", "--", *_task(tmp_path)], env)
    assert "Traceback" not in retry.stderr, retry.stderr
    assert side_effects(tmp_path / "effects") == ["ran"], retry.stderr
    if broken in MARKER_UNWRITABLE:
        # Held by the kept lease (a wrong-typed marker even fails the acquire): neither run nor
        # reported done.
        assert outcome(retry.stderr) in ("skipped_held", "unavailable"), retry.stderr
        assert retry.returncode != 0
    else:
        assert (outcome(retry.stderr), retry.returncode) == ("skipped_done", 0), retry.stderr


def test_a_stale_holder_never_overwrites_the_newer_holders_state(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    """A is frozen past its TTL, B runs and succeeds, A wakes: A records its lost run in the
    history, but the state (last outcome, last fence) stays B's."""
    env = runner_env(redis_server.url, CRON_RUNNER_LEASE_TTL="1500ms")
    a = spawn(["exec", "--name", "stale", "--holder", "pod-a", "--", "sleep", "20"], env)
    wait_for(lambda: r.get("cron-runner:{default:stale}:lease"), what="A's lease")
    os.kill(a.pid, signal.SIGSTOP)  # the runner alone: its renewals stop
    try:
        wait_for(lambda: not r.exists("cron-runner:{default:stale}:lease"), what="A's expiry")
        b = run(["exec", "--name", "stale", "--holder", "pod-b", "--", "true"], env)
        assert (outcome(b.stderr), b.returncode) == ("ran", 0), b.stderr
    finally:
        os.kill(a.pid, signal.SIGCONT)
    _, a_err = a.communicate(timeout=30)
    assert (outcome(a_err), a.returncode) == ("lease_lost", LeaseLost.exit_code), a_err
    fence_a = next(e["fence"] for e in events(a_err) if e.get("event") == "acquired")
    fence_b = next(e["fence"] for e in events(b.stderr) if e.get("event") == "acquired")
    assert fence_b > fence_a
    state = cast(dict[str, str], r.hgetall("cron-runner:{default:stale}:state"))
    assert (state["last_outcome"], state["last_holder"]) == ("ran", "pod-b")
    assert int(state["last_fence"]) == fence_b
    assert "last_failure_at" not in state
    assert any(e.get("event") == "state_kept" for e in events(a_err)), a_err
    # The history still has both runs: A's loss is recorded, not hidden.
    runs = [fields["outcome"] for _, fields in r.xrange("cron-runner:{default:stale}:runs")]  # type: ignore[union-attr]
    assert runs == ["ran", "lease_lost"]
