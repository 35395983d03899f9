"""Queue mode against a real Redis with real worker processes (issue 8, seed 001).

Enqueue: one message per slot however many CronJob pods start, none for a retried Job.
Workers: retries with growing, jittered backoff; the dead-letter queue after the last retry,
and `dlq retry` runs it again; a graceful stop finishes or puts back the running job.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import pytest
import redis

from runner.config.queue import QueueSettings
from runner.config.settings import load_settings
from runner.errors import ConfigError, UnknownTask
from runner.keys import TaskKeys
from runner.queue.messages import make_broker, message_id_for
from runner.queue.producer import Producer
from runner.testing import RedisServer, free_port
from tests.helpers.proc import events, outcome, runner_env
from tests.helpers.wait import wait_for
from tests.queue.helpers import (
    NAMESPACE,
    TASK_MODULES,
    WorkerProc,
    cli,
    effects,
    producer,
    queue_env,
    start_worker,
    stats,
    unacked,
)
from tests.queue.queue_tasks import RELEASE

# --- enqueue: exactly one message per slot ---------------------------------------------------


def test_ten_enqueue_replicas_send_one_message_and_a_retried_job_none(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    minutes = int(time.time() // 60)
    slot = minutes * 60
    env = queue_env(
        redis_server,
        CRON_RUNNER_MODE="enqueue",
        CRON_RUNNER_JOB_NAME=f"nightly-{minutes}",
        CRON_RUNNER_CRONJOB_NAME="nightly",
    )

    def pod(i: int) -> tuple[int, str]:
        done = cli(env, "run", "q-ok", "--holder", f"pod-{i}")
        return done.returncode, done.stderr

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(pod, range(10)))
    assert [code for code, _ in results] == [0] * 10, [e for _, e in results][:2]
    outcomes = sorted(outcome(err) or "none" for _, err in results)
    assert outcomes.count("enqueued") == 1, outcomes
    assert set(outcomes) <= {"enqueued", "skipped_held", "skipped_done"}
    assert stats(r, "q-ok").ready == 1

    # The pod that enqueued names the message; its id is task + slot.
    (sent,) = [e for _, err in results for e in events(err) if e.get("event") == "enqueued"]
    assert sent["message_id"] == message_id_for("default", "q-ok", slot, sent["fence"])
    assert sent["queue"] == "q-ok"

    # A retried Job of the same slot finds the slot done.
    retried = cli(env, "run", "q-ok", "--holder", "pod-retry")
    assert (retried.returncode, outcome(retried.stderr)) == (0, "skipped_done")

    # A Job that sent the message and died before writing the slot marker: its retry takes
    # the lease again, finds the message already sent, and does not send it twice.
    r.delete(TaskKeys("cron-runner", "default", "q-ok").slot(slot))
    crashed = cli(env, "run", "q-ok", "--holder", "pod-after-crash")
    assert (crashed.returncode, outcome(crashed.stderr)) == (0, "enqueued")
    (again,) = [e for e in events(crashed.stderr) if e.get("event") == "enqueued"]
    assert "already enqueued" in again["msg"]
    assert again["message_id"] == sent["message_id"]
    assert stats(r, "q-ok").ready == 1

    # The worker runs it once, with the slot, under the task's lease: a fencing token of its
    # own, above the enqueue's.
    start_worker(workers, queue_env(redis_server))
    wait_for(lambda: effects(r, "ran"), 20, "the job to run")
    # Done with it: the worker has written the run's state and acknowledged the message.
    state_key = TaskKeys("cron-runner", "default", "q-ok").state
    wait_for(lambda: r.hget(state_key, "last_outcome") == "ran", 20, "the run's state")
    wait_for(lambda: stats(r, "q-ok").in_flight == 0, 20, "the message to be acknowledged")
    (ran,) = effects(r, "ran")
    assert (ran["slot"], ran["holder"]) == (slot, "w0")
    assert ran["fence"] > sent["fence"]
    assert stats(r, "q-ok") == stats(r, "q-ok").__class__("q-ok", 0, 0, 0, 0)
    state = cast(dict[str, str], r.hgetall(state_key))
    assert state["last_outcome"] == "ran"
    assert state["last_enqueued_slot"] == str(slot)
    assert state["last_success_slot"] == str(slot)


def test_enqueue_mode_refuses_a_command_and_cluster(redis_server: RedisServer) -> None:
    env = queue_env(redis_server, CRON_RUNNER_MODE="enqueue")
    done = cli(env, "exec", "--name", "x", "--", "true")
    assert done.returncode == 78
    assert "needs a registered task" in done.stderr
    done = cli({**env, "CRON_RUNNER_REDIS_CLUSTER": "true"}, "worker")
    assert done.returncode == 78
    assert "does not support Redis Cluster" in done.stderr
    done = cli(env, "run", "tests.queue.queue_tasks:ok")
    assert done.returncode == 78
    assert "needs a registered task, not the reference 'tests.queue.queue_tasks:ok'" in done.stderr


# --- retries, backoff and the dead-letter queue -----------------------------------------------


def test_retries_back_off_with_growing_jittered_delays_within_bounds(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    # q-flaky: retries=3, min_backoff=300ms, max_backoff=5s; fails twice, then succeeds.
    p = producer(redis_server)
    ids = [p.send("q-flaky", {"id": n}) for n in range(4)]
    p.close()
    w = start_worker(workers, queue_env(redis_server), "--threads", "4")
    wait_for(lambda: len(effects(r, "ran")) == 4, 60, "four flaky jobs to succeed")

    retries = w.events("retry_scheduled")
    by_message = {i: [e["delay_ms"] for e in retries if e["message_id"] == i] for i in ids}
    assert all(len(delays) == 2 for delays in by_message.values()), by_message
    for first, second in by_message.values():
        # Dramatiq: min_backoff * 2**retry, stretched by a random factor in [1, 2).
        assert 300 <= first <= 600
        assert 600 <= second <= 1200
        assert first <= second <= 5000
    every = [d for pair in by_message.values() for d in pair]
    assert len(set(every)) > 2, f"no jitter: {every}"
    assert statistics.mean(p[1] for p in by_message.values()) > statistics.mean(
        p[0] for p in by_message.values()
    )

    # No attempt ran before its backoff was over.
    attempts = effects(r, "attempt")
    for n in range(4):
        times = sorted(a["at"] for a in attempts if a["payload"]["id"] == n)
        assert len(times) == 3
        delays = by_message[ids[n]]
        assert times[1] - times[0] >= delays[0] / 1000 - 0.05
        assert times[2] - times[1] >= delays[1] / 1000 - 0.05
    assert stats(r, "q-flaky").dead == 0


def test_always_failing_job_lands_in_the_dlq_and_dlq_retry_runs_it(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    env = queue_env(redis_server)
    p = producer(redis_server)
    doomed_id = p.send("q-doomed", {"invoice": 42})
    p.close()
    w = start_worker(workers, env)
    wait_for(lambda: stats(r, "q-doomed").dead == 1, 30, "the job to be dead-lettered")
    # retries=2: the first attempt and two retries.
    assert len(effects(r, "attempt")) == 3
    assert not effects(r, "ran")
    assert [e["message_id"] for e in w.events("dead_lettered")] == [doomed_id]

    listed = cli(env, "dlq", "list", "q-doomed")
    assert listed.returncode == 0, listed.stderr
    assert doomed_id in listed.stdout
    assert "ValueError: doomed: the dependency is still broken" in listed.stdout
    row = next(line for line in listed.stdout.splitlines() if doomed_id in line)
    assert row.split()[2] == "3"  # attempts: the first run and two retries

    shown = cli(env, "dlq", "show", "q-doomed", doomed_id)
    assert shown.returncode == 0, shown.stderr
    assert '"invoice": 42' in shown.stdout
    assert "Traceback" in shown.stdout

    refused = cli(env, "dlq", "retry", "q-doomed")
    assert refused.returncode == 78
    assert "--all" in refused.stderr

    r.set("test:doomed:fixed", "1")
    retried = cli(env, "dlq", "retry", "q-doomed", "--all")
    assert retried.returncode == 0, retried.stderr
    assert doomed_id in retried.stdout
    wait_for(lambda: effects(r, "ran"), 30, "the retried job to run")
    assert stats(r, "q-doomed").dead == 0
    (ran,) = effects(r, "ran")
    assert ran["payload"] == {"invoice": 42}
    assert "no dead letters" in cli(env, "dlq", "list", "q-doomed").stdout


def test_dlq_purge(redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]) -> None:
    env = queue_env(redis_server)
    p = producer(redis_server)
    first, second = p.send("q-doomed", {"n": 1}), p.send("q-doomed", {"n": 2})
    p.close()
    start_worker(workers, env, "--threads", "2")
    wait_for(lambda: stats(r, "q-doomed").dead == 2, 30, "both jobs to be dead-lettered")
    purged = cli(env, "dlq", "purge", "q-doomed", first)
    assert (purged.returncode, purged.stdout.split()[-1]) == (0, "1"), purged.stderr
    listed = cli(env, "dlq", "list", "q-doomed").stdout
    assert first not in listed and second in listed
    assert cli(env, "dlq", "purge", "q-doomed", "--all").returncode == 0
    assert stats(r, "q-doomed").dead == 0
    missing = cli(env, "dlq", "show", "q-doomed", first)
    assert missing.returncode == 78
    assert "no dead letter" in missing.stderr


def test_the_cronjobs_queue_retries_and_time_limit_win_over_the_tasks(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    # The chart's per-task queue, retries and timeLimit reach the enqueueing pod as
    # CRON_RUNNER_*; the message carries them and the worker applies them over @task's.
    base = queue_env(redis_server, CRON_RUNNER_MODE="enqueue")
    doomed = cli({**base, "CRON_RUNNER_QUEUE": "urgent", "CRON_RUNNER_RETRIES_MAX": "1",
                  "CRON_RUNNER_RETRIES_MIN_BACKOFF": "50ms",
                  "CRON_RUNNER_RETRIES_MAX_BACKOFF": "100ms"}, "run", "q-doomed")  # fmt: skip
    assert (doomed.returncode, outcome(doomed.stderr)) == (0, "enqueued"), doomed.stderr
    (sent,) = [e for e in events(doomed.stderr) if e.get("event") == "enqueued"]
    assert sent["queue"] == "urgent"
    stuck = cli({**base, "CRON_RUNNER_TIME_LIMIT": "300ms", "CRON_RUNNER_RETRIES_MAX": "0"},
                "run", "q-stubborn")  # fmt: skip
    assert (stuck.returncode, outcome(stuck.stderr)) == (0, "enqueued"), stuck.stderr
    assert (stats(r, "urgent").ready, stats(r, "q-doomed").ready) == (1, 0)

    w = start_worker(workers, queue_env(redis_server), "--queues", "urgent", "q-stubborn")
    wait_for(lambda: stats(r, "urgent").dead == 1, 30, "q-doomed to be dead-lettered")
    # @task says retries=2 (three attempts); the CronJob said 1: the first run and one retry.
    assert len(effects(r, "attempt")) == 2
    (delay,) = [e["delay_ms"] for e in w.events("retry_scheduled")]
    assert 50 <= delay <= 100
    listed = cli(queue_env(redis_server), "dlq", "list", "q-doomed", "--queue", "urgent")
    row = next(line for line in listed.stdout.splitlines() if sent["message_id"] in line)
    assert row.split()[2] == "2"

    # q-stubborn has no time limit of its own and works until released; the CronJob gave it
    # 300ms, and no retry.
    wait_for(lambda: stats(r, "q-stubborn").dead == 1, 30, "q-stubborn to be stopped")
    assert [e["task"] for e in effects(r, "start")] == ["q-stubborn"]
    assert not effects(r, "ran")
    listed = cli(queue_env(redis_server), "dlq", "list", "q-stubborn")
    assert "TimeLimitExceeded" in listed.stdout


def test_the_cronjobs_queue_settings_are_checked_before_the_lease(
    redis_server: RedisServer,
) -> None:
    env = queue_env(redis_server, CRON_RUNNER_MODE="enqueue")
    for extra, says in [
        ({"CRON_RUNNER_RETRIES_MAX": "-1"}, "CRON_RUNNER_RETRIES_MAX='-1' is not valid"),
        ({"CRON_RUNNER_QUEUE": "9lives"}, "CRON_RUNNER_QUEUE='9lives' is not a queue name"),
        ({"CRON_RUNNER_TIME_LIMIT": "soon"}, "CRON_RUNNER_TIME_LIMIT='soon' is not a duration"),
        # q-flaky's own max_backoff is 5s: a minimum above it alone would be capped silently.
        ({"CRON_RUNNER_RETRIES_MIN_BACKOFF": "1m"}, "minimum retry backoff (60s) is above"),
    ]:
        done = cli({**env, **extra}, "run", "q-flaky")
        assert (done.returncode, "Traceback" in done.stderr) == (78, False), done.stderr
        assert says in done.stderr
        assert not events(done.stderr) or outcome(done.stderr) is None


# --- graceful stop -------------------------------------------------------------------------


def test_sigterm_lets_the_running_job_finish(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    env = queue_env(redis_server, CRON_RUNNER_SHUTDOWN_GRACE="10s")
    p = producer(redis_server)
    p.send("q-sleep", {"seconds": 1.5})
    p.close()
    w = start_worker(workers, env)
    wait_for(lambda: effects(r, "start"), 20, "the job to start")
    w.terminate()
    assert w.wait(30) == 0
    assert len(effects(r, "ran")) == 1
    assert stats(r, "q-sleep") == stats(r, "q-sleep").__class__("q-sleep", 0, 0, 0, 0)
    assert unacked(r) == 0
    # Neither the sender nor the stopped worker is left to look like a dead worker.
    assert r.zcard(f"{NAMESPACE}:__heartbeats__") == 0


@pytest.mark.parametrize("task", ["q-careful", "q-stubborn"])
def test_sigterm_puts_back_a_job_that_cannot_finish_in_the_grace(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc], task: str
) -> None:
    # q-careful stops at ctx.check() when the grace nears its end; q-stubborn never checks
    # and is put back when the grace is over. Either way the job runs again elsewhere.
    env = queue_env(redis_server, CRON_RUNNER_SHUTDOWN_GRACE="2s")
    p = producer(redis_server)
    job_id = p.send(task, {"seconds": 60})
    p.close()
    w = start_worker(workers, env)
    wait_for(lambda: effects(r, "start"), 20, "the job to start")
    stopped_at = time.monotonic()
    w.terminate()
    assert w.wait(30) == 143
    assert time.monotonic() - stopped_at < 2 + 3, "the worker overran its grace"
    assert not effects(r, "ran")
    assert stats(r, task).ready == 1, "the job is back on its queue"
    assert unacked(r) == 0
    if task == "q-careful":
        (stopped,) = w.events("finished")
        assert stopped["outcome"] == "requeued"
    else:
        assert [e["message_id"] for e in w.events("requeued")] == [job_id]

    r.set(RELEASE, "1")
    start_worker(workers, env)
    wait_for(lambda: effects(r, "ran"), 20, "the put-back job to run")
    assert len(effects(r, "start")) == 2
    assert stats(r, task).dead == 0


# --- the producer --------------------------------------------------------------------------


def test_producer_sends_to_the_queue_the_task_names(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    # The README's shape: @task("invoices", queue="billing"), a worker on --queues billing,
    # and Producer(settings).send("invoices", ...) from the web app.
    p = producer(redis_server)
    sent = p.send("q-billed", {"invoice_id": 42})
    p.close()
    assert (stats(r, "billing").ready, stats(r, "q-billed").ready) == (1, 0)
    w = start_worker(workers, queue_env(redis_server), "--queues", "billing")
    wait_for(lambda: effects(r, "ran"), 20, "the billing worker to run the job")
    (ran,) = effects(r, "ran")
    assert (ran["task"], ran["payload"]) == ("q-billed", {"invoice_id": 42})
    assert [e["message_id"] for e in w.events("finished")] == [sent]
    assert stats(r, "billing").ready == 0


def test_producer_refuses_a_task_whose_queue_it_cannot_know(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    p = producer(redis_server)
    # A typo, or a task this process does not import: refused, not parked on a queue named
    # after it that no worker reads.
    with pytest.raises(UnknownTask, match=r"'q-typo' is not registered .*queues=\{'q-typo'"):
        p.send("q-typo")
    # A sender without the tasks' code names the queues itself; that also wins over @task.
    mapped = Producer(p.settings, p.qs, queues={"q-elsewhere": "billing", "q-ok": "other"})
    mapped.send("q-elsewhere")
    mapped.send("q-ok")
    mapped.close()
    p.close()
    assert (stats(r, "billing").ready, stats(r, "other").ready, stats(r, "q-ok").ready) == (1, 1, 0)
    with pytest.raises(ConfigError, match="not a queue name"):
        Producer(p.settings, p.qs, queues={"x": "9lives"})


# --- payload size -------------------------------------------------------------------------------


def test_a_message_over_the_size_limit_is_refused_with_a_clear_error(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    settings = load_settings(
        {"CRON_RUNNER_REDIS_URL": redis_server.url, "CRON_RUNNER_TASK_MODULES": TASK_MODULES}
    )
    p = Producer(settings, QueueSettings(namespace=NAMESPACE, max_message_bytes=4096))
    p.send("q-ok", {"invoice_ids": list(range(100))})
    with pytest.raises(
        Exception, match=r"over the 4,096-byte limit .*CRON_RUNNER_MAX_MESSAGE_SIZE.*reference"
    ):
        p.send("q-ok", {"rows": ["x" * 100] * 100})
    p.close()
    assert stats(r, "q-ok").ready == 1

    bad = cli(queue_env(redis_server, CRON_RUNNER_MAX_MESSAGE_SIZE="lots"), "dlq", "list", "q-ok")
    assert bad.returncode == 78
    assert "CRON_RUNNER_MAX_MESSAGE_SIZE='lots' is not a size" in bad.stderr


# --- status ---------------------------------------------------------------------------------


def test_status_shows_depth_delayed_and_dead_per_queue(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    env = queue_env(redis_server)
    quiet = cli(env, "status")
    assert quiet.returncode == 0, quiet.stderr
    assert "QUEUE" not in quiet.stdout, "run-mode users see no queue table"

    p = producer(redis_server)
    for n in range(3):
        p.send("q-ok", {"n": n})
    p.send("q-doomed", {"n": 1})
    p.send("q-doomed", {"n": 2})
    # A retry waiting out its backoff, and a dead letter, made with Dramatiq's own calls.
    raw = redis.Redis(port=redis_server.port)
    broker = make_broker(raw, QueueSettings(namespace=NAMESPACE))
    broker.enqueue(p.message("q-flaky", {"n": 9}), delay=60_000)
    consumer = broker.consume("q-doomed", prefetch=1)
    fetched = next(m for m in consumer if m is not None)
    consumer.nack(fetched)
    consumer.close()
    raw.connection_pool.disconnect()
    p.close()

    table = cli(env, "status")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split()[1:] for line in table.stdout.splitlines()[1:] if line}
    assert rows["q-ok"] == ["3", "0", "0", "0"]
    assert rows["q-doomed"] == ["1", "0", "0", "1"]
    assert rows["q-flaky"] == ["0", "0", "1", "0"]

    as_json = json.loads(cli(env, "status", "-o", "json").stdout)
    assert {q["queue"]: q["dead"] for q in as_json["queues"]} == {
        "q-ok": 0, "q-doomed": 1, "q-flaky": 0,
    }  # fmt: skip
    one = json.loads(cli(env, "status", "q-ok", "-o", "json").stdout)
    assert [q["queue"] for q in one["queues"]] == ["q-ok"]


def test_status_of_a_task_shows_the_queue_it_is_on(redis_server: RedisServer) -> None:
    env = queue_env(redis_server)
    p = producer(redis_server)
    p.send("q-billed")
    p.send("q-billed")
    p.send("q-ok")
    p.close()
    billed = cli(env, "status", "q-billed", "-o", "json")
    assert billed.returncode == 0, billed.stderr
    assert [(q["queue"], q["ready"]) for q in json.loads(billed.stdout)["queues"]] == [
        ("billing", 2)
    ]
    table = cli(env, "status", "q-billed").stdout.splitlines()
    assert table[-1].split() == ["billing", "2", "0", "0", "0"]

    # A run-mode task that cannot be on a queue has none, and its status still works.
    odd = cli({**env, "CRON_RUNNER_TASK_MODULES": f"{TASK_MODULES},tests.queue.run_mode_tasks"},
              "status", "1-backup", "-o", "json")  # fmt: skip
    assert (odd.returncode, json.loads(odd.stdout)["queues"]) == (0, []), odd.stderr
    # Tasks that cannot be imported where status runs: the queue named after the task.
    blind = cli(
        {**env, "CRON_RUNNER_TASK_MODULES": "no.such.module"}, "status", "q-ok", "-o", "json"
    )
    assert blind.returncode == 0, blind.stderr
    assert [q["queue"] for q in json.loads(blind.stdout)["queues"]] == ["q-ok"]
    assert "cannot load the tasks" in blind.stderr


# --- time limit, processes ------------------------------------------------------------------


def test_a_job_over_its_time_limit_is_interrupted(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    # q-overtime: time_limit=300ms, retries=0; Dramatiq checks deadlines once a second.
    p = producer(redis_server)
    p.send("q-overtime")
    p.close()
    start_worker(workers, queue_env(redis_server))
    wait_for(lambda: stats(r, "q-overtime").dead == 1, 30, "the job to be dead-lettered")
    assert not effects(r, "ran")
    listed = cli(queue_env(redis_server), "dlq", "list", "q-overtime").stdout
    assert "TimeLimitExceeded" in listed


def test_processes_share_the_work_and_stop_together(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    env = queue_env(redis_server)
    w = WorkerProc({**env, "CRON_RUNNER_HOLDER": "pod"}, "--processes", "2", "--threads", "1")
    workers.append(w)
    wait_for(lambda: len(w.events("worker_ready")) == 2, 20, "both worker processes")
    assert {e["holder"] for e in w.events("worker_ready")} == {"pod#0", "pod#1"}
    p = producer(redis_server)
    for n in range(20):
        p.send("q-sleep", {"seconds": 0.05, "n": n})
    p.close()
    wait_for(lambda: len(effects(r, "ran")) == 20, 30, "every job")
    assert {e["holder"] for e in effects(r, "ran")} == {"pod#0", "pod#1"}
    w.terminate()
    assert w.wait(30) == 0
    assert len(w.events("worker_stopped")) == 2


def test_a_dead_worker_process_stops_the_pod(
    redis_server: RedisServer, workers: list[WorkerProc]
) -> None:
    # Rather than run short-handed, the pod exits non-zero and Kubernetes restarts it.
    w = WorkerProc(queue_env(redis_server), "--processes", "2")
    workers.append(w)
    wait_for(lambda: len(w.events("worker_ready")) == 2, 20, "both worker processes")
    child = w.events("worker_ready")[0]["pid"]
    os.kill(child, signal.SIGKILL)
    assert w.wait(30) == 1
    assert w.events("worker_failed")
    assert len(w.events("worker_stopped")) == 1, "the other process stopped cleanly"


@pytest.mark.parametrize("processes", ["1", "2"])
def test_worker_exit_codes_name_the_fault_with_any_number_of_processes(processes: str) -> None:
    # The pod's exit code says what is wrong, as for a run: 3 when Redis cannot be reached
    # (retried: the pod restarts), 2 when the configuration is wrong (the credentials here).
    nobody = runner_env(f"redis://127.0.0.1:{free_port()}/0", CRON_RUNNER_CONNECT_TIMEOUT="500ms",
                        CRON_RUNNER_TASK_MODULES=TASK_MODULES)  # fmt: skip
    down = cli(nobody, "worker", "--processes", processes)
    assert (down.returncode, "Traceback" in down.stderr) == (69, False), down.stderr
    assert "unreachable" in down.stderr

    with RedisServer(extra_args=["--requirepass", "s3cret"]) as locked:
        wrong = cli(queue_env(locked, CRON_RUNNER_REDIS_PASSWORD="wrong"),
                    "worker", "--processes", processes)  # fmt: skip
    assert (wrong.returncode, "Traceback" in wrong.stderr) == (78, False), wrong.stderr
    assert "refused the credentials" in wrong.stderr


def test_a_run_mode_task_whose_name_cannot_be_a_queue_leaves_the_workers_running(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    env = queue_env(
        redis_server, CRON_RUNNER_TASK_MODULES=f"{TASK_MODULES},tests.queue.run_mode_tasks"
    )
    every = start_worker(workers, env)
    (note,) = every.events("tasks_not_served")
    assert "1-backup" in note["msg"] and note["level"] == "warning"
    start_worker(workers, env, "--queues", "billing")
    p = producer(redis_server)
    p.send("q-ok")
    p.send("q-billed")
    p.close()
    wait_for(lambda: len(effects(r, "ran")) == 2, 20, "both workers' jobs")
    assert {e["task"] for e in effects(r, "ran")} == {"q-ok", "q-billed"}

    # It cannot be enqueued either, so nothing for it can wait on a queue.
    refused = cli({**env, "CRON_RUNNER_MODE": "enqueue"}, "run", "1-backup")
    assert refused.returncode == 78
    assert "cannot be a queue name" in refused.stderr
    # A worker with nothing it can serve is a configuration error.
    alone = cli({**env, "CRON_RUNNER_TASK_MODULES": "tests.queue.run_mode_tasks"}, "worker")
    assert (alone.returncode, "Traceback" in alone.stderr) == (78, False), alone.stderr
    assert "no registered task can run from a queue (1-backup" in alone.stderr


def test_a_worker_without_tasks_is_a_configuration_error(redis_server: RedisServer) -> None:
    done = cli({**queue_env(redis_server), "CRON_RUNNER_TASK_MODULES": ""}, "worker")
    assert done.returncode == 78
    assert "no tasks registered" in done.stderr


def test_two_names_for_one_task_each_enqueue_their_slot(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    """`run q-ok --name <key>` (the chart's two tasks of one registered task): one message
    each, both for the actor q-ok, and the worker runs both."""
    minutes = int(time.time() // 60)
    sent = []
    for key in ("daily-sync", "weekly-sync"):
        env = queue_env(redis_server, CRON_RUNNER_MODE="enqueue",
                        CRON_RUNNER_JOB_NAME=f"{key}-{minutes}", CRON_RUNNER_CRONJOB_NAME=key)  # fmt: skip
        done = cli(env, "run", "q-ok", "--name", key)
        assert (done.returncode, outcome(done.stderr)) == (0, "enqueued"), done.stderr
        (event,) = [e for e in events(done.stderr) if e.get("event") == "enqueued"]
        assert event["message_id"] == message_id_for("default", key, minutes * 60, event["fence"])
        sent.append(event["message_id"])
    assert len(set(sent)) == 2
    assert stats(r, "q-ok").ready == 2
    start_worker(workers, queue_env(redis_server))
    wait_for(lambda: len(effects(r, "ran")) == 2, 20, "both jobs to run")
