"""A message no worker can run, in a batch of good ones: it goes to the dead-letter queue at
once, with the reason, and the rest of the batch runs. Real `cron-runner worker` processes on
a real Redis; each bad message is written into the queue as a careless or hostile sender
would, between good messages fetched in the same batch.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, cast

import pytest
import redis

from runner.config.queue import QueueSettings
from runner.queue.dlq import dead_letters
from runner.queue.messages import build_message, enqueue_on, make_broker
from runner.testing import RedisServer
from tests.helpers.wait import wait_for
from tests.queue.helpers import (
    NAMESPACE,
    WorkerProc,
    cli,
    effects,
    queue_env,
    start_worker,
    stats,
    unacked,
)

TASK = "q-ok"
SLOT = 1_700_000_040


def _envelope(**changes: Any) -> dict[str, Any]:
    """A good message of TASK, with ``changes`` (None deletes a field; dotted: a nested one)."""
    body: dict[str, Any] = {
        "queue_name": TASK, "actor_name": TASK, "args": [],
        "kwargs": {"slot": SLOT, "fence": 1, "payload": {}, "name": TASK},
        "options": {}, "message_id": str(uuid.uuid4()), "message_timestamp": 1_700_000_000_000,
    }  # fmt: skip
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        where = body
        for p in parents:
            where = where[p]
        if value is None:
            where.pop(leaf, None)
        else:
            where[leaf] = value
    return body


# The class: each way a message can fail to be one a worker runs, and the reason it is given.
POISON: dict[str, tuple[bytes | dict[str, Any], str]] = {
    "not_json": (b"\xff\xfegarbage{", "not JSON text"),
    "not_an_object": (b"[1, 2, 3]", "a JSON object"),
    "no_actor": (_envelope(actor_name=None), "actor_name"),
    "unknown_actor": (_envelope(actor_name="no-such-task"), "no-such-task"),
    "slot_not_a_number": (_envelope(kwargs__slot="soon", kwargs__fence="high"), "slot"),
    "fence_not_a_number": (_envelope(kwargs__fence="high"), "fence"),
    "slot_a_float": (_envelope(kwargs__slot=1.5), "slot"),
    "positional_args": (_envelope(args=[SLOT, 7]), "args"),
    "kwargs_not_an_object": (_envelope(kwargs=[1]), "kwargs"),
    "options_not_an_object": (_envelope(options="x"), "options"),
    "payload_not_an_object": (_envelope(kwargs__payload=[1]), "payload"),
    "name_not_a_name": (_envelope(kwargs__name="../x"), "name"),
    "retries_not_a_number": (_envelope(options__retries="many"), "retries"),
    "time_limit_not_a_number": (_envelope(options__time_limit="1s"), "time_limit"),
    "unknown_overlap": (_envelope(options__overlap="sometimes"), "overlap"),
    "rate_limit_unreadable": (_envelope(options__rate_limit="lots"), "rate_limit"),
    "throws_in_a_message": (_envelope(options__throws="ValueError"), "throws"),
}


def _push(r: redis.Redis, body: bytes | dict[str, Any]) -> str:
    """Write a message into TASK's queue as Dramatiq's enqueue lays it out: an id on the list,
    its body in the hash."""
    redis_id = str(uuid.uuid4())
    if isinstance(body, dict):
        body = {**body, "options": body["options"]}
        if isinstance(body["options"], dict):
            body["options"] = {**body["options"], "redis_message_id": redis_id}
        data = json.dumps(body).encode()
    else:
        data = body
    cast(Any, r).hset(f"{NAMESPACE}:{TASK}.msgs", redis_id, data)
    r.rpush(f"{NAMESPACE}:{TASK}", redis_id)
    return redis_id


def _send(r: redis.Redis, i: int) -> None:
    """A piece of work, as a Producer sends it (no slot, no lease): they run side by side."""
    message = build_message(TASK, TASK, slot=None, fence=0, payload={"i": i}, message_id=None,
                            limit_bytes=None)  # fmt: skip
    with r.pipeline(transaction=False) as pipe:
        enqueue_on(pipe, make_broker(r, QueueSettings(namespace=NAMESPACE)), message)
        pipe.execute()


@pytest.mark.parametrize("kind", sorted(POISON))
def test_a_message_no_worker_can_run_is_dead_lettered_and_its_batch_runs(
    kind: str, redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    body, reason = POISON[kind]
    # Pieces of work before and after the bad message: all fetched in one batch.
    good = [1, 2, 3, 4]
    for i in good[:2]:
        _send(r, i)
    poison = _push(r, body)
    for i in good[2:]:
        _send(r, i)
    env = queue_env(redis_server)
    worker = start_worker(workers, env, "--threads", "4")
    wait_for(lambda: len(effects(r, "ran")) == len(good), 20, "the good messages to run")
    wait_for(lambda: unacked(r) == 0, 10, "nothing left fetched and unacknowledged")
    assert sorted(e["payload"]["i"] for e in effects(r, "ran")) == good
    assert len(effects(r)) == len(good), "the bad message never ran the task"
    (letter,) = [d for d in dead_letters(r, NAMESPACE, TASK) if d.redis_id == poison]
    assert any(word in letter.error for word in reason.split("|")), letter.error
    listed = cli(env, "dlq", "list", letter.task, "--queue", TASK)
    assert listed.returncode == 0 and letter.error[:60] in listed.stdout, listed.stderr
    (logged,) = worker.events("dead_lettered")
    assert logged["message_id"] in (poison, letter.message_id)
    assert "CRITICAL" not in worker.text() and "Restarting consumer" not in worker.text()
    row = stats(r, TASK)
    assert (row.ready, row.in_flight, row.delayed, row.dead) == (0, 0, 0, 1)
    # A restart brings nothing back.
    code, _ = worker.stopped()
    assert code == 0
    start_worker(workers, env)
    wait_for(lambda: stats(r, TASK).dead == 1 and unacked(r) == 0, 10, "the queue to stay empty")
    assert len(effects(r)) == len(good)
