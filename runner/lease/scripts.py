"""The lease: one Lua script per operation, each a single round trip on one hash slot.

Own-the-lock checks live inside Redis: renew, complete and release compare the token
first, and a stale holder gets ``LeaseNotOwned`` having changed nothing.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import NoScriptError, RedisError

from runner import clock
from runner.errors import (
    DefinitionConflict,
    FinishIncomplete,
    LeaseNotOwned,
    ProtocolRefused,
)
from runner.keys import TaskKeys

log = logging.getLogger("runner")

# The protocol this code speaks, and the oldest it shares a Redis with. Version 1 is b170e33
# and before, which stores no version; 2 keeps every key and field of 1, so they interoperate.
# A version whose keys or scripts cannot run beside older runners raises PROTOCOL_MIN: the
# runners that check (2 and later) then refuse to run, naming both (docs/design.md).
PROTOCOL = 2
PROTOCOL_MIN = 1

# KEYS: lease, fence, meta[, slot marker]
# ARGV: token, ttl_ms, protocol, protocol_min, definition ('' for a manual run), redefine ('1')
# Re-entrant for the same token, so that a retry after a lost reply neither fails nor
# bumps the fence a second time. The version and the definition are checked first: a runner
# refused by either changes nothing but the meta hash of a task that had none.
ACQUIRE = """
local meta = redis.call('HMGET', KEYS[3], 'protocol', 'protocol_min', 'definition')
local mine = tonumber(ARGV[3])
if mine < tonumber(meta[2] or '1') then
  return {'protocol', meta[1] or '', meta[2] or ''}
end
local definition = ARGV[5]
if definition ~= '' and meta[3] and meta[3] ~= definition and ARGV[6] ~= '1' then
  return {'definition', meta[3]}
end
local writes = {}
if not meta[1] or mine > tonumber(meta[1]) then
  writes = {'protocol', ARGV[3], 'protocol_min', ARGV[4]}
