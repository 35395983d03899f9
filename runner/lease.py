"""The lease: one Lua script per operation, each a single round trip on one hash slot.

Own-the-lock checks live inside Redis: renew, complete and release compare the token
first, and a stale holder gets ``LeaseNotOwned`` having changed nothing.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import NoScriptError

from runner import clock
from runner.errors import LeaseNotOwned
from runner.keys import TaskKeys

# KEYS: lease, fence[, slot marker]   ARGV: token, ttl_ms
# Re-entrant for the same token, so that a retry after a lost reply neither fails nor
# bumps the fence a second time.
ACQUIRE = """
if #KEYS == 3 then
  local done = redis.call('HMGET', KEYS[3], 'holder', 'finished_at')
  if done[1] then
    return {'done', done[1], done[2] or ''}
  end
end
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'acquired', tonumber(redis.call('GET', KEYS[2]) or '0')}
end
if current then
  return {'held', current, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {'acquired', redis.call('INCR', KEYS[2])}
"""

# KEYS: lease   ARGV: token, ttl_ms
RENEW = """
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'ok'}
end
return {'not_owner', current or ''}
"""

# KEYS: lease, runs, state[, slot marker]
# ARGV: token, runs_maxlen, retention_ms, then three field lists, each a count followed
#       by that many name/value pairs: run record, state fields, slot marker fields.
# With a slot marker key this is "complete"; without, "release". An empty token skips
# the owner check and the lease: that is "record", for outcomes whose lease is gone.
FINISH = """
local token = ARGV[1]
if token ~= '' then
  local current = redis.call('GET', KEYS[1])
  if current ~= token then
    -- A retry whose first reply was lost: this token already completed the slot.
    if #KEYS == 4 and redis.call('HGET', KEYS[4], 'token') == token then
      return {'ok'}
    end
    return {'not_owner', current or ''}
  end
  redis.call('DEL', KEYS[1])
end
local i = 4
local function pairs_at()
  local n = tonumber(ARGV[i])
  local out = {}
  for j = 1, 2 * n do out[j] = ARGV[i + j] end
  i = i + 2 * n + 1
  return out
end
local record = pairs_at()
local state = pairs_at()
local marker = pairs_at()
if #record > 0 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(record))
end
if #state > 0 then
  redis.call('HSET', KEYS[3], unpack(state))
end
if #KEYS == 4 and #marker > 0 then
  redis.call('HSET', KEYS[4], unpack(marker))
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
end
return {'ok'}
"""

# `cron-runner unlock`, the admin escape hatch. KEYS: lease, runs   ARGV: holder ('' deletes
# whoever holds it; else a holder id or a whole token, compared here, so a lease taken over
# since the admin looked is left alone), runs_maxlen, then the audit record's name/value pairs
# (the record also gets the removed token, as 'unlocked').
UNLOCK = """
local current = redis.call('GET', KEYS[1])
if not current then
  return {'free', ''}
end
if ARGV[1] ~= '' and current ~= ARGV[1] and string.match(current, '^(.*):[^:]*$') ~= ARGV[1] then
  return {'not_holder', current}
end
redis.call('DEL', KEYS[1])
if #ARGV > 2 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'unlocked', current, unpack(ARGV, 3))
end
return {'unlocked', current}
"""

Fields = Mapping[str, str | int | float]


class ScriptClient(Protocol):
    """What the lease needs of a client: ``redis.Redis`` and ``redis.RedisCluster`` both fit."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any: ...
    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any: ...


