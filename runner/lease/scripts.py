"""The lease: one Lua script per operation, each a single round trip on one hash slot.

Own-the-lock checks live inside Redis: renew, complete and release compare the token
first, and a stale holder gets ``LeaseNotOwned`` having changed nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from redis import VERSION as REDIS_VERSION
from redis import Redis
from redis.exceptions import NoScriptError, RedisError

from runner import clock
from runner.config.settings import ALLOW_OTHER_SLOTS, BUFFER_ONE, OVERLAPS, REPLACE, SKIP
from runner.errors import (
    CorruptRecord,
    DefinitionConflict,
    FinishIncomplete,
    LeaseNotOwned,
    Preempted,
    ProtocolRefused,
)
from runner.keys import TaskKeys
from runner.lease import replies

log = logging.getLogger("runner")

# The protocol this code speaks, and the oldest it shares a Redis with. Version 1 is b170e33
# and before, which stores no version; 2 keeps every key and field of 1, so they interoperate.
# A version whose keys or scripts cannot run beside older runners raises PROTOCOL_MIN: the
# runners that check (2 and later) then refuse to run, naming both (docs/design.md).
#
# 3 adds the overlap policies, pause and catch-up. Its skip policy keeps every key of 1 and 2,
# so it runs beside them (minimum 1); every other policy, and a pause, needs runners that know
# it: they raise the task's minimum to 3 (PROTOCOL_MIN_OVERLAP), and 2 refuses from then on.
PROTOCOL = 3
PROTOCOL_MIN = 1
PROTOCOL_MIN_OVERLAP = 3

# The overlap policies (docs/design.md, Overlap policies), by the names the scripts use.
_WIRE = {SKIP: "", BUFFER_ONE: "buffer", REPLACE: "replace", ALLOW_OTHER_SLOTS: "slots"}

# Why a held reply did not give the lease (Held.note).
SUPERSEDED = "superseded"  # a later slot waits or runs: this one never will (recorded)
BUFFERED = "buffered"  # buffer-one: this slot is the one that waits
PREEMPTING = "preempting"  # replace: the holder was asked to stop
GAVE_UP = "gave_up"  # the last look of a wait found it still held (recorded)

# KEYS: lease (the slot's own under allow-other-slots), fence, meta, runs[, slot marker]
#       [, aux: buffer (buffer-one), preempt (replace), the task's lease (allow-other-slots)]
#       [, the catch-up candidates' markers...]
# ARGV: 1 token, 2 ttl_ms, 3 protocol, 4 protocol_min, 5 definition ('' for a manual run),
#       6 redefine ('1'), 7 policy ('' | 'buffer' | 'replace' | 'slots'), 8 slot ('' manual),
#       9 the aux key's expiry (ms), 10 a skip counter's expiry (ms), 11 final ('1': the last
#       look of a wait, so a held reply is a skip to record), 12 runs_maxlen, 13 how many
#       catch-up candidates, then their slots (oldest first), then the skip record's pairs.
# Re-entrant for the same token, so that a retry after a lost reply neither fails nor
# bumps the fence a second time. The version and the definition are checked first: a runner
# refused by either changes nothing but the meta hash of a task that had none.
#
# A skip is counted on the slot's marker (one counter per slot, whatever the replicas), and a
# slot that does not run because of another slot, the policy or a pause is put in the run
# stream once (HSETNX 'skipped'). These are pcalls: an ACL without the command must not turn
# a skip into an error, and the marker's 'holder' alone still says whether the slot ran.
# Reply: the fence, a bare integer, when acquired (with catch-up candidates, a table:
# 'acquired', the fence, the unrun ones), else a table naming why not.
#
# Every step of the common path costs Redis time at each run (bench/README.md): a stored
# version equal to ours is told apart as a string before tonumber's strtod, TIME is asked
# only when a clock is needed, and a pause's note and author only when paused.
ACQUIRE = """
local meta = redis.call('HMGET', KEYS[3], 'protocol', 'protocol_min', 'definition', 'since',
  'paused', 'paused_until', 'protocol_min_before_pause')
local stored, stored_min = meta[1], meta[2]
-- A version that is not a number was not written by a runner: a corrupted record, which no
-- retry mends (looked at only when it differs from ours, as below).
if stored and stored ~= ARGV[3] and not tonumber(stored) then
  return {'corrupt', KEYS[3], 'protocol', stored}
end
if stored_min and stored_min ~= ARGV[4] and stored_min ~= ARGV[3] and not tonumber(stored_min) then
  return {'corrupt', KEYS[3], 'protocol_min', stored_min}
end
-- Strings first: a stored version equal to ours needs no tonumber (a strtod each).
if stored_min and stored_min ~= ARGV[4] and stored_min ~= ARGV[3]
    and tonumber(ARGV[3]) < tonumber(stored_min) then
  return {'protocol', stored or '', stored_min}
