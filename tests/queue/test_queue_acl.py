"""Queue mode as a least-privilege ACL user: the run rule published in docs/reliability.md,
the operations rule, and what queue mode adds (Dramatiq's dispatch script and our
transactions), exercised on every path: enqueue, fetch, retry, dead-letter, DLQ commands,
status, re-delivery of a dead worker's messages, and a clean stop."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from runner.errors import ConfigError
from runner.keys import TaskKeys
from runner.testing import RedisServer
from tests.helpers.proc import events, outcome
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
# And for a task with a rate limit: Dramatiq's WindowRateLimiter sums its buckets with MGET.
ACL_RATE_LIMIT = "+mget"


# Dramatiq's keys of team-a's namespace: the namespace itself (its dispatch script's KEYS[1])
# and everything under it; not `team-a*`, which would match team-ab's too.
QUEUE_SCOPE_KEYS = "~cron-runner:queue:team-a ~cron-runner:queue:team-a:*"


@pytest.fixture
def acl_env(redis_server: RedisServer, r: redis.Redis) -> Iterator[dict[str, str]]:
    rule = f"{ACL_RULE} {ACL_OPS} {ACL_QUEUE} {ACL_RATE_LIMIT}"
    r.execute_command("ACL", "SETUSER", "cron-runner", "reset", "on", ">s3cret", *rule.split())
    yield queue_env(
        redis_server,
        CRON_RUNNER_REDIS_USERNAME="cron-runner",
        CRON_RUNNER_REDIS_PASSWORD="s3cret",
        # Maintenance on every broker call, so that its KEYS runs in this test.
        CRON_RUNNER_QUEUE_MAINTENANCE_CHANCE="1",
    )


def _assert_never_refused(code: int, text: str) -> None:
    """The worker stopped cleanly and Redis refused it nothing on the way."""
    assert code == 0, text[-2000:]
    assert "NOPERM" not in text and "no permissions" not in text, text[-2000:]


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
        # Retries through the delay queue, then the dead-letter queue; a rate limit (4/1s)
        # that holds some jobs back.
        p = producer(redis_server)
        p.send("q-flaky", {"id": "acl"})
        p.send("q-doomed", {"n": 1})
        for n in range(6):
            p.send("q-rated", {"n": n})
        p.close()
        wait_for(lambda: len(effects(r, "ran")) == 8, 30, "the flaky and rated jobs to succeed")
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
        wait_for(lambda: len(effects(r, "ran")) == 9, 30, "the retried job to run")
        # A backfill's slots, fetched together, each waiting for its turn (HSET, GET, PTTL).
        minute = minutes * 60
        backfill = {**acl_env, "CRON_RUNNER_MODE": "enqueue", "CRON_RUNNER_SCHEDULE": "* * * * *",
                    "CRON_RUNNER_SLOT_RETENTION": "1h"}  # fmt: skip
        done = cli(backfill, "backfill", "q-turn", "--from", str(minute - 240),
                   "--to", str(minute - 120))  # fmt: skip
        assert done.returncode == 0, done.stderr
        wait_for(lambda: len(effects(r, "ran")) == 12, 40, "the backfilled slots to run")
        # A message no worker can run, dead-lettered by its consumer's script.
        r.hset(f"{NAMESPACE}:q-ok.msgs", "bad-id", "not json")
        r.rpush(f"{NAMESPACE}:q-ok", "bad-id")
        wait_for(lambda: stats(r, "q-ok").dead == 1, 20, "the bad message to be dead")
        code, text = worker.stopped()
    finally:
        worker.stop()
    _assert_never_refused(code, text)
    assert [e for e in events(text) if e.get("event") == "rate_limited"]


def test_queue_mode_within_one_scope_as_its_acl_user(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    """The per-scope rule of docs/reliability.md plus the queue key pattern and ACL_QUEUE:
    team-a enqueues, its worker runs the message, status and the DLQ answer; pointed at
    team-b's scope, the same user is refused and team-b's queue is untouched."""
    from tests.integration.test_secrets_and_tenants import SCOPE_RULE  # noqa: PLC0415

    # The test tasks record their effects under test:* (tests/queue/queue_tasks.py).
    rule = (f"{SCOPE_RULE.replace('SCOPE', 'team-a')} {QUEUE_SCOPE_KEYS} ~test:* "
            f"{ACL_QUEUE}")  # fmt: skip
    r.execute_command("ACL", "SETUSER", "team-a", "reset", "on", ">a-pw", *rule.split())
    team = {"CRON_RUNNER_REDIS_USERNAME": "team-a", "CRON_RUNNER_REDIS_PASSWORD": "a-pw"}
    env = queue_env(redis_server, CRON_RUNNER_SCOPE="team-a", **team)
    minutes = int(time.time() // 60)
    enqueue = {**env, "CRON_RUNNER_MODE": "enqueue", "CRON_RUNNER_JOB_NAME": f"a-{minutes}",
               "CRON_RUNNER_CRONJOB_NAME": "a"}  # fmt: skip
    sent = cli(enqueue, "run", "q-ok")
    assert (sent.returncode, outcome(sent.stderr)) == (0, "enqueued"), sent.stderr
    worker = WorkerProc({**env, "CRON_RUNNER_HOLDER": "team-a-worker"})
    try:
        wait_for(worker.ready, 20, "the worker")
        wait_for(lambda: effects(r, "ran"), 20, "the enqueued job to run")
        status = cli(env, "status")
        assert status.returncode == 0, status.stderr
        assert "q-ok" in status.stdout
        listed = cli(env, "dlq", "list", "q-ok")
        assert listed.returncode == 0, listed.stderr
        code, text = worker.stopped()
    finally:
        worker.stop()
    _assert_never_refused(code, text)

    r.rpush("cron-runner:queue:team-b:q-ok", "b-message")
    intruder = {**enqueue, "CRON_RUNNER_SCOPE": "team-b"}
    refused = cli(intruder, "run", "q-ok")
    assert refused.returncode == ConfigError.exit_code, refused.stderr
    assert "Traceback" not in refused.stderr
    dlq = cli({**env, "CRON_RUNNER_SCOPE": "team-b"}, "dlq", "purge", "q-ok", "--all")
    assert dlq.returncode == ConfigError.exit_code, dlq.stderr
    assert r.lrange("cron-runner:queue:team-b:q-ok", 0, -1) == ["b-message"]
