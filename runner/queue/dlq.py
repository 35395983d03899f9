"""The dead-letter queue: messages whose retries ran out, listed, retried or purged
(``cron-runner dlq``; docs/design.md, Queue mode)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner.config.queue import QueueSettings
from runner.errors import ConfigError
from runner.queue.messages import enqueue_on, make_broker

if TYPE_CHECKING:
    from runner.queue.messages import Message


@dataclass(frozen=True)
class DeadLetter:
    redis_id: str  # Dramatiq's per-enqueue id, the DLQ's key
    message_id: str
    task: str
    queue: str
    dead_at: float
    attempts: int  # runs that failed: the first and every retry
    slot: int | None
    error: str
    raw: dict[str, Any] = field(repr=False)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _last_line(traceback: str) -> str:
    lines = [line for line in traceback.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def dead_letters(
    client: Any, namespace: str, queue: str, task: str | None = None
) -> list[DeadLetter]:
    """Dead letters of ``queue`` (of ``task`` only, when given), oldest first."""
    xq = f"{namespace}:{queue}.XQ"
    scored = client.zrange(xq, 0, -1, withscores=True)
    if not scored:
        return []
    ids = [_text(member) for member, _ in scored]
    bodies = client.hmget(f"{xq}.msgs", ids)
    out = []
    for (redis_id, (_, score)), body in zip(zip(ids, scored, strict=True), bodies, strict=True):
        if body is None:
            continue
        data = json.loads(body)
        if task is not None and data.get("actor_name") != task:
            continue
        options = data.get("options") or {}
        kwargs = data.get("kwargs") or {}
        out.append(
            DeadLetter(
                redis_id=redis_id,
                message_id=str(data.get("message_id", "")),
                task=str(data.get("actor_name", "")),
                queue=queue,
                dead_at=float(score) / 1000,
                attempts=int(options.get("retries", 0)),
                slot=kwargs.get("slot"),
                error=_last_line(str(options.get("traceback", ""))),
                raw=data,
            )
        )
    return out


def find_dead(letters: Sequence[DeadLetter], message_id: str) -> DeadLetter:
    for letter in letters:
        if message_id in (letter.message_id, letter.redis_id):
            return letter
    raise ConfigError(f"no dead letter with id {message_id!r}")


def retry_dead(client: Any, qs: QueueSettings, letters: Sequence[DeadLetter]) -> list[str]:
    """Send dead letters back to their queue with a fresh retry budget, each in one
    transaction with its removal from the dead-letter queue. Returns the message ids sent."""
    from dramatiq import Message as DramatiqMessage  # noqa: PLC0415
    from redis.exceptions import WatchError  # noqa: PLC0415

    broker = make_broker(client, qs)
    sent = []
    for letter in letters:
        xq = f"{qs.namespace}:{letter.queue}.XQ"
        fields = dict(letter.raw)
        options = {k: v for k, v in (fields.get("options") or {}).items()
                   if k not in ("retries", "traceback", "eta", "redis_message_id",
                                "requeue_timestamp")}  # fmt: skip
        options["dlq_retries"] = int(options.get("dlq_retries", 0)) + 1
        fields.update(options=options, queue_name=letter.queue, args=tuple(fields.get("args", ())))
        message: Message = DramatiqMessage(**fields)
        with client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(f"{xq}.msgs")
                    if not pipe.hexists(f"{xq}.msgs", letter.redis_id):
                        pipe.unwatch()
                        break  # retried or purged by someone else meanwhile
                    pipe.multi()
                    enqueue_on(pipe, broker, message)
                    pipe.zrem(xq, letter.redis_id)
                    pipe.hdel(f"{xq}.msgs", letter.redis_id)
                    pipe.execute()
                    sent.append(letter.message_id)
                    break
                except WatchError:
                    continue
    return sent


def purge_dead(client: Any, namespace: str, letters: Sequence[DeadLetter]) -> int:
    removed = 0
    for letter in letters:
        xq = f"{namespace}:{letter.queue}.XQ"
        with client.pipeline(transaction=True) as pipe:
            pipe.zrem(xq, letter.redis_id)
            pipe.hdel(f"{xq}.msgs", letter.redis_id)
            removed += int(pipe.execute()[1])
    return removed


def utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