end
local definition = ARGV[5]
if definition ~= '' and meta[3] and meta[3] ~= definition and ARGV[6] ~= '1' then
  return {'definition', meta[3]}
end
local now_ms
local function now()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
  end
  return now_ms
end
local paused = meta[5] == '1'
local until_s = paused and tonumber(meta[6] or '')
local resumed = until_s and now() >= until_s * 1000
if resumed then paused = false end
local writes
local function write(name, value)
  writes = writes or {}
  writes[#writes + 1] = name
  writes[#writes + 1] = value
end
if stored ~= ARGV[3] and (not stored or tonumber(ARGV[3]) > tonumber(stored)) then
  write('protocol', ARGV[3])
end
-- The minimum never goes down, but for the one a pause raised, which its end puts back.
local want_min = ARGV[4]
if resumed then
  write('protocol_min', string.format('%d', math.max(tonumber(meta[7] or '') or 1, tonumber(want_min))))
elseif stored_min ~= want_min and (not stored_min or tonumber(want_min) > tonumber(stored_min)) then
  write('protocol_min', want_min)
end
if paused and meta[7] and tonumber(want_min) > (tonumber(meta[7]) or 1) then
  write('protocol_min_before_pause', want_min)
end
if definition ~= '' and meta[3] ~= definition then
  write('definition', definition)
end
if not meta[4] then
  write('since', string.format('%d', now()))
end
if writes then
  redis.call('HSET', KEYS[3], unpack(writes))
end
if resumed then
  -- A pause with an end, over: the first run after it resumes the task for everyone. Without
  -- +hdel the fields stay, and every run reads the pause as over, as here.
  redis.pcall('HDEL', KEYS[3], 'paused', 'paused_until', 'paused_note', 'paused_by',
    'paused_at', 'protocol_min_before_pause')
end
local slot = ARGV[8]
local own = tonumber(slot)
local policy = ARGV[7]
local k = 5
local marker, aux
if own then
  marker = KEYS[k]
  k = k + 1
end
if policy ~= '' then
  aux = KEYS[k]
  k = k + 1
end
local ncatch = tonumber(ARGV[13])
local function skipped(outcome, reason)
  if not marker then return end
  redis.pcall('HINCRBY', marker, 'skips', 1)
  if redis.pcall('PTTL', marker) == -1 then
    redis.pcall('PEXPIRE', marker, ARGV[10])
  end
  if outcome ~= '' and redis.pcall('HSETNX', marker, 'skipped', outcome) == 1 then
    redis.pcall('XADD', KEYS[4], 'MAXLEN', '~', ARGV[12], '*', 'outcome', outcome,
      'error', reason, unpack(ARGV, 14 + ncatch))
  end
end
-- Acquired: the bare fence, or with catch-up candidates unrun, a table of it and them.
local function acquired(fence)
  if ncatch == 0 then return fence end
  local reply = {'acquired', fence}
  -- Slots before this release's first run of the task are not missed: they are its history.
  local since = tonumber(meta[4] or '') or now()
  for j = 1, ncatch do
    local s = ARGV[13 + j]
    if tonumber(s) * 1000 >= since then
      local m = redis.call('HMGET', KEYS[k + j - 1], 'holder', 'skipped')
      if not m[1] and not m[2] then
        reply[#reply + 1] = s
      end
    end
  end
  return reply
end
if marker then
  local done = redis.call('HMGET', marker, 'holder', 'finished_at')
  if done[1] then
    skipped('', '')
    return {'done', done[1], done[2] or ''}
  end
end
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return acquired(tonumber(redis.call('GET', KEYS[2]) or '0'))
end
if paused then
  local p = redis.call('HMGET', KEYS[3], 'paused_note', 'paused_by', 'paused_at')
  local note = p[1] or ''
  skipped('paused', 'paused by ' .. (p[2] or '?') .. (note ~= '' and (': ' .. note) or ''))
  return {'paused', note, p[2] or '', p[3] or '', meta[6] or ''}
end
-- The slot a token was taken for: after its last ':', past a '/'. None for a manual run or a
-- token of b170e33.
local held_slot = current and tonumber(string.match(current, ':[^:]*/(%d+)$') or '')
local function holder(token)
  return string.match(token, '^(.*):[^:]*$') or token
end
local function superseded(by)
  skipped('skipped_held', 'superseded: a run of the later slot ' .. by .. ' waits or ran')
  return {'held', current or '', current and redis.call('PTTL', KEYS[1]) or 0, 'superseded'}
end
local asking
-- A run of this very slot holds the lease: this runner waits for it as for any holder of its
-- own slot, and the slot is not superseded, whatever waits behind it.
if own and held_slot ~= own and (policy == 'buffer' or policy == 'replace') then
  -- An older slot never runs after a newer one has waited or run.
  if held_slot and held_slot > own then
    return superseded(held_slot)
  end
  if policy == 'buffer' then
    asking = tonumber(redis.call('GET', aux) or '')
  else
    asking = tonumber(string.match(redis.call('GET', aux) or '', '^(%d+) ') or '')
  end
  if asking and asking > own then
    return superseded(asking)
  end
end
if own and policy == 'slots' then
  -- The task's lease held by a run of this slot, or by a token that names none (a manual run,
  -- a runner of b170e33, which takes the task's lease for any slot): this slot may be running.
  local shown = redis.call('GET', aux)
  if shown and shown ~= ARGV[1] then
    local shown_slot = tonumber(string.match(shown, ':[^:]*/(%d+)$') or '')
    if not shown_slot or shown_slot == own then
      skipped('', '')
      return {'held', shown, redis.call('PTTL', aux), ''}
    end
  end
end
if current then
  local pttl = redis.call('PTTL', KEYS[1])
  if own and held_slot == own then
    return {'held', current, pttl, ''}
  end
  if own and (policy == 'buffer' or policy == 'replace') then
    if ARGV[11] == '1' then
      skipped('skipped_held', 'held by ' .. holder(current) .. ' past the overlap wait')
      return {'held', current, pttl, 'gave_up'}
    end
    if policy == 'buffer' then
      redis.call('SET', aux, slot, 'PX', ARGV[9])
      return {'held', current, pttl, 'buffered'}
    end
    redis.call('SET', aux, slot .. ' ' .. ARGV[1], 'PX', ARGV[9])
    return {'held', current, pttl, 'preempting'}
  end
  if own and (held_slot or string.match(current, ':[0-9a-f]+%.[0-9a-f]+$')) then
    local what = held_slot and ('the slot ' .. held_slot) or 'a manual run'
    skipped('skipped_held', 'held by ' .. holder(current) .. ' for ' .. what)
  elseif own then
    -- A token of b170e33 names no slot: it may be running this one, so nothing is recorded.
    skipped('', '')
  end
  return {'held', current, pttl, ''}
end
if own and policy == 'buffer' then
  redis.call('SET', aux, slot, 'PX', ARGV[9])
elseif asking then
  redis.call('DEL', aux)
end
-- The key does not exist, so this changes nothing; but an ACL without PEXPIRE refuses it
-- here, before the task starts, rather than at every renewal until the lease is lost.
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if policy == 'slots' and not redis.call('GET', aux) then
  -- The task's own lease shows one run of it while any runs: status, serve, the watchdog.
  redis.call('SET', aux, ARGV[1], 'PX', ARGV[2])
end
-- Never below the server's clock in milliseconds: a counter lost with Redis's data (a restart
-- without persistence, a failover to a lagging replica) starts again above every fence handed
-- out before, as long as that clock has moved on since.
local fence = redis.pcall('INCR', KEYS[2])
if type(fence) == 'table' then
  if not (string.find(fence.err, 'WRONGTYPE') or string.find(fence.err, 'not an integer')) then
    return redis.error_reply(fence.err)  -- an ACL refusal, as before
  end
  -- Not an integer, or not a string: a corrupted fence, which no retry mends. The lease just
  -- taken is given back: nothing runs on it.
  redis.call('DEL', KEYS[1])
  if policy == 'slots' and redis.call('GET', aux) == ARGV[1] then redis.call('DEL', aux) end
  return {'corrupt', KEYS[2], '', fence.err}
end
if fence < now() then
  fence = now_ms
  redis.call('SET', KEYS[2], string.format('%d', now_ms))
end
return acquired(fence)
"""

# KEYS: lease[, aux: preempt (replace), the task's lease (allow-other-slots)]
# ARGV: token, ttl_ms, policy, slot ('' manual)
# Under replace the renewal keeps the lease and answers 'preempted' while a run of a newer
# slot asks for it: the holder stops its task as on a stop request, still holding it.
RENEW = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return {'not_owner', current or ''}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[3] == 'replace' then
  local asking = redis.call('GET', KEYS[2])
  if asking then
    local s, who = string.match(asking, '^(%d+) (.*)$')
    local own = tonumber(ARGV[4])
    if s and (not own or tonumber(s) > own) then
      return {'preempted', who, s}
    end
  end
elseif ARGV[3] == 'slots' then
  local shown = redis.pcall('GET', KEYS[2])
  if shown == ARGV[1] then
    redis.pcall('PEXPIRE', KEYS[2], ARGV[2])
  elseif not shown then
    redis.pcall('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  end
end
return {'ok'}
"""

# KEYS: lease, runs, state, meta[, slot marker][, the task's lease (allow-other-slots)]
# ARGV: 1 token, 2 runs_maxlen, 3 retention_ms, 4 fence ('' writes the state unguarded),
#       5 keep ('1': mark the slot and keep the lease, for a caught-up slot while the run goes
#       on), 6 '1' if a slot marker key is given, 7 '1' if the task's lease is given,
#       8 failures ('count' | 'reset' | ''), 9 pause after this many consecutive failures
#       (0: never), 10 who pauses (the holder), 11 the protocol minimum while paused,
#       12 how many name/value pairs the run record has, 13 how many the state has, then
#       those pairs; with a slot marker, then its holder and finished_at and any other
#       name/value pairs (the script names the first two and adds the token: each argument
#       costs the client's packer and Redis's parser, bench/README.md).
# With a slot marker key this is "complete"; without, "release". An empty token skips
# the owner check and the lease: that is "record", for outcomes whose lease is gone.
#
# All or nothing where it matters: Redis does not roll a script back, so every write is a
# pcall and the order decides what a failure leaves. The marker is written first and the
# lease deleted only once it is safe; if the marker cannot be written, the lease is kept for
# the marker's retention instead, so the slot that ran is never run again. The state hash is
# written only by a fence at least as high as the last one there: a stale holder cannot
# overwrite a newer holder's state.
# Reply: one space-separated string, cheaper for Redis than a table: 'ok', then 'marked' |
# 'kept' | '', then '1' if the state was left to a newer fence, then the task's 'indexed'
# field, then 'paused' when this failure paused the task ('ok marked' alone: a retry whose
# first try did it all). When a write failed, a table: 'partial', the same two, then each
# failed write; when the lease is another's, {'not_owner', its token}.
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
local k = 5
local marker, shown
if ARGV[6] == '1' then
  marker = KEYS[k]
  k = k + 1
end
if ARGV[7] == '1' then
  shown = KEYS[k]
end
local token = ARGV[1]
local keep = ARGV[5] == '1'
local owner = false
if token ~= '' then
  local current = try('GET', KEYS[1])
  -- A retry whose first reply was lost: this token already completed the slot.
  if marker and (keep or (current ~= nil and current ~= token)) then
    if try('HGET', marker, 'token') == token then
      return 'ok marked'
    end
    -- Refused (an ACL without +hget): a retry must not pass for another's lease.
    if #failed > 0 then
      return {'partial', '', '', unpack(failed)}
    end
  end
  if current ~= nil and current ~= token then
    return {'not_owner', current or ''}
  end
  -- nil: the lease could not be read, so it is not deleted; a success still marks its slot.
  owner = current ~= nil
end
-- The field lists are passed on with unpack, never copied into tables of their own.
local state_at = 14 + 2 * ARGV[12]
local marker_at = state_at + 2 * ARGV[13]
local marked = ''
if marker and marker_at < #ARGV then
  if try('HSET', marker, 'holder', ARGV[marker_at], 'finished_at', ARGV[marker_at + 1],
         'token', token, unpack(ARGV, marker_at + 2)) then
    marked = 'marked'
    try('PEXPIRE', marker, ARGV[3])
  elseif owner and not keep and try('PEXPIRE', KEYS[1], ARGV[3]) then
    marked = 'kept'
  end
  owner = owner and marked == 'marked'
end
if owner and not keep then
  try('DEL', KEYS[1])
  if shown and redis.pcall('GET', shown) == token then
    redis.pcall('DEL', shown)
  end
end
if state_at > 14 then
  try('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 14, state_at - 1))
end
-- One read of the state hash for the fence guard, the failure count and the index mark. Read
-- with pcall when there is no state to write: a refusal then must not make the run partial.
local st
if marker_at > state_at then
  st = try('HMGET', KEYS[3], 'last_fence', 'consecutive_failures', 'indexed')
else
  st = redis.pcall('HMGET', KEYS[3], 'last_fence', 'consecutive_failures', 'indexed')
  if type(st) == 'table' and st.err then st = {false, false, '?'} end
end
local stale = ''
if st and marker_at > state_at then
  if ARGV[4] == '' or tonumber(ARGV[4]) >= (tonumber(st[1]) or 0) then
    try('HSET', KEYS[3], unpack(ARGV, state_at, marker_at - 1))
  else
    stale = '1'
  end
end
-- Pause after N consecutive failures: counted in the state hash, and at N the task is paused
-- as `cron-runner pause` pauses it (the protocol minimum raised, the one before kept).
local paused = ''
if ARGV[8] == 'count' then
  local n = redis.pcall('HINCRBY', KEYS[3], 'consecutive_failures', 1)
  local limit = tonumber(ARGV[9]) or 0
  if type(n) == 'number' and limit > 0 and n >= limit then
    local m = redis.pcall('HMGET', KEYS[4], 'paused', 'protocol_min')
    if type(m) == 'table' and not m.err and m[1] ~= '1' then
      local now = redis.call('TIME')
      local fields = {'paused', '1', 'paused_note', 'paused after ' .. n .. ' consecutive failures',
        'paused_by', ARGV[10], 'paused_at', now[1] .. string.format('.%03d', math.floor(now[2] / 1000)),
        'paused_until', '', 'protocol_min_before_pause', m[2] or '1'}
      if (tonumber(m[2] or '1') or 1) < tonumber(ARGV[11]) then
        fields[#fields + 1] = 'protocol_min'
        fields[#fields + 1] = ARGV[11]
      end
      if try('HSET', KEYS[4], unpack(fields)) then
        paused = 'paused'
      end
    end
  end
elseif ARGV[8] == 'reset' and st and st[2] and st[2] ~= '0' then
  redis.pcall('HSET', KEYS[3], 'consecutive_failures', '0')
end
if #failed > 0 then
  return {'partial', marked, stale, unpack(failed)}
end
-- Whether the task is in its scope's index yet (Lease.index: once per task).
local indexed = st and st[3] or (st and '' or '?')
return 'ok ' .. marked .. ' ' .. stale .. ' ' .. indexed .. ' ' .. paused
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
        return self.run(client, len(keys), [*keys, *args])

    def run(self, client: ScriptClient, numkeys: int, keys_and_args: list[Any]) -> Any:
        """The lease's hot path: the caller builds one list of keys and arguments."""
        if type(client) is Redis and client.connection is None:
            try:
                return _direct(client, "EVALSHA", self.sha, numkeys, *keys_and_args)
            except NoScriptError:
                return _direct(client, "EVAL", self.source, numkeys, *keys_and_args)
        try:
            return client.evalsha(self.sha, numkeys, *keys_and_args)
        except NoScriptError:
            return client.eval(self.source, numkeys, *keys_and_args)


# redis-py 5.3 deprecated get_connection's arguments, which 5.2 requires.
_GET_CONNECTION_ARGS: tuple[str, ...] = () if REDIS_VERSION >= (5, 3) else ("EVALSHA",)


def _direct(client: Redis, *command: Any) -> Any:
    """One command on a pooled connection of a plain ``redis.Redis`` (a standalone Redis),
    without the client's per-command machinery: its retry wrapper and response callbacks (EVAL
    has none) cost a run's two scripts more client CPU than their packing and parsing
    (bench/README.md). The connection still checks its health, and disconnects itself on any
    error mid-command, as under the client; runner.lease.store retries. Any other client keeps
    its own path: Cluster, one on a single connection, and runner.lease.store's
    SentinelPrimary, whose execute_command asks the sentinels for the primary first."""
    pool = client.connection_pool
    conn = pool.get_connection(*_GET_CONNECTION_ARGS)
    try:
        conn.send_command(*command)
        return conn.read_response()
    finally:
        pool.release(conn)


SCRIPTS = {
    name: Script(src) for name, src in [("acquire", ACQUIRE), ("renew", RENEW), ("finish", FINISH)]
}
_ACQUIRE, _RENEW, _FINISH = SCRIPTS["acquire"], SCRIPTS["renew"], SCRIPTS["finish"]
# Not among the run's scripts: only an admin's unlock loads it.
UNLOCK_SCRIPT = Script(UNLOCK)


# The results are named tuples, not frozen dataclasses: a CronJob pod imports this module at
# every start, where a frozen dataclass costs about 1 ms to create, a named tuple 0.2.
class Acquired(NamedTuple):
    fence: int
    # Catch-up candidates the script found unrun (no marker with a holder, none skipped), as
    # they were given: oldest first.
    unrun: tuple[int, ...] = ()


class Held(NamedTuple):
    token: str
    ttl_ms: int
    # Why this reply did not give the lease: '' (held), SUPERSEDED, BUFFERED, PREEMPTING, GAVE_UP.
    note: str = ""

    @property
    def holder(self) -> str:
        return holder_of(self.token)

    @property
    def slot(self) -> int | None:
        return slot_of(self.token)


class SlotDone(NamedTuple):
    holder: str
    finished_at: float | None


class Paused(NamedTuple):
    """The task is paused (``cron-runner pause``, or after consecutive failures)."""

    note: str
    by: str
    at: float | None
    until: float | None  # None: until resumed


AcquireResult = Acquired | Held | SlotDone | Paused

# What an acquire's table may name first (ACQUIRE's replies), and how long each is at least.
_ACQUIRE_KINDS = ("acquired", "held", "protocol", "definition", "paused", "done", "corrupt")
_ACQUIRE_LENGTHS = {"acquired": 2, "held": 4, "protocol": 3, "definition": 2, "paused": 5,
                    "done": 3, "corrupt": 4}  # fmt: skip
_RENEW_LENGTHS = {"not_owner": 2, "preempted": 3}


class Finished(NamedTuple):
    """What a finish script left: the state hash unwritten because a newer fence wrote it, and
    whether this failure paused the task (pause after consecutive failures)."""

    stale_state: bool = False
    paused: bool = False


def new_token(holder_id: str, slot: int | None = None) -> str:
    """Holder identity, so `status` shows who holds it, plus randomness, so two are never equal,
    plus the slot it runs, so that a runner of the same slot can tell it waits for its own.

    The slot follows a '/', never a ':': b170e33 reads the holder as everything before the last
    ':' (holder_of, and the unlock script), so its runners still name the holder right. The part
    after that colon also starts with when the run took the lease (milliseconds, in hex, before
    a dot), so `status`, `serve` and the watchdog can tell how long it has run without a write
    of its own; a token without the dot (b170e33's) has no start time.
    """
    # os.urandom is what secrets.token_hex reads; the secrets module costs every start 0.4 ms.
    token = f"{holder_id}:{int(clock.wall() * 1000):x}.{os.urandom(8).hex()}"
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
    reply = replies.table(UNLOCK_SCRIPT(client, [keys.lease, keys.runs], args), "unlock", min_len=2)
    replies.kind(reply, ("unlocked", "free", "not_holder"), "unlock", {})
    return reply[0], reply[1] or None


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def status_of(reply: Any) -> list[str]:
    """A finish script's reply as strings: its one space-separated string, or its table."""
    status = replies.words(reply, "finish", ("ok", "partial", "not_owner"))
    if status[0] != "ok" and len(status) < (3 if status[0] == "partial" else 2):
        raise replies.UnexpectedReply("finish", reply)
    return status


def _add_pairs(out: list[Any], fields: Fields) -> None:
    for name, value in fields.items():
        out.append(name)
        out.append(value if type(value) is str else str(value))


def finish(
    client: ScriptClient,
    keys: TaskKeys,
    *,
    lease_key: str,
    token: str,
    runs_maxlen: int,
    retention_ms: int,
    fence: str | int | float,
    record: Fields,
    state: Fields,
    marker: tuple[str, str, Fields] | None = None,
    slot: int | None = None,
    shown: bool = False,
    keep: bool = False,
    failures: str = "",
    pause_after_failures: int = 0,
    holder: str = "",
) -> list[str]:
    """One call of the finish script (FINISH: its keys and arguments are laid out here only),
    its reply as strings (status_of). ``token=''`` records without a lease; ``slot`` writes
    ``marker`` (holder, finished_at, other fields) on its marker; ``shown``: the task's lease
    shows this allow-other-slots run."""
    call: list[Any] = [lease_key, keys.runs, keys.state, keys.meta]
    if slot is not None:
        call.append(keys.slot(slot))
    if shown:
        call.append(keys.lease)
    numkeys = len(call)
    call += (token, runs_maxlen, retention_ms, fence, "1" if keep else "",
             "1" if slot is not None else "", "1" if shown else "", failures,
             pause_after_failures, holder, PROTOCOL_MIN_OVERLAP, len(record), len(state))  # fmt: skip
    _add_pairs(call, record)
    _add_pairs(call, state)
    if marker is not None:
        marker_holder, finished_at, extra = marker
        call += (marker_holder, finished_at)
        _add_pairs(call, extra)
    return status_of(_FINISH.run(client, numkeys, call))


def finished(
    client: ScriptClient,
    keys: TaskKeys,
    operation: str,
    status: list[str],
    *,
    slot: int | None = None,
    retention_ms: int,
    index: bool,
) -> Finished:
    """A finish script's reply (``finish``), its owner already checked: ``FinishIncomplete``
    when a write failed; else, with ``index`` (a state was written, the task not scratch), the
    task added to its scope's index the first time."""
    if status[0] == "partial":
        raise FinishIncomplete(operation, status[3:], status[1], slot, retention_ms)
    # A retried complete answers without the fourth field: its first try indexed the task.
    # Only a run that writes the state hash makes the task known (not a too_late record).
    if index and len(status) > 3 and not status[3]:
        try:
            index_task(client, keys)
        except RedisError as exc:  # the run is over and recorded: only `status` misses it
            log.warning(
                f"could not add {keys.task} to the scope's task index {keys.index} ({exc}): "
                "`status` and `watchdog` under an ACL without +scan will not list it (the ACL "
                "needs +sadd)",
                extra={"event": "index_failed", "task": keys.task},
            )
    return Finished(len(status) > 2 and status[2] == "1", len(status) > 4 and status[4] == "paused")


def index_task(client: ScriptClient, keys: TaskKeys) -> None:
    """Add the task to its scope's index, then mark it so in its state hash: once per task, and
    again if the first try failed between the two. Two key slots, so not in the script; one
    round trip for both, as a pipeline (on Cluster, one per node)."""
    pipe: Any = client.pipeline(transaction=False)  # type: ignore[attr-defined]
    pipe.sadd(keys.index, keys.task)
    pipe.hset(keys.state, "indexed", "1")
    added, _ = pipe.execute(raise_on_error=False)
    if isinstance(added, Exception):
        # Not a transaction: the mark was written all the same. Taken back (a failure only),
        # so that the next finish tries again; HSET, which the minimal ACL rule allows.
        with contextlib.suppress(RedisError):
            client.hset(keys.state, "indexed", "")  # type: ignore[attr-defined]
        raise added


def _seconds_or_none(value: Any) -> float | None:
    text = _as_str(value)
    try:
        return float(text) if text else None
    except ValueError:
        return None


class Lease:
    """One holder's lease on one task. Every method is one round trip.

    ``definition`` is the task's definition (schedule, time zone, mode, command or task), ''
    for a manual run: acquire compares it with the one stored and refuses a different one,
    unless ``redefine`` replaces it.

    ``overlap`` is the task's overlap policy (OVERLAPS). ``aux_ms`` is how long a request of
    replace (the preempt key) lives; ``skip_ttl_ms`` how long a skip counter on a marker that
    has none is kept, and buffer-one's record of the newest slot. ``pause_after_failures``:
    pause the task after this many consecutive failures (0: never).
    """

    # False: the state hash is written unfenced (a queue job's lease: runner.queue.jobs).
    fenced_state = True

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
        overlap: str = SKIP,
        aux_ms: int = 60_000,
        skip_ttl_ms: int = 3_600_000,
        pause_after_failures: int = 0,
    ) -> None:
        if overlap not in _WIRE:
            raise ValueError(f"overlap {overlap!r}: expected one of {', '.join(OVERLAPS)}")
        self.client = client
        self.indexed = indexed  # False: a scratch task (check), kept out of the scope's index
        self.keys = keys
        self.token = token
        self.ttl_ms = ttl_ms
        self.retention_ms = retention_ms
        self.runs_maxlen = runs_maxlen
        self.definition = definition
        self.redefine = redefine
        self.overlap = overlap
        self.aux_ms = aux_ms
        self.skip_ttl_ms = skip_ttl_ms
        self.pause_after_failures = pause_after_failures
        self.fence = 0
        self.slot: int | None = None  # the slot of the last acquire: its lease is the one held

    @property
    def holder(self) -> str:
        return holder_of(self.token)

    @property
    def protocol_min(self) -> int:
        """What this runner stores as the task's minimum: skip runs beside protocol 1 and 2."""
        return PROTOCOL_MIN if self.overlap == SKIP else PROTOCOL_MIN_OVERLAP

    def _policy(self, slot: int | None) -> str:
        # A manual run has no slot of its own: under allow-other-slots it takes the task's lease.
        if self.overlap == ALLOW_OTHER_SLOTS and slot is None:
            return ""
        return _WIRE[self.overlap]

    def _lease_key(self, slot: int | None) -> str:
        if self.overlap == ALLOW_OTHER_SLOTS and slot is not None:
            return self.keys.slot_lease(slot)
        return self.keys.lease

    def _aux_key(self, policy: str) -> str:
        if policy == "buffer":
            return self.keys.buffer
        return self.keys.preempt if policy == "replace" else self.keys.lease

    def acquire(
        self,
        slot: int | None,
        *,
        catch_up: Sequence[int] = (),
        final: bool = False,
        skip_record: Fields | None = None,
    ) -> AcquireResult:
        """Take the lease for ``slot``, or say why not.

        ``catch_up``: earlier slots (oldest first) whose markers the script reads once the lease
        is taken: Acquired.unrun lists those that never ran. ``final``: the last look of a wait
        (buffer-one, replace): a lease still held is then recorded as this slot's skip.
        ``skip_record``: the fields of the run record a skip of this slot writes (once per slot);
        the script adds ``outcome`` and ``error``.
        """
        policy = self._policy(slot)
        keys = self.keys
        call: list[Any] = [self._lease_key(slot), keys.fence, keys.meta, keys.runs]
        if slot is not None:
            call.append(keys.slot(slot))
        if policy:
            call.append(self._aux_key(policy))
        call += [keys.slot(s) for s in catch_up]
        numkeys = len(call)
        # buffer-one's key outlives any wait: it tells an older slot that a newer one came.
        aux_ms = self.skip_ttl_ms if policy == "buffer" else self.aux_ms
        call += (
            self.token, self.ttl_ms, PROTOCOL, self.protocol_min, self.definition,
            "1" if self.redefine else "", policy, "" if slot is None else slot, aux_ms,
            self.skip_ttl_ms, "1" if final else "", self.runs_maxlen, len(catch_up), *catch_up,
        )  # fmt: skip
        if skip_record is None:
            call += ("slot", "" if slot is None else slot, "holder", self.holder, "fence", 0,
                     "exit_code", 0, "started_at", f"{clock.wall():.3f}")  # fmt: skip
        else:
            _add_pairs(call, skip_record)
        reply = _ACQUIRE.run(self.client, numkeys, call)
        if type(reply) is int:
            self.fence = replies.fence(reply, "acquire")
            self.slot = slot
            return Acquired(self.fence)
        parts = replies.table(reply, "acquire")
        kind = replies.kind(parts, _ACQUIRE_KINDS, "acquire", _ACQUIRE_LENGTHS)
        if kind == "acquired":
            fence = replies.fence(parts[1], "acquire")
            unrun = tuple(replies.integer(s, "acquire") for s in parts[2:])
            self.fence = fence
            self.slot = slot
            return Acquired(fence, unrun)
        if kind == "held":
            return Held(token=parts[1], ttl_ms=replies.integer(parts[2], "acquire"), note=parts[3])
        if kind == "protocol":
            raise ProtocolRefused(PROTOCOL, parts[1], parts[2], self.keys.meta)
        if kind == "definition":
            raise DefinitionConflict(self.definition, parts[1], self.keys.meta)
        if kind == "corrupt":
            raise CorruptRecord(parts[1], parts[2], parts[3])
        if kind == "paused":
            return Paused(
                note=parts[1],
                by=parts[2],
                at=_seconds_or_none(parts[3]),
                until=_seconds_or_none(parts[4]),
            )
        return SlotDone(holder=parts[1], finished_at=_seconds_or_none(parts[2]))

    def renew(self) -> None:
        """Extend the lease. Under replace, raises Preempted (the lease extended all the same)
        while a run of a newer slot asks for it."""
        policy = self._policy(self.slot)
        keys = [self._lease_key(self.slot)]
        aux = self._aux_key(policy) if policy in ("replace", "slots") else None
        if aux is not None:
            keys.append(aux)
        args = [self.token, self.ttl_ms, policy if aux else "",
                "" if self.slot is None else self.slot]  # fmt: skip
        reply = replies.table(_RENEW(self.client, keys, args), "renew")
        kind = replies.kind(reply, ("ok", "not_owner", "preempted"), "renew", _RENEW_LENGTHS)
        if kind == "preempted":
            raise Preempted(holder_of(reply[1]), slot_of(reply[1]))
        self._check_owner("renew", reply)

    def complete(
        self,
        slot: int | None,
        record: Fields,
        state: Fields,
        marker: Fields | None = None,
        *,
        retention_ms: int | None = None,
        keep_lease: bool = False,
        success: bool = True,
    ) -> Finished:
        """Success: mark the slot done and only then delete the lease, recording the run.

        The marker always names the holder, the time and the token: acquire reads the first two,
        and a retried complete whose first reply was lost recognises its own token. It is kept
        ``retention_ms`` (default the lease's ``retention_ms``). ``keep_lease``: mark a slot
        (one caught up) and keep the lease, for the run goes on. ``success=False``: a slot done
        without the task's success (replaced), which neither counts as a failure nor ends a
        count of them.
        """
        extra = dict(marker or ())
        extra.pop("token", None)  # always this lease's own
        # Each default is worked out only when the caller did not give it.
        holder = str(extra.pop("holder")) if "holder" in extra else self.holder
        finished_at = (
            str(extra.pop("finished_at")) if "finished_at" in extra else f"{clock.wall():.3f}"
        )
        return self._finish(
            "complete",
            slot,
            record,
            state,
            (holder, finished_at, extra),
            token=self.token,
            retention_ms=retention_ms,
            keep=keep_lease,
            failures="reset" if success else "",
        )

    def release(self, record: Fields, state: Fields, *, failure: bool = False) -> Finished:
        """Delete the lease, write no slot marker (the retry may run it), record the run.

        ``failure``: the task itself failed; counted towards ``pause_after_failures``."""
        return self._finish(
            "release", None, record, state, None, token=self.token,
            failures="count" if failure and self.pause_after_failures > 0 else "",
        )  # fmt: skip

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
        marker: tuple[str, str, Fields] | None,
        *,
        token: str,
        fenced: bool = True,
        retention_ms: int | None = None,
        keep: bool = False,
        failures: str = "",
    ) -> Finished:
        retention_ms = self.retention_ms if retention_ms is None else retention_ms
        # The state hash takes the fence of the state written, else this lease's own.
        fence = state.get("last_fence", self.fence) if fenced and self.fenced_state else ""
        status = finish(
            self.client,
            self.keys,
            lease_key=self._lease_key(self.slot),
            token=token,
            runs_maxlen=self.runs_maxlen,
            retention_ms=retention_ms,
            fence=fence,
            record=record,
            state=state,
            marker=marker,
            slot=slot,
            shown=token != "" and self._policy(self.slot) == "slots",
            keep=keep,
            failures=failures,
            pause_after_failures=self.pause_after_failures,
            holder=self.holder,
        )
        self._check_owner(operation, status)
        return finished(
            self.client, self.keys, operation, status, slot=slot, retention_ms=retention_ms,
            index=self.indexed and bool(state),
        )  # fmt: skip

    def index(self) -> None:
        """index_task for this lease's task; raises what Redis raises."""
        index_task(self.client, self.keys)

    @staticmethod
    def _check_owner(operation: str, reply: list[str]) -> None:
        if reply[0] not in ("ok", "partial"):
            current = reply[1]
            raise LeaseNotOwned(operation, holder_of(current) if current else None)
