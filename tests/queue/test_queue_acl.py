"""Queue mode as a least-privilege ACL user: the run rule published in docs/reliability.md,
the operations rule, and what queue mode adds (Dramatiq's dispatch script and our
transactions), exercised on every path: enqueue, fetch, retry, dead-letter, DLQ commands,
status, re-delivery of a dead worker's messages, and a clean stop."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from runner.devserver import RedisServer
from runner.keys import TaskKeys
from tests.helpers.proc import outcome
from tests.helpers.wait import wait_for

# The run rule and the operations rule docs/reliability.md publishes, checked there for runs.
from tests.integration.test_redis_shapes import ACL_OPS, ACL_RULE
from tests.queue.helpers import (
    NAMESPACE,
    WorkerProc,
    cli,
    effects,
    producer,
    queue_env,
    stats,
)

# What queue mode adds to the run rule (and to ACL_OPS for `status`), published in the
# README's Queue mode section. KEYS is Dramatiq's: its maintenance looks up dead workers' keys.
ACL_QUEUE = (
    "+watch +unwatch +multi +exec +exists +script|load +script|exists "
    "+rpush +lpop +llen +sadd +srem +smembers +scard +hexists +hdel +hlen "
    "+zadd +zrem +zrange +zrangebyscore +zcard +keys"
)


@pytest.fixture
def acl_env(redis_server: RedisServer, r: redis.Redis) -> Iterator[dict[str, str]]:
    rule = f"{ACL_RULE} {ACL_OPS} {ACL_QUEUE}"
    r.execute_command("ACL", "SETUSER", "cron-runner", "reset", "on", ">s3cret", *rule.split())
    yield queue_env(
        redis_server,
        CRON_RUNNER_REDIS_USERNAME="cron-runner",
        CRON_RUNNER_REDIS_PASSWORD="s3cret",
        # Maintenance on every broker call, so that its KEYS runs in this test.
        CRON_RUNNER_QUEUE_MAINTENANCE_CHANCE="1",
    )


def test_every_queue_path_as_the_acl_user(
    redis_server: RedisServer, r: redis.Redis, acl_env: dict[str, str]
) -> None:
    minutes = int(time.time() // 60)
    enqueue = {**acl_env, "CRON_RUNNER_MODE": "enqueue",
               "CRON_RUNNER_JOB_NAME": f"acl-{minutes}", "CRON_RUNNER_CRONJOB_NAME": "acl"}  # fmt: skip
    sent = cli(enqueue, "run", "q-ok")
    assert (sent.returncode, outcome(sent.stderr)) == (0, "enqueued"), sent.stderr
    again = cli(enqueue, "run", "q-ok")
    assert (again.returncode, outcome(again.stderr)) == (0, "skipped_done"), again.stderr
    # The send whose Job died before the slot marker: found sent (EXISTS, UNWATCH).
    r.delete(TaskKeys("cron-runner", "default", "q-ok").slot(minutes * 60))
    crashed = cli(enqueue, "run", "q-ok")
    assert (crashed.returncode, outcome(crashed.stderr)) == (0, "enqueued"), crashed.stderr
    assert "already enqueued" in crashed.stderr
    # A worker that died long ago, for maintenance to find (SMEMBERS, KEYS, ZREM).
    r.zadd(f"{NAMESPACE}:__heartbeats__", {"long-gone": 1})
    r.sadd(f"{NAMESPACE}:__acks__.long-gone.q-ok", "lost-id")

    worker = WorkerProc({**acl_env, "CRON_RUNNER_HOLDER": "acl-worker"}, "--threads", "2")
    try:
        wait_for(worker.ready, 20, "the worker")
        wait_for(lambda: effects(r, "ran"), 20, "the enqueued job to run")
        # Retries through the delay queue, then the dead-letter queue.
        p = producer(redis_server)
        p.send("q-flaky", {"id": "acl"})
        p.send("q-doomed", {"n": 1})
        p.close()
        wait_for(lambda: len(effects(r, "ran")) == 2, 30, "the flaky job to succeed")
        wait_for(lambda: stats(r, "q-doomed").dead == 1, 30, "the doomed job to be dead")
        wait_for(lambda: not r.zscore(f"{NAMESPACE}:__heartbeats__", "long-gone"), 20,
                 "maintenance to clear the dead worker")  # fmt: skip

        status = cli(acl_env, "status")
        assert status.returncode == 0, status.stderr
        assert "q-doomed" in status.stdout.split("QUEUE", 1)[1]
        listed = cli(acl_env, "dlq", "list", "q-doomed")
        assert listed.returncode == 0, listed.stderr
        message_id = listed.stdout.splitlines()[1].split()[0]
        assert cli(acl_env, "dlq", "show", "q-doomed", message_id).returncode == 0
        r.set("test:doomed:fixed", "1")
        retried = cli(acl_env, "dlq", "retry", "q-doomed", "--all")
        assert retried.returncode == 0, retried.stderr
        wait_for(lambda: len(effects(r, "ran")) == 3, 30, "the retried job to run")
        worker.terminate()
        assert worker.wait(30) == 0
        text = worker.text()
    finally:
        worker.stop()
    assert "NOPERM" not in text and "no permissions" not in text, text[-2000:]
