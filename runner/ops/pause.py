"""Pause and resume a task fleet-wide: the fields of its meta hash that the acquire script reads
(runner.lease.scripts, ACQUIRE), written here in one script each (docs/design.md, Pause).

A pause is ``paused`` '1' with who (``paused_by``), since when (``paused_at``), until when
(``paused_until``, epoch seconds, '' until resumed) and why (``paused_note``). It raises the
task's ``protocol_min`` to 3 and keeps the one before in ``protocol_min_before_pause``: runners
of protocol 2 do not read the pause, so they refuse (78) rather than run. A resume puts that
minimum back. The acquire script ends a pause whose ``paused_until`` has come by itself, in the
same way; the finish script pauses a task after N consecutive failures, in the same fields.

Each act is recorded in the task's run stream (outcomes ``pause`` and ``resume``), and the last
pause's window in its state hash (``paused_from``, ``paused_to``), so that the watchdog does not
count the slots it skipped as missed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.errors import ConfigError
from runner.keys import TaskKeys
from runner.lease import journal, replies
from runner.lease.scripts import PROTOCOL, PROTOCOL_MIN_OVERLAP, Script

#: The run stream's records of an operator's pause and resume (not runs; `paused` is the
#: outcome of a slot skipped because of a pause).
PAUSE = "pause"
RESUME = "resume"

#: The meta hash's pause fields, as ACQUIRE reads them, in the order ``pause_of`` takes them.
PAUSE_FIELDS = ("paused", "paused_by", "paused_at", "paused_until", "paused_note")

# KEYS: meta, runs, state
# ARGV: 1 who pauses, 2 when (epoch s, the caller's clock, as every admin record), 3 note,
#       4 until (epoch s; '' until resumed), 5 the protocol minimum while paused, 6 this
#       protocol, 7 runs_maxlen, then the record's name/value pairs.
# A pause already in force keeps its start (paused_at) and the minimum it saved, and takes the
# new note, until and holder. One whose until has come (ACQUIRE has not cleared it yet) is over:
# a new pause starts now, and still keeps the minimum saved before the first.
PAUSE_SCRIPT = Script("""
local m = redis.call('HMGET', KEYS[1], 'paused', 'paused_until', 'paused_at', 'protocol_min',
  'protocol')
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local until_s = tonumber(ARGV[4])
-- Redis's clock decides when a pause ends (ACQUIRE): one already over there never starts.
if until_s and until_s * 1000 <= now_ms then
  return {'past', tostring(now_ms / 1000)}
end
local was = m[1] == '1'
local old_until = tonumber(m[2] or '')
local current = was and not (old_until and now_ms >= old_until * 1000)
local since = current and m[3] or ARGV[2]
local fields = {'paused', '1', 'paused_by', ARGV[1], 'paused_at', since, 'paused_until', ARGV[4],
  'paused_note', ARGV[3]}
