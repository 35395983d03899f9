"""Fork N contenders that acquire one task's lease at the same instant; print their results as JSON.

Usage: contend.py PORT TASK N [SLOT]

Forked from this single-threaded, already-warm process, so N processes start in milliseconds.
Each child connects first and only then waits at the start line: a pipe whose write end the
parent closes once all are ready, which wakes every child at once (EOF is a broadcast).
"""

from __future__ import annotations

import json
import os
import sys
import time

import redis

from runner.keys import TaskKeys
from runner.lease.scripts import Acquired, Held, Lease, SlotDone, new_token


def contender(
    index: int, port: int, keys: TaskKeys, slot: int | None, fds: tuple[int, int, int]
) -> None:
    ready_w, go_r, out_w = fds
    client = redis.Redis(port=port, socket_timeout=30)
    client.ping()
    lease = Lease(client, keys, new_token(f"contender-{index}"), ttl_ms=60_000)
    os.write(ready_w, b"r")
    os.read(go_r, 1)
    released_at = time.monotonic()
    got = lease.acquire(slot)
    result: dict[str, object] = {"index": index, "token": lease.token, "released_at": released_at}
    if isinstance(got, Acquired):
        result.update(kind="acquired", fence=got.fence)
    elif isinstance(got, Held):
        result.update(kind="held", holder_token=got.token, ttl_ms=got.ttl_ms)
    elif isinstance(got, SlotDone):
        result.update(kind="done", holder=got.holder)
    line = (json.dumps(result) + "\n").encode()
    assert len(line) < 4096  # below PIPE_BUF: concurrent writes never interleave
    os.write(out_w, line)


def main() -> int:
    port, task, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    slot = int(sys.argv[4]) if len(sys.argv) > 4 else None
    keys = TaskKeys("cron-runner", "contention", task)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pids = []
    for index in range(n):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(go_w)
                os.close(ready_r)
                os.close(out_r)
                contender(index, port, keys, slot, (ready_w, go_r, out_w))
            except BaseException as exc:
                os.write(2, f"contender {index}: {exc!r}\n".encode())
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(ready_w)
    os.close(out_w)
    ready = 0
    while ready < n:
        chunk = os.read(ready_r, n)
        if not chunk:
            break
        ready += len(chunk)
    all_ready_at = time.monotonic()
    os.close(go_w)
    data = b""
    while chunk := os.read(out_r, 65536):
        data += chunk
    failed = sum(1 for pid in pids if os.waitpid(pid, 0)[1] != 0)
    results = [json.loads(line) for line in data.decode().splitlines()]
    json.dump(
        {"ready": ready, "all_ready_at": all_ready_at, "failed": failed, "results": results},
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
