"""A hard-killed holder's slot is not lost (issue 11, item 9). Pod A holds the slot's lease and
is ``kill -9``ed mid-run; B and C, the same slot's pods in other clusters, started with A; the
Job's retry comes 10 s later with the same Job name. None of them may report success while the
slot is neither done nor running: the slot runs exactly once more, and its marker exists."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import cast

from runner.errors import LeaseLost, Terminated
from runner.testing import RedisServer
from tests.fault.common import assert_clean, event_time
from tests.fault.conftest import Figure
from tests.helpers.proc import (
    LoggedRun,
    events,
    outcome,
    runner_env,
    side_effects,
    spawn,
    spawn_started,
)
from tests.helpers.ticker import children
from tests.helpers.wait import wait_for

TTL_S = 12


def _env(redis_server: RedisServer, effects: Path) -> dict[str, str]:
    minutes = int(time.time() // 60) - 1
    return runner_env(
        redis_server.url,
        CRON_RUNNER_JOB_NAME=f"report-{minutes}",
        CRON_RUNNER_LEASE_TTL=f"{TTL_S}s",
        SIDE_EFFECTS=str(effects),
    )


def _task(effects: Path, seconds: float) -> list[str]:
    return ["sh", "-c", f"echo start >> {effects}; sleep {seconds}; echo ran >> {effects}"]


def _exec(holder: str, effects: Path, seconds: float = 2) -> list[str]:
    return ["exec", "--name", "report", "--holder", holder, "--", *_task(effects, seconds)]


def test_a_kill9ed_holders_slot_runs_exactly_once_more_and_is_marked(
    redis_server: RedisServer, tmp_path: Path, figure: Figure
) -> None:
    effects = tmp_path / "effects"
    env = _env(redis_server, effects)
    slot = int(env["CRON_RUNNER_JOB_NAME"].rsplit("-", 1)[1]) * 60
    started = time.monotonic()
    a = spawn_started(_exec("pod-a", effects), env, effects, what="A's task to start")
    logs = {name: tmp_path / f"{name}.log" for name in ("pod-b", "pod-c", "pod-a-retry")}
    others = {name: LoggedRun(_exec(name, effects), env, logs[name]) for name in ("pod-b", "pod-c")}
    # B and C started with A: both wait on its lease before it dies.
    wait_for(lambda: all(p.logged("waiting") for p in others.values()), what="B and C to wait")
    os.kill(a.pid, signal.SIGKILL)  # a node crash: no release, no record
    killed_at = time.time()
    a.communicate(timeout=10)
    # The Job's retry, 10 s after the first pod started (the scenario, not a synchronisation).
    time.sleep(max(0.0, started + 10 - time.monotonic()))
    others["pod-a-retry"] = LoggedRun(_exec("pod-a-retry", effects), env, logs["pod-a-retry"])

    results = {name: ("", p.finish(60), p.returncode)
               for name, p in others.items()}  # fmt: skip
    for _, stderr, _ in results.values():
        assert_clean(stderr)
    outcomes = {name: str(outcome(stderr)) for name, (_, stderr, _) in results.items()}
    codes = {name: code for name, (_, _, code) in results.items()}
    # Exactly one more run of the slot, by one of those who waited; the others saw it done.
    assert sorted(outcomes.values()) == ["ran", "skipped_done", "skipped_done"], results
    assert set(codes.values()) == {0}, results
    assert side_effects(effects, "start") == ["start", "start"]
    assert side_effects(effects, "ran") == ["ran"]
    (taker,) = [name for name, got in outcomes.items() if got == "ran"]
    marker = cast(
        dict[str, str], redis_server.client().hgetall(f"cron-runner:{{default:report}}:slot:{slot}")
    )
    assert marker["holder"] == taker
    waited = [n for n, (_, err, _) in results.items() if any(
        e.get("event") == "waiting" for e in events(err))]  # fmt: skip
    assert sorted(waited) == sorted(results)
    takeover_s = round(event_time(results[taker][1], "acquired") - killed_at, 2)
    # Never before the dead holder's lease expired (its TTL after its last renewal or start).
    assert takeover_s > TTL_S - 3
    figure("1c", duplicates=0, overlap_ms=0, taken_over_by=taker,
           kill_to_new_run_s=takeover_s, ttl_s=TTL_S, outcomes=outcomes, exit_codes=codes)  # fmt: skip


def test_a_retry_of_a_slot_that_finished_is_skipped_done_at_once(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    env = {**_env(redis_server, effects), "CRON_RUNNER_LEASE_TTL": "3s"}
    a = spawn_started(_exec("pod-a", effects, seconds=2.5), env, effects, what="A's task to start")
    # B, of the same slot while A runs and renews (every second): it skips without failing.
    b = spawn(_exec("pod-b", effects), env)
    _, b_err = b.communicate(timeout=30)
    _, a_err = a.communicate(timeout=30)
    assert (outcome(a_err), a.returncode) == ("ran", 0), a_err
    assert (outcome(b_err), b.returncode) == ("skipped_held", 0), b_err
    assert any(e.get("event") == "waiting" for e in events(b_err))
    retry = spawn(_exec("pod-a-retry", effects), env)
    _, retry_err = retry.communicate(timeout=30)
    assert (outcome(retry_err), retry.returncode) == ("skipped_done", 0), retry_err
    assert not any(e.get("event") == "waiting" for e in events(retry_err))
    assert side_effects(effects, "ran") == ["ran"]


def test_a_holder_neither_renewing_nor_gone_within_the_wait_is_not_reported_done(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A frozen holder (SIGSTOP) of the slot: B's wait (CRON_RUNNER_HELD_WAIT) ends before the
    holder renews or its lease expires, so B neither runs nor exits 0; C, stopped by SIGTERM
    while it waits, exits at once, having taken nothing."""
    effects = tmp_path / "effects"
    env = _env(redis_server, effects)
    a = spawn_started(
        _exec("pod-a", effects, seconds=30),
        env,
        effects,
        what="A's task to start",
        start_new_session=True,
    )
    os.killpg(a.pid, signal.SIGSTOP)  # the runner; its command has a process group of its own
    try:
        b = spawn(_exec("pod-b", effects), {**env, "CRON_RUNNER_HELD_WAIT": "1s"})
        _, b_err = b.communicate(timeout=30)
        assert_clean(b_err)
        assert (outcome(b_err), b.returncode) == ("skipped_held", LeaseLost.exit_code), b_err
        c_log = tmp_path / "c.log"
        c = LoggedRun(_exec("pod-c", effects), env, c_log)
        wait_for(lambda: c.logged("waiting"), what="C to wait")
        c.send_signal(signal.SIGTERM)
        c_err = c.finish(10)
        assert_clean(c_err)
        assert (outcome(c_err), c.returncode) == ("terminated", Terminated.exit_code), c_err
    finally:
        for group in (*children(a.pid), a.pid):  # the command runs in a process group of its own
            with contextlib.suppress(ProcessLookupError):  # a child that leads no group
                os.killpg(group, signal.SIGKILL)
        a.communicate(timeout=10)
    assert side_effects(effects, "start") == ["start"]
    assert side_effects(effects, "ran") == []