local function add(name, value)
  fields[#fields + 1] = name
  fields[#fields + 1] = value
end
if not was then
  add('protocol_min_before_pause', m[4] or '1')
end
if (tonumber(m[4] or '') or 1) < tonumber(ARGV[5]) then
  add('protocol_min', ARGV[5])
end
if not m[5] or tonumber(m[5]) < tonumber(ARGV[6]) then
  add('protocol', ARGV[6])
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', unpack(ARGV, 8))
redis.call('HSET', KEYS[3], 'paused_from', since, 'paused_to', ARGV[4])
return {current and 'updated' or 'paused', since, m[5] or ''}
""")

# KEYS: meta, runs, state
# ARGV: 1 when (epoch s), 2 runs_maxlen, then the record's name/value pairs (the script adds
#       the pause's holder and note as 'note').
# The minimum goes back to the one saved before the pause. It already holds what the task's
# own policy needs: every acquire stores its policy's minimum (ACQUIRE raises protocol_min, and
# during a pause protocol_min_before_pause), as the acquire that ends a pause by its until puts
# back max(saved, its own). Without a saved one (fields written by hand) the minimum stays as
# it is: older runners then keep refusing rather than run a task whose needs are unknown.
# A resume also clears the count of consecutive failures: the task gets its N tries again.
RESUME_SCRIPT = Script("""
local m = redis.call('HMGET', KEYS[1], 'paused', 'paused_until', 'paused_at', 'paused_by',
  'paused_note', 'protocol_min_before_pause', 'protocol_min')
if m[1] ~= '1' then
  return {'not_paused', m[7] or ''}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local until_s = tonumber(m[2] or '')
local ended = until_s ~= nil and now_ms >= until_s * 1000
local restored = m[7] or ''
if m[6] then
  restored = m[6]
  redis.call('HSET', KEYS[1], 'protocol_min', restored)
end
redis.call('HDEL', KEYS[1], 'paused', 'paused_until', 'paused_at', 'paused_by', 'paused_note',
  'protocol_min_before_pause')
local note = m[5] or ''
local record = {}
for i = 3, #ARGV do
  record[#record + 1] = ARGV[i]
end
record[#record + 1] = 'note'
record[#record + 1] = 'paused by ' .. (m[4] or '?') .. (note ~= '' and (': ' .. note) or '')
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(record))
local window = {'paused_to', ended and m[2] or ARGV[1]}
if m[3] then
  window[#window + 1] = 'paused_from'
  window[#window + 1] = m[3]
end
redis.call('HSET', KEYS[3], unpack(window))
local failures = redis.call('HGET', KEYS[3], 'consecutive_failures')
if failures and failures ~= '0' then
  redis.call('HSET', KEYS[3], 'consecutive_failures', '0')
end
return {ended and 'ended' or 'resumed', restored, m[4] or '', m[3] or '', note, m[2] or ''}
""")


@dataclass(frozen=True)
class Pause:
    """A pause in force, as the meta hash holds it."""

    by: str | None
    at: float | None  # since when (epoch seconds)
    until: float | None  # None: until resumed
    note: str


@dataclass(frozen=True)
class Paused:
    """What ``pause`` did: ``updated`` a pause already in force (its start kept), or started one."""

    updated: bool
    since: float
    # The newest protocol that has run the task ('' if none of protocol 2 or later has): runners
    # of b170e33 and before store none, and they do not read the pause.
    protocol: str


@dataclass(frozen=True)
class Resumed:
    """What ``resume`` did. ``pause`` is None when the task was not paused (nothing done);
    ``ended``: its until had come already (the next run would have resumed it)."""

    pause: Pause | None
    ended: bool
    protocol_min: str  # the task's minimum protocol now ('' if none is stored)


def _float(value: Any) -> float | None:
    return replies.stored_time(value.decode() if isinstance(value, bytes) else value)


def _iso(t_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_s))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pause_of(values: Sequence[Any], now_s: float) -> Pause | None:
    """The pause in force from the meta hash's ``PAUSE_FIELDS`` (an HMGET reply), or None.

    A pause whose until has come is over, as the acquire script reads it, though its fields
    stay until the next run clears them."""
    paused, by, at, until, note = (None if v is None else _text(v) for v in values)
    if paused != "1":
        return None
    until_s = _float(until)
    if until_s is not None and now_s >= until_s:
        return None
    return Pause(by=by or None, at=_float(at), until=until_s, note=note or "")


def pause_window(
    current: Pause | None, state: Mapping[str, str], now_s: float
) -> tuple[float, float] | None:
    """When the task's last pause held, as (from, to) in epoch seconds: the slots it skipped
    are not missed. The pause in force runs to now; a pause over, to its end (the state hash's
    ``paused_from``/``paused_to``, which ``pause`` and ``resume`` write). A pause after
    consecutive failures writes only the meta hash: it has a window once it is in force or
    resumed by ``resume``."""
    if current is not None:
        return None if current.at is None else (current.at, now_s)
    start = _float(state.get(journal.PAUSED_FROM))
    end = _float(state.get(journal.PAUSED_TO))
    if start is None:
        return None
    return (start, min(end, now_s) if end is not None else now_s)


def pause(
    client: Any,
    keys: TaskKeys,
    *,
    by: str,
    at_s: float,
    note: str,
    until_s: float | None,
    runs_maxlen: int = 1000,
) -> Paused:
    """Pause the task (or update the pause in force) and record it, in one script."""
    until = "" if until_s is None else journal.timestamp(until_s)
    record = {
        **journal.admin_record(PAUSE, by, at_s),
        journal.NOTE: note,
        journal.PAUSED_UNTIL: until,
    }
    args: list[Any] = [by, journal.timestamp(at_s), note, until, PROTOCOL_MIN_OVERLAP, PROTOCOL,
                       runs_maxlen]  # fmt: skip
    for name, value in record.items():
        args += [name, str(value)]
    reply = replies.table(PAUSE_SCRIPT(client, [keys.meta, keys.runs, keys.state], args), "pause")
    kind = replies.kind(reply, ("past", "paused", "updated"), "pause",
                        {"past": 2, "paused": 3, "updated": 3})  # fmt: skip
    # Since when: the pause's own start, as stored (a damaged one reads as now).
    when = _float(reply[1])
    if kind == "past":
        raise ConfigError(
            f"--until {_iso(until_s or 0)} is not after Redis's clock ({_iso(when or at_s)}): "
            "the pause would be over as it starts; expected a time to come"
        )
    return Paused(updated=kind == "updated", since=at_s if when is None else when,
                  protocol=reply[2])  # fmt: skip


def resume(
    client: Any, keys: TaskKeys, *, by: str, at_s: float, runs_maxlen: int = 1000
) -> Resumed:
    """End the task's pause, if any, and record it, in one script."""
    record = journal.admin_record(RESUME, by, at_s)
    args: list[Any] = [journal.timestamp(at_s), runs_maxlen]
    for name, value in record.items():
        args += [name, str(value)]
    reply = replies.table(RESUME_SCRIPT(client, [keys.meta, keys.runs, keys.state], args), "resume")
    replies.kind(reply, ("not_paused", "ended", "resumed"), "resume",
                 {"not_paused": 2, "ended": 6, "resumed": 6})  # fmt: skip
    if reply[0] == "not_paused":
        return Resumed(pause=None, ended=False, protocol_min=reply[1])
    by_, at, note, until = reply[2:6]
    return Resumed(
        pause=Pause(by=by_ or None, at=_float(at), until=_float(until), note=note),
        ended=reply[0] == "ended",
        protocol_min=reply[1],
    )