class Script:
    """EVALSHA with the digest computed locally; on NOSCRIPT one EVAL, which also caches it.

    redis-py's Script answers NOSCRIPT with SCRIPT LOAD + EVALSHA, one round trip more.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA-1

    def __call__(self, client: ScriptClient, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.source, len(keys), *keys, *args)


SCRIPTS = {
    name: Script(src) for name, src in [("acquire", ACQUIRE), ("renew", RENEW), ("finish", FINISH)]
}
# Not among the run's scripts: only an admin's unlock loads it.
UNLOCK_SCRIPT = Script(UNLOCK)


@dataclass(frozen=True)
class Acquired:
    fence: int


@dataclass(frozen=True)
class Held:
    token: str
    ttl_ms: int

    @property
    def holder(self) -> str:
        return holder_of(self.token)


@dataclass(frozen=True)
class SlotDone:
    holder: str
    finished_at: float | None


AcquireResult = Acquired | Held | SlotDone


def new_token(holder_id: str) -> str:
    """Holder identity, so `status` shows who holds it, plus randomness, so two are never equal."""
    return f"{holder_id}:{secrets.token_hex(8)}"


def holder_of(token: str) -> str:
    return token.rsplit(":", 1)[0] if ":" in token else token


def unlock(
    client: ScriptClient,
    keys: TaskKeys,
    record: Fields,
    *,
    holder: str | None = None,
    runs_maxlen: int = 1000,
) -> tuple[str, str | None]:
    """Delete the lease, whoever holds it or only if ``holder`` does, and record who did it.

    Returns ('unlocked' | 'free' | 'not_holder', the token found or None).
    """
    args: list[Any] = [holder or "", runs_maxlen]
    for name, value in record.items():
        args += [name, str(value)]
    reply = UNLOCK_SCRIPT(client, [keys.lease, keys.runs], args)
    token = _as_str(reply[1])
    return _as_str(reply[0]), token or None


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flatten(fields: Fields | None) -> list[str]:
    items = list((fields or {}).items())
    out = [str(len(items))]
    for name, value in items:
        out += [name, str(value)]
    return out


class Lease:
    """One holder's lease on one task. Every method is one round trip."""

    def __init__(
        self,
        client: ScriptClient,
        keys: TaskKeys,
        token: str,
        *,
        ttl_ms: int,
        retention_ms: int = 3_600_000,
        runs_maxlen: int = 1000,
    ) -> None:
        self.client = client
        self.keys = keys
        self.token = token
        self.ttl_ms = ttl_ms
        self.retention_ms = retention_ms
        self.runs_maxlen = runs_maxlen

    @property
    def holder(self) -> str:
        return holder_of(self.token)

    def acquire(self, slot: int | None) -> AcquireResult:
        keys = [self.keys.lease, self.keys.fence]
        if slot is not None:
            keys.append(self.keys.slot(slot))
        reply = SCRIPTS["acquire"](self.client, keys, [self.token, self.ttl_ms])
        kind = _as_str(reply[0])
        if kind == "acquired":
            return Acquired(fence=int(reply[1]))
        if kind == "held":
            return Held(token=_as_str(reply[1]), ttl_ms=int(reply[2]))
        finished = _as_str(reply[2])
        return SlotDone(holder=_as_str(reply[1]), finished_at=float(finished) if finished else None)

    def renew(self) -> None:
        reply = SCRIPTS["renew"](self.client, [self.keys.lease], [self.token, self.ttl_ms])
        self._check_owner("renew", reply)

    def complete(
        self, slot: int | None, record: Fields, state: Fields, marker: Fields | None = None
    ) -> None:
        """Success: delete the lease and, in the same step, mark the slot done and record the run.

        The marker always names the holder, the time and the token: acquire reads the first two,
        and a retried complete whose first reply was lost recognises its own token.
        """
        full_marker = {
            "holder": self.holder,
            "finished_at": f"{clock.wall():.3f}",
            **(marker or {}),
            "token": self.token,
        }
        self._finish("complete", slot, record, state, full_marker, token=self.token)

    def release(self, record: Fields, state: Fields) -> None:
        """Failure: delete the lease, write no slot marker (the retry may run it), record the run."""
        self._finish("release", None, record, state, None, token=self.token)

    def record(self, record: Fields, state: Fields) -> None:
        """Record an outcome whose lease is already gone (lost, or left to expire)."""
        self._finish("record", None, record, state, None, token="")

    def _finish(
        self,
        operation: str,
        slot: int | None,
        record: Fields,
        state: Fields,
        marker: Fields | None,
        *,
        token: str,
    ) -> None:
        keys = [self.keys.lease, self.keys.runs, self.keys.state]
        if slot is not None:
            keys.append(self.keys.slot(slot))
        args = [token, self.runs_maxlen, self.retention_ms]
        args += _flatten(record) + _flatten(state) + _flatten(marker)
        self._check_owner(operation, SCRIPTS["finish"](self.client, keys, args))

    @staticmethod
    def _check_owner(operation: str, reply: Any) -> None:
        if _as_str(reply[0]) != "ok":
            current = _as_str(reply[1])
            raise LeaseNotOwned(operation, holder_of(current) if current else None)
