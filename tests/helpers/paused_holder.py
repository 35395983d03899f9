"""A lease holder with a keeper whose owner does one unit of work per ``work`` line on stdin.

Usage: paused_holder.py PORT TASK TTL_MS EVENTS_FILE EFFECTS_FILE

Events (JSON lines, ``t`` on the system-wide CLOCK_MONOTONIC, comparable across processes):
acquired, renewed, lost (from the keeper's callback, with the thread that reported it),
worked, refused_work, released / release_refused. Each unit of work calls ``ctx.check()``
first, exactly as a task does, and only then appends its side effect to EFFECTS_FILE.

Work is paced by stdin so that a test can SIGSTOP the process at a known point between
units of work: a stop landing between a check and its write is the window that fencing
tokens, not the keeper, are there to close.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import redis

from runner.errors import Cancelled, LeaseNotOwned
from runner.keys import TaskKeys
from runner.lease.keeper import Keeper
from runner.lease.scripts import Acquired, Lease, new_token
from runner.tasks import RunContext

_lock = threading.Lock()


def main() -> int:
    port, task, ttl_ms = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    events_path, effects_path = Path(sys.argv[4]), Path(sys.argv[5])
    events = events_path.open("a", buffering=1)

    def emit(event: str, **fields: object) -> None:
        with _lock:
            events.write(json.dumps({"event": event, "t": time.monotonic(), **fields}) + "\n")

    client = redis.Redis(port=port, socket_timeout=5, socket_connect_timeout=1)
    lease = Lease(client, TaskKeys("cron-runner", "faults", task), new_token("paused"),
                  ttl_ms=ttl_ms)  # fmt: skip
    sent_at = time.monotonic()
    got = lease.acquire(None)
    if not isinstance(got, Acquired):
        emit("not_acquired", result=repr(got))
        return 1
    emit("acquired", fence=got.fence, token=lease.token, pid=os.getpid())

    keeper = Keeper(
        lease,
        ttl_s=ttl_ms / 1000,
        confirmed_at=sent_at,
        on_lost=lambda reason: emit("lost", reason=reason, thread=threading.current_thread().name),
        on_renewed=lambda: emit("renewed"),
    )
    emit("deadlines", lose_at=keeper.lose_at, expires_at=keeper.expires_at)
    keeper.start()
    ctx = RunContext(
        task=task,
        slot=None,
        fencing_token=got.fence,
        holder=lease.holder,
        logger=logging.LoggerAdapter(logging.getLogger("paused_holder")),
        lease_valid=lambda: not keeper.is_lost(),
    )
    with effects_path.open("a", buffering=1) as effects:
        for line in sys.stdin:
            if line.strip() != "work":
                break
            try:
                ctx.check()
            except Cancelled as exc:
                emit("refused_work", reason=str(exc), lost_reason=keeper.lost_reason)
                continue
            effects.write(f"{time.monotonic()} fence={got.fence}\n")
            emit("worked")
    keeper.stop()
    try:
        lease.release({"outcome": "test"}, {})
        emit("released")
    except LeaseNotOwned as exc:
        emit("release_refused", current_holder=exc.current_holder)
    return 4 if keeper.is_lost() else 0


if __name__ == "__main__":
    sys.exit(main())