end
if definition ~= '' and meta[3] ~= definition then
  writes[#writes + 1] = 'definition'
  writes[#writes + 1] = definition
end
if #writes > 0 then
  redis.call('HSET', KEYS[3], unpack(writes))
end
if #KEYS == 4 then
  local done = redis.call('HMGET', KEYS[4], 'holder', 'finished_at')
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
-- The key does not exist, so this changes nothing; but an ACL without PEXPIRE refuses it
-- here, before the task starts, rather than at every renewal until the lease is lost.
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
-- Never below the server's clock in milliseconds: a counter lost with Redis's data (a restart
-- without persistence, a failover to a lagging replica) starts again above every fence handed
-- out before, as long as that clock has moved on since.
local now = redis.call('TIME')
local floor = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local fence = redis.call('INCR', KEYS[2])
if fence < floor then
  fence = floor
  redis.call('SET', KEYS[2], string.format('%d', floor))
end
return {'acquired', fence}
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
# ARGV: token, runs_maxlen, retention_ms, fence ('' writes the state unguarded), then three
#       field lists, each a count followed
#       by that many name/value pairs: run record, state fields, slot marker fields.
# With a slot marker key this is "complete"; without, "release". An empty token skips
# the owner check and the lease: that is "record", for outcomes whose lease is gone.
#
# All or nothing where it matters: Redis does not roll a script back, so every write is a
# pcall and the order decides what a failure leaves. The marker is written first and the
# lease deleted only once it is safe; if the marker cannot be written, the lease is kept for
# the marker's retention instead, so the slot that ran is never run again. The state hash is
# written only by a fence at least as high as the last one there: a stale holder cannot
# overwrite a newer holder's state. Reply: 'ok' or 'partial', then 'marked' | 'kept' | '',
# then '1' if the state was left to a newer fence, then each failed write.
FINISH = """
local failed = {}
local function try(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    local call = {...}
    failed[#failed + 1] = call[1] .. ' ' .. call[2] .. ': ' .. reply.err
    return nil
  end
  return reply
end
local token = ARGV[1]
local owner = false
if token ~= '' then
  local current = try('GET', KEYS[1])
  if current ~= nil and current ~= token then
    -- A retry whose first reply was lost: this token already completed the slot.
    if #KEYS == 4 and redis.pcall('HGET', KEYS[4], 'token') == token then
      return {'ok', 'marked', ''}
    end
    return {'not_owner', current or ''}
  end
  -- nil: the lease could not be read, so it is not deleted; a success still marks its slot.
  owner = current ~= nil
end
local i = 5
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
local marked = ''
if #KEYS == 4 and #marker > 0 then
  if try('HSET', KEYS[4], unpack(marker)) then
    marked = 'marked'
    try('PEXPIRE', KEYS[4], ARGV[3])
  elseif owner and try('PEXPIRE', KEYS[1], ARGV[3]) then
    marked = 'kept'
  end
  owner = owner and marked == 'marked'
end
if owner then
  try('DEL', KEYS[1])
end
if #record > 0 then
  try('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(record))
end
local stale = ''
if #state > 0 then
  local last = try('HGET', KEYS[3], 'last_fence')
  if last ~= nil then
    if ARGV[4] == '' or tonumber(ARGV[4]) >= (tonumber(last) or 0) then
      try('HSET', KEYS[3], unpack(state))
    else
      stale = '1'
    end
  end
end
if #failed > 0 then
  return {'partial', marked, stale, unpack(failed)}
end
-- Whether the task is in its scope's index yet (Lease.index: once per task). Read with
-- pcall: a refusal here must not turn a finished run into a partial one.
local indexed = redis.pcall('HGET', KEYS[3], 'indexed')
if type(indexed) ~= 'string' then
  indexed = type(indexed) == 'table' and '?' or ''
end
return {'ok', marked, stale, indexed}
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

    @property
    def slot(self) -> int | None:
        return slot_of(self.token)


@dataclass(frozen=True)
class SlotDone:
    holder: str
    finished_at: float | None


AcquireResult = Acquired | Held | SlotDone


@dataclass(frozen=True)
class Finished:
    """What a finish script left: the state hash unwritten because a newer fence wrote it."""

    stale_state: bool = False


def new_token(holder_id: str, slot: int | None = None) -> str:
    """Holder identity, so `status` shows who holds it, plus randomness, so two are never equal,
    plus the slot it runs, so that a runner of the same slot can tell it waits for its own.

    The slot follows a '/', never a ':': b170e33 reads the holder as everything before the last
    ':' (holder_of, and the unlock script), so its runners still name the holder right. The part
    after that colon also starts with when the run took the lease (milliseconds, in hex, before
    a dot), so `status`, `serve` and the watchdog can tell how long it has run without a write
    of its own; a token without the dot (b170e33's) has no start time.
    """
    token = f"{holder_id}:{int(clock.wall() * 1000):x}.{secrets.token_hex(8)}"
    return token if slot is None else f"{token}/{slot}"


def holder_of(token: str) -> str:
    return token.rsplit(":", 1)[0] if ":" in token else token


def slot_of(token: str) -> int | None:
    """The slot a token was taken for; None for a manual run, or a token of b170e33."""
    _, sep, tail = token.rpartition(":")
    _, slash, slot = tail.partition("/")
    return int(slot) if sep and slash and slot.isascii() and slot.isdigit() else None


def started_at_of(token: str) -> float | None:
    """When the lease of ``token`` was taken (epoch seconds), or None for an older token."""
    stamp, dot, _ = token.rpartition(":")[2].partition(".")
    if not dot:
        return None
    try:
        return int(stamp, 16) / 1000
    except ValueError:
        return None


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
    """One holder's lease on one task. Every method is one round trip.

    ``definition`` is the task's definition (schedule, time zone, mode, command or task), ''
    for a manual run: acquire compares it with the one stored and refuses a different one,
    unless ``redefine`` replaces it.
    """

    def __init__(
        self,
        client: ScriptClient,
        keys: TaskKeys,
        token: str,
        *,
        ttl_ms: int,
        retention_ms: int = 3_600_000,
        runs_maxlen: int = 1000,
        definition: str = "",
        redefine: bool = False,
        indexed: bool = True,
    ) -> None:
        self.client = client
        self.indexed = indexed  # False: a scratch task (check), kept out of the scope's index
        self.keys = keys
        self.token = token
        self.ttl_ms = ttl_ms
        self.retention_ms = retention_ms
        self.runs_maxlen = runs_maxlen
        self.definition = definition
        self.redefine = redefine
        self.fence = 0

    @property
    def holder(self) -> str:
        return holder_of(self.token)

    def acquire(self, slot: int | None) -> AcquireResult:
        keys = [self.keys.lease, self.keys.fence, self.keys.meta]
        if slot is not None:
            keys.append(self.keys.slot(slot))
        args = [self.token, self.ttl_ms, PROTOCOL, PROTOCOL_MIN, self.definition,
                "1" if self.redefine else ""]  # fmt: skip
        reply = SCRIPTS["acquire"](self.client, keys, args)
        kind = _as_str(reply[0])
        if kind == "acquired":
            self.fence = int(reply[1])
            return Acquired(fence=self.fence)
        if kind == "held":
            return Held(token=_as_str(reply[1]), ttl_ms=int(reply[2]))
        if kind == "protocol":
            raise ProtocolRefused(PROTOCOL, _as_str(reply[1]), _as_str(reply[2]), self.keys.meta)
        if kind == "definition":
            raise DefinitionConflict(self.definition, _as_str(reply[1]), self.keys.meta)
        finished = _as_str(reply[2])
        return SlotDone(holder=_as_str(reply[1]), finished_at=float(finished) if finished else None)

    def renew(self) -> None:
        reply = SCRIPTS["renew"](self.client, [self.keys.lease], [self.token, self.ttl_ms])
        self._check_owner("renew", reply)

    def complete(
        self,
        slot: int | None,
        record: Fields,
        state: Fields,
        marker: Fields | None = None,
        *,
        retention_ms: int | None = None,
    ) -> Finished:
        """Success: mark the slot done and only then delete the lease, recording the run.

        The marker always names the holder, the time and the token: acquire reads the first two,
        and a retried complete whose first reply was lost recognises its own token. It is kept
        ``retention_ms`` (default the lease's ``retention_ms``).
        """
        full_marker = {
            "holder": self.holder,
            "finished_at": f"{clock.wall():.3f}",
            **(marker or {}),
            "token": self.token,
        }
        return self._finish(
            "complete",
            slot,
            record,
            state,
            full_marker,
            token=self.token,
            retention_ms=retention_ms,
        )

    def release(self, record: Fields, state: Fields) -> Finished:
        """Failure: delete the lease, write no slot marker (the retry may run it), record the run."""
        return self._finish("release", None, record, state, None, token=self.token)

    def record(self, record: Fields, state: Fields, *, fenced: bool = True) -> Finished:
        """Record an outcome whose lease is already gone (lost, or left to expire).

        ``fenced=False`` is for a queue worker's result: it holds no lease, and the job it ran
        carries the fence of the enqueue that sent it, which a later enqueue may have passed.
        """
        return self._finish("record", None, record, state, None, token="", fenced=fenced)

    def _finish(
        self,
        operation: str,
        slot: int | None,
        record: Fields,
        state: Fields,
        marker: Fields | None,
        *,
        token: str,
        fenced: bool = True,
        retention_ms: int | None = None,
    ) -> Finished:
        retention_ms = self.retention_ms if retention_ms is None else retention_ms
        keys = [self.keys.lease, self.keys.runs, self.keys.state]
        if slot is not None:
            keys.append(self.keys.slot(slot))
        # The state hash takes the fence of the state written, else this lease's own.
        fence = state.get("last_fence", self.fence) if fenced else ""
        args = [token, self.runs_maxlen, retention_ms, fence]
        args += _flatten(record) + _flatten(state) + _flatten(marker)
        reply = SCRIPTS["finish"](self.client, keys, args)
        self._check_owner(operation, reply)
        marked, stale = _as_str(reply[1]), _as_str(reply[2]) == "1"
        if _as_str(reply[0]) == "partial":
            failed = [_as_str(x) for x in reply[3:]]
            raise FinishIncomplete(operation, failed, marked, slot, retention_ms)
        # A retried complete answers without the fourth field: its first try indexed the task.
        # Only a run that writes the state hash makes the task known (not a too_late record).
        if self.indexed and state and len(reply) > 3 and not _as_str(reply[3]):
            try:
                self.index()
            except RedisError as exc:  # the run is over and recorded: only `status` misses it
                log.warning(
                    f"could not add {self.keys.task} to the scope's task index "
                    f"{self.keys.index} ({exc}): `status` and `watchdog` under an ACL "
                    "without +scan will not list it (the ACL needs +sadd)",
                    extra={"event": "index_failed", "task": self.keys.task},
                )
        return Finished(stale_state=stale)

    def index(self) -> None:
        """Add the task to its scope's index, then mark it so in its state hash: once per
        task, and again if the first try failed between the two. Two key slots, so not in
        the script; one round trip for both, as a pipeline (on Cluster, one per node)."""
        pipe: Any = self.client.pipeline(transaction=False)  # type: ignore[attr-defined]
        pipe.sadd(self.keys.index, self.keys.task)
        pipe.hset(self.keys.state, "indexed", "1")
        pipe.execute()

    @staticmethod
    def _check_owner(operation: str, reply: Any) -> None:
        if _as_str(reply[0]) not in ("ok", "partial"):
            current = _as_str(reply[1])
            raise LeaseNotOwned(operation, holder_of(current) if current else None)
