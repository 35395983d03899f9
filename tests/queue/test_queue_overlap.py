"""Queue mode under the task's lease (issue 17, item 5), with real worker processes on a real
Redis: a worker takes the lease around each job of a slot, so the overlap policy holds
between jobs as between runs; a message delivered again runs under a new fencing token; the
lease is renewed for a job longer than its TTL; a done slot and a paused task are not run.

Slots are sent as an enqueueing run sends them (tests.queue.helpers.send_slot), so that two
can wait on the queue at once, as when the workers were busy or down when the CronJobs fired.
"""

from __future__ import annotations

import time
from typing import Any, cast

import redis

from runner.keys import TaskKeys
from runner.queue.jobs import JobKeys
from runner.testing import RedisServer
from tests.helpers.proc import outcome
from tests.helpers.wait import wait_for
from tests.queue.helpers import (
    WorkerProc,
    cli,
    effects,
    history,
    queue_env,
    send_slot,
    start_worker,
    stats,
    unacked,
)
from tests.queue.queue_tasks import RELEASE

TASK = "q-slot"
KEYS = TaskKeys("cron-runner", "default", TASK)
# Two slots an hour ago, a minute apart.
SLOT = (int(time.time()) // 60) * 60 - 3600
NEXT = SLOT + 60


def runs(r: redis.Redis, task: str = TASK) -> list[dict[str, str]]:
    """The task's run stream, oldest first: what `history` lists."""
    entries = cast(
        list[tuple[str, dict[str, str]]], r.xrange(TaskKeys("cron-runner", "default", task).runs)
    )
    return [fields for _, fields in entries]


def recorded(r: redis.Redis, slot: int) -> list[str]:
    return [f["outcome"] for f in runs(r) if f.get("slot") == str(slot)]


def of_slot(r: redis.Redis, what: str, slot: int) -> list[dict[str, Any]]:
    return [e for e in effects(r, what) if e["slot"] == slot]


def drained(r: redis.Redis) -> bool:
    row = stats(r, TASK)
    return (row.ready, row.in_flight, row.delayed, row.dead) == (0, 0, 0, 0) and unacked(r) == 0


def test_two_slots_of_a_3_second_task_no_longer_run_at_once_on_one_worker(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    # The issue's report: both slots' messages waited, and one worker ran them side by side.
    # Under the default policy (skip) one runs, the other is acknowledged and recorded.
    send_slot(r, TASK, SLOT)
    send_slot(r, TASK, NEXT)
    start_worker(workers, queue_env(redis_server), "--threads", "8")
    wait_for(lambda: len(runs(r)) == 2, 30, "one slot run and one skipped")
    wait_for(lambda: drained(r), 20, "the queue to drain")
    (started,) = effects(r, "start")
    assert len(effects(r, "ran")) == 1
    skipped = NEXT if started["slot"] == SLOT else SLOT
    assert recorded(r, started["slot"]) == ["ran"]
    assert recorded(r, skipped) == ["skipped_held"]
    assert not of_slot(r, "start", skipped)


def test_skip_the_second_slot_is_skipped_once_and_recorded(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    env = queue_env(redis_server)
    w = start_worker(workers, env, "--threads", "4")
    send_slot(r, TASK, SLOT, payload={"seconds": 60})
    wait_for(lambda: effects(r, "start"), 20, "the first slot to start")
    second = send_slot(r, TASK, NEXT)
    # Delivered twice (a worker died, say): still one record for the slot, and no run.
    send_slot(r, TASK, NEXT)
    wait_for(lambda: len(w.events("finished")) == 2, 20, "both copies of the second slot")
    assert [e["outcome"] for e in w.events("finished")] == ["skipped_held"] * 2
    assert second in {e["message_id"] for e in w.events("finished")}
    r.set(RELEASE, "1")
    wait_for(lambda: effects(r, "ran"), 20, "the first slot to finish")
    wait_for(lambda: drained(r), 20, "the queue to drain")
    assert [e["slot"] for e in effects(r, "start")] == [SLOT]
    assert recorded(r, NEXT) == ["skipped_held"]
    assert r.hget(JobKeys("cron-runner", "default", TASK).slot(NEXT), "skips") == "2"
    # `history` shows it, with why.
    (skip,) = [run for run in history(env, TASK) if run["slot"] == NEXT]
    assert skip["outcome"] == "skipped_held"
    assert f"/{SLOT}" not in skip["error"] and f"the slot {SLOT}" in skip["error"]


def test_buffer_one_the_second_runs_right_after_the_first_and_a_third_replaces_it(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    options = {"overlap": "buffer-one"}
    start_worker(workers, queue_env(redis_server), "--threads", "4")
    send_slot(r, TASK, SLOT, payload={"seconds": 3}, options=options)
    wait_for(lambda: effects(r, "start"), 20, "the first slot to start")
    send_slot(r, TASK, NEXT, payload={"seconds": 0.5}, options=options)
    wait_for(lambda: r.get(KEYS.buffer) == str(NEXT), 10, "the second slot to wait")
    # BUFFER_ONE: at most one waits, a later one takes its place.
    third = NEXT + 60
    send_slot(r, TASK, third, payload={"seconds": 0.5}, options=options)
    wait_for(lambda: len(of_slot(r, "ran", third)) == 1, 30, "the third slot to run")
    wait_for(lambda: drained(r), 20, "the queue to drain")
    (first_ran,) = of_slot(r, "ran", SLOT)
    (third_start,) = of_slot(r, "start", third)
    assert third_start["at"] >= first_ran["at"]
    assert third_start["fence"] > first_ran["fence"]
    assert not of_slot(r, "start", NEXT)
    assert recorded(r, NEXT) == ["skipped_held"]
    assert "superseded" in next(f["error"] for f in runs(r) if f["slot"] == str(NEXT))
    assert (recorded(r, SLOT), recorded(r, third)) == (["ran"], ["ran"])


def test_buffer_one_gives_up_after_the_overlap_wait(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    options = {"overlap": "buffer-one", "overlap_wait": 1000}
    w = start_worker(workers, queue_env(redis_server), "--threads", "4")
    send_slot(r, TASK, SLOT, payload={"seconds": 60}, options=options)
    wait_for(lambda: effects(r, "start"), 20, "the first slot to start")
    send_slot(r, TASK, NEXT, options=options)
    wait_for(lambda: recorded(r, NEXT), 20, "the second slot to give up")
    assert recorded(r, NEXT) == ["skipped_held"]
    assert "past the overlap wait" in next(f["error"] for f in runs(r) if f["slot"] == str(NEXT))
    r.set(RELEASE, "1")
    wait_for(lambda: drained(r), 20, "the queue to drain")
    assert [e["slot"] for e in effects(r, "start")] == [SLOT]
    assert [e["outcome"] for e in w.events("finished")] == ["skipped_held", "ran"]


def test_allow_other_slots_runs_them_side_by_side_and_one_slot_once(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    options = {"overlap": "allow-other-slots"}
    w = start_worker(workers, queue_env(redis_server), "--threads", "4")
    send_slot(r, TASK, SLOT, payload={"seconds": 2}, options=options)
    send_slot(r, TASK, NEXT, payload={"seconds": 2}, options=options)
    wait_for(lambda: len(effects(r, "start")) == 2, 20, "both slots to start")
    # The same slot again while it runs: it waits for it, then finds it done.
    send_slot(r, TASK, SLOT, options=options)
    wait_for(lambda: len(w.events("finished")) == 3, 30, "both slots and the copy")
    wait_for(lambda: drained(r), 20, "the queue to drain")
    starts = {e["slot"]: e for e in effects(r, "start")}
    ran = {e["slot"]: e for e in effects(r, "ran")}
    assert set(starts) == set(ran) == {SLOT, NEXT}
    assert starts[NEXT]["at"] < ran[SLOT]["at"] and starts[SLOT]["at"] < ran[NEXT]["at"]
    assert starts[NEXT]["fence"] != starts[SLOT]["fence"]
    assert sorted(e["outcome"] for e in w.events("finished")) == ["ran", "ran", "skipped_done"]
    assert (recorded(r, SLOT), recorded(r, NEXT)) == (["ran"], ["ran"])
    # Each slot's lease is gone, and so is the task's, which showed one of them running.
    assert not r.exists(KEYS.slot_lease(SLOT), KEYS.slot_lease(NEXT), KEYS.lease)


def test_replace_stops_the_running_job_before_the_next_one_starts(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    options = {"overlap": "replace"}
    env = queue_env(redis_server)
    w = start_worker(workers, env, "--threads", "4")
    send_slot(r, TASK, SLOT, payload={"seconds": 60}, options=options)
    wait_for(lambda: effects(r, "start"), 20, "the first slot to start")
    send_slot(r, TASK, NEXT, payload={"seconds": 0.2}, options=options)
    wait_for(lambda: of_slot(r, "ran", NEXT), 30, "the second slot to run")
    wait_for(lambda: drained(r), 20, "the queue to drain")
    (stopped,) = effects(r, "stopped")
    (second,) = of_slot(r, "start", NEXT)
    assert stopped["slot"] == SLOT and "replaced" in stopped["reason"]
    assert stopped["at"] <= second["at"], "the old job stopped before the new one started"
    assert second["fence"] > stopped["fence"]
    assert (recorded(r, SLOT), recorded(r, NEXT)) == (["replaced"], ["ran"])
    (replaced,) = [run for run in history(env, TASK) if run["slot"] == SLOT]
    assert replaced["exit_code"] == 79
    # Not retried: a replaced slot is done (its marker says so), and nothing is dead.
    assert len(of_slot(r, "start", SLOT)) == 1
    assert [e["outcome"] for e in w.events("finished")] == ["replaced", "ran"]
    assert w.events("preempted")


def test_a_message_delivered_again_after_kill_9_runs_under_a_higher_fence(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    env = queue_env(redis_server, CRON_RUNNER_LEASE_TTL="2s")
    first = start_worker(workers, env, "--threads", "1")
    send_slot(r, TASK, SLOT, payload={"seconds": 60})
    wait_for(lambda: effects(r, "start"), 20, "the job to start")
    first.kill_group()
    first.wait(10)
    # Dramatiq delivers it again once the dead worker's heartbeat is 2 s old; the new worker
    # waits for the dead one's lease to expire, then takes it with a new fencing token.
    start_worker(workers, env, "--threads", "1")
    wait_for(lambda: len(effects(r, "start")) == 2, 60, "the job to run again")
    r.set(RELEASE, "1")
    wait_for(lambda: effects(r, "ran"), 20, "the job to finish")
    wait_for(lambda: drained(r), 20, "the queue to drain")
    before, after = effects(r, "start")
    assert (before["holder"], after["holder"]) == ("w0", "w1")
    assert after["fence"] > before["fence"]
    (ran,) = effects(r, "ran")
    assert ran["fence"] == after["fence"]
    # The killed attempt too, recorded by the next one from the trace it left.
    assert recorded(r, SLOT) == ["lease_lost", "ran"]


def test_the_lease_is_renewed_for_a_job_longer_than_its_ttl(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    # 2 s, not the minimum of 1 s: on a loaded 2-core machine a renewal can be late by more
    # than a third of a second, which is all a 1 s lease leaves before it is declared lost.
    env = queue_env(redis_server, CRON_RUNNER_LEASE_TTL="2s")
    w = start_worker(workers, env)
    send_slot(r, TASK, SLOT, payload={"seconds": 5})
    wait_for(lambda: effects(r, "start"), 20, "the job to start")
    (started,) = effects(r, "start")
    time.sleep(2.5)  # past the TTL: only renewals keep it
    token = cast(str | None, r.get(KEYS.lease))
    assert token is not None and token.startswith("w0:") and token.endswith(f"/{SLOT}")
    wait_for(lambda: effects(r, "ran"), 20, "the job to finish")
    wait_for(lambda: drained(r), 20, "the queue to drain")
    (ran,) = effects(r, "ran")
    assert ran["at"] - started["at"] >= 4.9
    assert recorded(r, SLOT) == ["ran"]
    assert not r.exists(KEYS.lease)
    assert [e["outcome"] for e in w.events("finished")] == ["ran"]
    assert not w.events("lease_lost")
    state = cast(dict[str, str], r.hgetall(KEYS.state))
    assert (state["last_outcome"], state["last_fence"]) == ("ran", str(ran["fence"]))


def test_a_done_slot_is_acknowledged_without_running(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    w = start_worker(workers, queue_env(redis_server))
    send_slot(r, TASK, SLOT, payload={"seconds": 0.1})
    wait_for(lambda: effects(r, "ran"), 20, "the job to run")
    again = send_slot(r, TASK, SLOT, payload={"seconds": 0.1})
    wait_for(lambda: len(w.events("finished")) == 2, 20, "the copy to be acknowledged")
    wait_for(lambda: drained(r), 20, "the queue to drain")
    assert len(effects(r, "start")) == 1
    done = w.events("finished")[1]
    assert (done["outcome"], done["message_id"]) == ("skipped_done", again)
    assert recorded(r, SLOT) == ["ran"]


def test_a_paused_tasks_jobs_are_not_run_and_are_recorded(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    # As `cron-runner pause q-slot --note ...` leaves the task's meta hash.
    r.hset(KEYS.meta, mapping={"paused": "1", "paused_note": "vendor down", "paused_by": "ops",
                               "paused_at": f"{time.time():.3f}", "paused_until": "",
                               "protocol_min_before_pause": "1", "protocol_min": "3"})  # fmt: skip
    env = queue_env(redis_server)
    w = start_worker(workers, env)
    paused = send_slot(r, TASK, SLOT)
    wait_for(lambda: w.events("finished"), 20, "the job to be handled")
    wait_for(lambda: drained(r), 20, "the queue to drain")
    (done,) = w.events("finished")
    assert (done["outcome"], done["message_id"]) == ("paused", paused)
    assert "vendor down" in done["msg"]
    assert not effects(r, "start")
    assert recorded(r, SLOT) == ["paused"]
    assert stats(r, TASK).dead == 0
    # Resumed: the next slot runs.
    r.hdel(KEYS.meta, "paused", "paused_note", "paused_by", "paused_at", "paused_until")
    send_slot(r, TASK, NEXT, payload={"seconds": 0.1})
    wait_for(lambda: effects(r, "ran"), 20, "the next slot to run")
    assert [e["slot"] for e in effects(r, "ran")] == [NEXT]


def test_pause_on_failures_counts_the_jobs_failures_and_holds_back_the_retry(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    # q-doomed always fails, with 2 retries; the CronJob's CRON_RUNNER_PAUSE_ON_FAILURES=2
    # rides in the message. Its second failure pauses the task, and the retry that follows is
    # recorded as paused and acknowledged, not run and not dead-lettered.
    doomed = TaskKeys("cron-runner", "default", "q-doomed")
    w = start_worker(workers, queue_env(redis_server))
    send_slot(r, "q-doomed", SLOT, options={"pause_on_failures": 2})
    wait_for(lambda: len(runs(r, "q-doomed")) == 3, 30, "two failures and the paused retry")
    wait_for(lambda: stats(r, "q-doomed").in_flight == 0 and unacked(r) == 0, 20, "the ack")
    assert [f["outcome"] for f in runs(r, "q-doomed")] == ["failed", "failed", "paused"]
    assert len(effects(r, "attempt")) == 2
    assert r.hget(doomed.meta, "paused") == "1"
    assert "2 consecutive failures" in cast(str, r.hget(doomed.meta, "paused_note"))
    assert stats(r, "q-doomed").dead == 0
    assert w.events("paused")


def test_the_enqueueing_cronjob_sends_its_overlap_policy_and_the_worker_holds_it(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    # CRON_RUNNER_OVERLAP reaches the message, as the chart's per-task queue options do; two
    # enqueue runs, for two slots, before any worker runs: under allow-other-slots both run.
    minutes = int(time.time() // 60)
    for m in (minutes - 2, minutes - 1):
        env = queue_env(redis_server, CRON_RUNNER_MODE="enqueue",
                        CRON_RUNNER_JOB_NAME=f"slots-{m}", CRON_RUNNER_CRONJOB_NAME="slots",
                        CRON_RUNNER_OVERLAP="allow-other-slots")  # fmt: skip
        done = cli(env, "run", TASK, "--name", "slots")
        assert (done.returncode, outcome(done.stderr)) == (0, "enqueued"), done.stderr
    start_worker(workers, queue_env(redis_server), "--threads", "4")
    wait_for(lambda: len(effects(r, "ran")) == 2, 30, "both slots to run")
    starts = sorted(effects(r, "start"), key=lambda e: e["slot"])
    ran = sorted(effects(r, "ran"), key=lambda e: e["slot"])
    assert [e["task"] for e in starts] == ["slots", "slots"]
    assert starts[1]["at"] < ran[0]["at"], "side by side"
    # The job's records go where the run's name put the enqueue's: `history slots`. A task's
    # effect is written before its worker records the job, so wait for the records.
    wait_for(lambda: len(runs(r, "slots")) == 4, 30, "both jobs recorded")
    assert [f["outcome"] for f in runs(r, "slots")] == ["enqueued", "enqueued", "ran", "ran"]

    bad = cli({**queue_env(redis_server, CRON_RUNNER_MODE="enqueue"),
               "CRON_RUNNER_OVERLAP": "sometimes"}, "run", TASK)  # fmt: skip
    assert (bad.returncode, "Traceback" in bad.stderr) == (78, False), bad.stderr
    assert "CRON_RUNNER_OVERLAP='sometimes' is not valid: expected one of skip" in bad.stderr
