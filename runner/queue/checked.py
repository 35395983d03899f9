"""A worker's guard against messages it cannot run: each is checked as it is decoded, and one
that cannot be decoded or checked goes to the dead-letter queue at once, with the reason,
while the rest of its batch runs (docs/design.md, Queue mode).

Dramatiq decodes a batch of fetched messages one by one in its consumer; a ``DecodeError``
there used to end the consumer, leaving the whole batch fetched and never run, and the
message came back at the next worker. Two of Dramatiq's own hooks close that: the encoder
(``CheckedEncoder``: the envelope, our keyword arguments and the options the middleware and
the worker read, type by type, so that a message that decodes is one the worker can run),
and the broker's ``consumer_class`` (``CheckedConsumer``: a message the encoder refuses is
dead-lettered by its id, found in this consumer's fetched set, and the next one is read).

Imported by the worker only: it imports Dramatiq at the top.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from typing import Any, Final

from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import current_millis
from dramatiq.encoder import JSONEncoder, MessageData
from dramatiq.errors import DecodeError
from redis.exceptions import RedisError

from runner.config.rates import parse_rate_limit
from runner.config.settings import OVERLAPS
from runner.errors import ConfigError
from runner.keys import NAME_RE
from runner.queue import limits
from runner.queue.options import OVERLAP, OVERLAP_WAIT_MS, PAUSE_ON_FAILURES, RATE_LIMIT, WAIT_TURN

log = logging.getLogger("runner.worker")

#: Epoch seconds and fencing tokens fit here (a JSON number above it loses precision).
_MAX_INT: Final = 2**53
#: Options that are counts or milliseconds: Dramatiq's and ours.
_COUNTS: Final = ("retries", "max_retries", "min_backoff", "max_backoff", "time_limit",
                  OVERLAP_WAIT_MS, PAUSE_ON_FAILURES, limits.LIMITED, "dlq_retries",
                  "requeue_timestamp")  # fmt: skip
#: Options Dramatiq reads as code (an exception class, a callable): never from a message.
_CODE: Final = ("throws", "retry_when")
#: How much of a message that cannot be read is kept in its dead letter.
_RAW_KEPT: Final = 2000


class InvalidMessage(ValueError):
    """A message whose envelope, arguments or options no worker can run."""


def _int(value: Any) -> bool:
    return type(value) is int and 0 <= value < _MAX_INT


def check(fields: Any) -> None:
    """Raise InvalidMessage naming the first field that is wrong."""
    if not isinstance(fields, dict):
        raise InvalidMessage(f"a message is a JSON object, not {type(fields).__name__}")
    for name in ("queue_name", "actor_name", "message_id"):
        if not isinstance(fields.get(name), str) or not fields[name]:
            raise InvalidMessage(f"{name}: expected a non-empty string")
    if not _int(fields.get("message_timestamp")):
        raise InvalidMessage("message_timestamp: expected milliseconds, an integer")
    if fields.get("args") not in ([], ()):
        raise InvalidMessage("args: expected none: a task takes its slot and payload by name")
    kwargs, options = fields.get("kwargs"), fields.get("options")
    if not isinstance(kwargs, dict):
        raise InvalidMessage("kwargs: expected an object")
    if not isinstance(options, dict):
        raise InvalidMessage("options: expected an object")
    _check_kwargs(kwargs)
    _check_options(options)


def _check_kwargs(kwargs: Mapping[str, Any]) -> None:
    slot, fence = kwargs.get("slot"), kwargs.get("fence", 0)
    if slot is not None and not _int(slot):
        raise InvalidMessage(f"slot {str(slot)[:40]!r}: expected epoch seconds, an integer")
    if not _int(fence):
        raise InvalidMessage(f"fence {str(fence)[:40]!r}: expected a non-negative integer")
    if not isinstance(kwargs.get("payload") or {}, dict):
        raise InvalidMessage("payload: expected an object")
    name = kwargs.get("name")
    if name is not None and not (isinstance(name, str) and NAME_RE.match(name)):
        raise InvalidMessage(f"name {str(name)[:40]!r}: expected a task name")


def _check_options(options: Mapping[str, Any]) -> None:
    if not isinstance(options.get("redis_message_id"), str):
        raise InvalidMessage("options.redis_message_id: expected a string")
    for name in _CODE:
        if name in options:
            raise InvalidMessage(f"options.{name}: set on the task, never in a message")
    for name in _COUNTS:
        if name in options and not _int(options[name]):
            raise InvalidMessage(f"options.{name}: expected a non-negative integer")
    eta = options.get("eta")
    if eta is not None and (type(eta) not in (int, float) or eta < 0):
        raise InvalidMessage("options.eta: expected milliseconds")
    if options.get(OVERLAP, OVERLAPS[0]) not in OVERLAPS:
        raise InvalidMessage(f"options.{OVERLAP}: expected one of {', '.join(OVERLAPS)}")
    if type(options.get(WAIT_TURN, 0)) not in (int, bool):
        raise InvalidMessage(f"options.{WAIT_TURN}: expected 0 or 1")
    for name in ("traceback", "on_retry_exhausted"):
        if name in options and not isinstance(options[name], str):
            raise InvalidMessage(f"options.{name}: expected a string")
    rate = options.get(RATE_LIMIT)
    if rate is not None:
        try:
            parse_rate_limit(str(rate), f"options.{RATE_LIMIT}")
        except ConfigError as exc:
            raise InvalidMessage(str(exc)) from None


class CheckedEncoder(JSONEncoder):
    """Dramatiq's JSON encoder, whose decode also checks the message (``check``)."""

    def decode(self, data: bytes) -> MessageData:
        try:
            fields = super().decode(data)
        except DecodeError as exc:  # its text repeats the whole message: the cause suffices
            raise InvalidMessage(f"not JSON text: {exc.error}") from None
        check(fields)
        return fields


