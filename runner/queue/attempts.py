"""Every attempt of a message that started leaves a record (docs/design.md, Queue mode).

A job records its own end (ran, failed, lease_lost, replaced, requeued). A worker killed
with ``kill -9``, or one that exits at the end of its shutdown grace with a job still running,
records nothing: its message comes back to a worker (Dramatiq re-delivers it once the dead
worker's heartbeat is old, or it was put back), and that next attempt records the one before.

For that, each attempt leaves a trace before its task starts: a key per message, holding who
runs it, under which fence and since when. The attempt deletes it once its own record is
written; the next attempt of the same message finds one left and records it as lost.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

from redis.exceptions import RedisError

from runner.errors import CronRunnerError
from runner.keys import TaskKeys
from runner.lease import journal
from runner.outcomes import LEASE_LOST, exit_code

log = logging.getLogger("runner.worker")

#: Longer than any wait before a message comes back: a dead worker's re-delivery, a retry's
#: backoff, a cluster down for the night.
TRACE_TTL_MS: Final = 7 * 24 * 3_600_000
LOST: Final = (
    "this attempt ended without a record of its own: its worker was killed, or exited at the "
    "end of its shutdown grace with the task still running (recorded by the next attempt)"
)


def trace_key(keys: TaskKeys, message_id: str) -> str:
    return f"{keys.base}:attempt:{message_id}"


def begin(
    client: Any, keys: TaskKeys, message_id: str, trace: dict[str, Any], runs_maxlen: int
) -> None:
    """Leave this attempt's trace, and record the attempt before it if that one left its own:
    one round trip, and one more only when there is an attempt to record."""
    key = trace_key(keys, message_id)
    pipe = client.pipeline(transaction=False)
    pipe.get(key)
    pipe.set(key, json.dumps(trace), px=TRACE_TTL_MS)
    left, _ = pipe.execute()
    if left is None:
        return
    record = lost_record(left, message_id)
    journal.record_unleased(client, keys, record, {}, runs_maxlen=runs_maxlen)
    log.warning(
        f"an earlier attempt of this message, on {record[journal.HOLDER]}, ended without a "
        "record (its worker was killed or stopped): recorded it as lease_lost",
        extra={"event": "attempt_lost", "task": keys.task, "message_id": message_id,
               "run_holder": record[journal.HOLDER]},
    )  # fmt: skip


def end(client: Any, keys: TaskKeys, message_id: str) -> None:
    """This attempt's record is written: its trace goes."""
    client.delete(trace_key(keys, message_id))


def lost_record(left: Any, message_id: str) -> journal.Fields:
    """The record of an attempt from the trace it left (what could be read of it: the trace is
    read back from Redis, so it is not trusted)."""
    try:
        trace = json.loads(left)
    except ValueError:
        trace = None
    if not isinstance(trace, dict):
        trace = {}

    def number(name: str) -> int | float | None:
        value = trace.get(name)
        return value if type(value) in (int, float) else None

    slot, fence, started = number("slot"), number("fence"), number("started_at")
    holder = trace.get("holder")
    return journal.run_record(
        slot=None if slot is None else int(slot),
        holder=holder if isinstance(holder, str) else "?",
        fence=int(fence or 0),
        outcome=LEASE_LOST,
        exit_code=exit_code(LEASE_LOST),
        started_at_s=float(started or 0),
        duration_ms=0,
        error=LOST,
        message_id=message_id,
    )


def safely(call: Any, *args: Any) -> None:
    """``begin`` or ``end``: a failure costs a record at the most, never the job."""
    try:
        call(*args)
    except (RedisError, CronRunnerError) as exc:
        log.warning(f"could not keep the attempt's trace: {exc}", extra={"event": "record_failed"})
