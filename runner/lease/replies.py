"""Every reply the runner uses from Redis, checked for its shape before it is trusted.

A server at the URL may not be Redis, or may answer what Redis never would (a proxy's bug, a
stub, a web server): a reply that does not have the shape its command gives fails closed, and
nothing runs on it. Two errors, each also a ``RedisError`` so that every caller that already
treats Redis as away (serve's 503, the keeper's failed renewal) does so here too:

- ``NotRedis`` (exit 78): the server does not answer as Redis does at all: a PING answered with
  anything but PONG, or bytes that are not RESP. No retry can help.
- ``UnexpectedReply`` (exit 69): a RESP reply of a shape its command never gives, later.

Values read from Redis's keys are untrusted input too: ``number`` and friends read one field,
and a record that cannot be read is the caller's to report and skip (runner.ops.state).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import RedisError

from runner.errors import ConfigError, StoreUnavailable

T = TypeVar("T")

# A fence is never below the server's clock in milliseconds (ACQUIRE): any reply below this one
# (2001-09-09 in ms) is not a fence.
FENCE_FLOOR = 1_000_000_000_000


class UnexpectedReply(StoreUnavailable, RedisError):
    """A reply of a shape its command never gives: the protocol broken after the handshake."""

    def __init__(self, what: str, reply: Any) -> None:
        super().__init__(
            f"{what}: the server's reply {_shown(reply)} is not one Redis gives; nothing was "
            "done on it (is CRON_RUNNER_REDIS_URL a Redis, and not a proxy or another service?)"
        )


class NotRedis(ConfigError, RedisError):
    """The server at the URL does not answer as Redis does: the wrong kind of server."""

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(
            f"the server at {where} is not Redis ({detail}): check CRON_RUNNER_REDIS_URL"
        )


def _shown(reply: Any) -> str:
    text = repr(reply)
    return text if len(text) <= 80 else text[:77] + "..."


def pong(reply: Any, where: str) -> None:
    """PING's reply, the handshake of every admin command: Redis answers PONG."""
    # redis-py's ping() turns PONG into True and anything else into False.
    if reply is not True:
        raise NotRedis(where, "PING was not answered with PONG")


def text(value: Any, what: str) -> str:
    """A bulk or simple string (or an integer, which Lua returns for numbers)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise UnexpectedReply(what, value) from None
    if type(value) is int:
        return str(value)
    raise UnexpectedReply(what, value)


def integer(value: Any, what: str) -> int:
    """An integer reply, or a string of one (a script's table holds numbers as either)."""
    if type(value) is int:
        return value
    raw = text(value, what)
    body = raw[1:] if raw[:1] == "-" else raw
    if not body.isascii() or not body.isdigit():
        raise UnexpectedReply(what, value)
    return int(raw)


def fence(value: Any, what: str) -> int:
    """A fence: an integer at or above the server's clock in milliseconds (FENCE_FLOOR)."""
    number = integer(value, what)
    if number < FENCE_FLOOR:
        raise UnexpectedReply(f"{what} (a fence is never below the server's clock in ms)", value)
    return number


def table(reply: Any, what: str, *, min_len: int = 1) -> list[str]:
    """A flat array of strings or integers (a script's table), as strings, of ``min_len`` or
    more: no nil, no nested array, no map."""
    if not isinstance(reply, list) or len(reply) < min_len:
        raise UnexpectedReply(what, reply)
    return [text(item, what) for item in reply]


def kind(reply: Sequence[str], kinds: Sequence[str], what: str, lengths: dict[str, int]) -> str:
    """A script table's first element, one of ``kinds``, with at least ``lengths[kind]``
    elements."""
    first = reply[0]
    if first not in kinds or len(reply) < lengths.get(first, 1):
        raise UnexpectedReply(what, list(reply))
    return first


def words(reply: Any, what: str, kinds: Sequence[str]) -> list[str]:
    """A finish script's reply: one space-separated string, or a table, whose first word is
    one of ``kinds``."""
    parts = text(reply, what).split(" ") if isinstance(reply, str | bytes) else table(reply, what)
    if parts[0] not in kinds:
        raise UnexpectedReply(what, reply)
    return parts


def string_hash(reply: Any, what: str) -> dict[str, str]:
    """HGETALL's reply: a map of strings (redis-py has made the pairs a dict)."""
    if not isinstance(reply, dict):
        raise UnexpectedReply(what, reply)
    return {text(k, what): text(v, what) for k, v in reply.items()}


def fields(reply: Any, count: int, what: str) -> list[str | None]:
    """HMGET's reply: ``count`` strings or nils."""
    if not isinstance(reply, list) or len(reply) != count:
        raise UnexpectedReply(what, reply)
    return [None if v is None else text(v, what) for v in reply]


def optional_text(value: Any, what: str) -> str | None:
    """GET's reply: a string or nil."""
    return None if value is None else text(value, what)


def entries(reply: Any, what: str) -> list[tuple[str, dict[str, str]]]:
    """XRANGE's or XREVRANGE's reply: (id, fields) pairs."""
    if not isinstance(reply, list):
        raise UnexpectedReply(what, reply)
    out = []
    for entry in reply:
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise UnexpectedReply(what, entry)
        entry_id, body = entry
        out.append((text(entry_id, what), string_hash(body or {}, what)))
    return out


def members(reply: Any, what: str) -> list[str]:
    """SMEMBERS' or ZRANGE's reply: strings (a set arrives as a Python set)."""
    if not isinstance(reply, list | set):
        raise UnexpectedReply(what, reply)
    return [text(m, what) for m in reply]


def slot_member(value: Any) -> int | None:
    """A missed-slot ledger member (a slot, epoch seconds), or None for one no runner wrote."""
    try:
        number = float(text(value, "ledger"))
    except (UnexpectedReply, ValueError):
        return None
    if not number.is_integer() or not 0 <= number < 2**53:
        return None
    return int(number)


def answered(call: Callable[[], T], what: str) -> T:
    """``call``'s reply. redis-py turns some replies into Python values on the way (HGETALL's
    pairs into a dict, SMEMBERS' into a set), assuming Redis's shapes: a reply of another
    shape fails there, as a reply Redis never gives."""
    try:
        return call()
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise UnexpectedReply(what, f"{type(exc).__name__}: {exc}") from exc


# Epoch seconds a record can hold: before the year 10000, which every time library shows.
_LAST_TIME_S = 253_402_300_800


def stored_time(value: Any) -> float | None:
    """A time a record holds (epoch seconds), or None for one no runner wrote."""
    try:
        number = float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None
    if number is None or not 0 <= number < _LAST_TIME_S:  # also NaN
        return None
    return number


def stored_int(value: Any, *, time: bool = False) -> int | None:
    """A whole number a record holds (``time``: a slot, in epoch seconds), or None."""
    try:
        number = int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None
    if number is None or abs(number) >= 2**63 or (time and not 0 <= number < _LAST_TIME_S):
        return None
    return number