# KEYS: this consumer's fetched set, the queue's messages, the dead-letter zset and hash.
# ARGV: the message as fetched, now (ms), the dead letter's body. The message's id is the one
# in the fetched set whose body is this one: the fetch returns bodies without their ids.
_DEAD_LETTER = """
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('HGET', KEYS[2], id) == ARGV[1] then
    redis.call('SREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZADD', KEYS[3], ARGV[2], id)
    redis.call('HSET', KEYS[4], id, ARGV[3])
    return id
  end
end
return false
"""


def dead_letter_body(
    data: bytes, queue: str, reason: str, tasks: Collection[str]
) -> tuple[bytes, str]:
    """A dead letter that `cron-runner dlq` can list, and its task: the one the message names
    when this worker has it, else the first of ``tasks`` (those on its queue), so that `dlq
    list TASK` shows it; with the reason and the message as it came (its first 2,000
    characters)."""
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    fields = parsed if isinstance(parsed, dict) else {}
    named, message_id = fields.get("actor_name"), fields.get("message_id")
    task = named if named in tasks else min(tasks, default=queue)
    body: dict[str, Any] = {
        "queue_name": queue,
        "actor_name": task,
        "args": [],
        "kwargs": {},
        "options": {
            "traceback": f"InvalidMessage: {reason}",
            "undecodable": data[:_RAW_KEPT].decode("utf-8", "replace"),
        },
        "message_id": message_id if isinstance(message_id, str) else "",
        "message_timestamp": current_millis(),
    }
    return json.dumps(body).encode(), str(task)


class CheckedConsumer(_RedisConsumer):
    """Dramatiq's Redis consumer, which dead-letters a message it cannot decode and goes on
    with the next one instead of stopping."""

    broker: RedisBroker
    queue_name: str

    def __next__(self) -> Any:
        while True:
            try:
                return super().__next__()
            except DecodeError as exc:
                error = exc.error
                why = (
                    str(error)
                    if isinstance(error, InvalidMessage)
                    else f"{type(error).__name__}: {error}"
                )
                self._dead_letter(exc.data, why)

    def _dead_letter(self, data: Any, reason: str) -> None:
        raw = data if isinstance(data, bytes) else str(data).encode()
        ns, queue = self.broker.namespace, self.queue_name
        canonical = queue.removesuffix(".DQ")
        keys = [f"{ns}:__acks__.{self.broker.broker_id}.{queue}", f"{ns}:{queue}.msgs",
                f"{ns}:{canonical}.XQ", f"{ns}:{canonical}.XQ.msgs"]  # fmt: skip
        tasks = [n for n, a in self.broker.actors.items() if a.queue_name == canonical]
        body, task = dead_letter_body(raw, canonical, reason, tasks)
        client: Any = self.broker.client
        try:
            found = client.eval(_DEAD_LETTER, len(keys), *keys, raw, current_millis(), body)
        except RedisError as exc:
            # Left in the fetched set: re-delivered when this worker's heartbeat expires.
            log.error(f"could not dead-letter a message on {canonical!r} ({reason}): {exc}",
                      extra={"event": "dead_letter_failed", "queue": canonical})  # fmt: skip
            return
        redis_id = found.decode() if isinstance(found, bytes) else found
        log.error(
            f"a message on queue {canonical!r} cannot be run ({reason}): moved to the dead-letter "
            f"queue (cron-runner dlq list {task} --queue {canonical})",
            # The message's id is unknown, or untrusted: the dead letter's id (`dlq retry`).
            extra={"event": "dead_lettered", "task": task, "queue": canonical,
                   "message_id": redis_id, "reason": reason},
        )  # fmt: skip


class CheckedBroker(RedisBroker):
    """Dramatiq's Redis broker with the ``CheckedConsumer``."""

    @property
    def consumer_class(self) -> type[CheckedConsumer]:
        return CheckedConsumer


def install() -> None:
    """Make every message this process decodes a checked one (Dramatiq's global encoder)."""
    import dramatiq  # noqa: PLC0415

    dramatiq.set_encoder(CheckedEncoder())
