"""Tasks the queue tests run in real worker processes. Each records what it did in Redis
(the worker's own CRON_RUNNER_REDIS_URL), so the test counts outcomes, not log lines."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, cast

import redis

from runner import RunContext, task
from runner.errors import Cancelled

EFFECTS = "test:effects"
ATTEMPTS = "test:attempts:"
SCALE_DONE = "test:scale:done"
RELEASE = "test:release"

_clients: dict[int, redis.Redis] = {}
_lock = threading.Lock()


def client() -> redis.Redis:
    """One client per process: workers fork, and a client must not cross a fork."""
    with _lock:
        pid = os.getpid()
        if pid not in _clients:
            _clients[pid] = redis.Redis.from_url(
                os.environ["CRON_RUNNER_REDIS_URL"], decode_responses=True
            )
        return _clients[pid]


def effect(ctx: RunContext, what: str, **extra: Any) -> None:
    line = {"what": what, "task": ctx.task, "slot": ctx.slot, "fence": ctx.fencing_token,
            "holder": ctx.holder, "pid": os.getpid(), "payload": dict(ctx.payload),
            "at": time.time(), **extra}  # fmt: skip
    client().rpush(EFFECTS, json.dumps(line))


@task("q-ok")
def ok(ctx: RunContext) -> None:
    effect(ctx, "ran")


@task("q-billed", queue="billing")
def billed(ctx: RunContext) -> None:
    """On a queue of its own, as the README's invoices on "billing"."""
    effect(ctx, "ran")


@task("q-flaky", retries=3, min_backoff="300ms", max_backoff="5s")
def flaky(ctx: RunContext) -> None:
    """Fails on its first two attempts, then succeeds."""
    key = ATTEMPTS + str(ctx.payload.get("id", "x"))
    attempt = int(cast(int, client().incr(key)))
    effect(ctx, "attempt", attempt=attempt)
    if attempt <= 2:
        raise RuntimeError(f"flaky: attempt {attempt} fails on purpose")
    effect(ctx, "ran")


@task("q-doomed", retries=2, min_backoff="100ms", max_backoff="400ms")
def doomed(ctx: RunContext) -> None:
    """Always fails, unless the test has since fixed what it depends on."""
    effect(ctx, "attempt")
    if not client().exists("test:doomed:fixed"):
        raise ValueError("doomed: the dependency is still broken")
    effect(ctx, "ran")


@task("q-sleep")
def sleeper(ctx: RunContext) -> None:
    """Sleeps without checking (seconds from the payload), then records."""
    effect(ctx, "start")
    time.sleep(float(ctx.payload.get("seconds", 1)))
    effect(ctx, "ran")


def _released() -> bool:
    return bool(client().exists(RELEASE))


@task("q-careful")
def careful(ctx: RunContext) -> None:
    """Works in small steps until the test releases it, checking between steps."""
    effect(ctx, "start")
    end = time.monotonic() + float(ctx.payload.get("seconds", 60))
    while time.monotonic() < end and not _released():
        ctx.check()
        time.sleep(0.02)
    effect(ctx, "ran")


@task("q-stubborn")
def stubborn(ctx: RunContext) -> None:
    """Works until the test releases it, and never checks: only the process exit stops it."""
    effect(ctx, "start")
    end = time.monotonic() + float(ctx.payload.get("seconds", 60))
    while time.monotonic() < end and not _released():
        time.sleep(0.02)
    effect(ctx, "ran")


@task("q-overtime", retries=0, time_limit="300ms")
def overtime(ctx: RunContext) -> None:
    """Runs past its time limit: the worker interrupts it."""
    effect(ctx, "start")
    end = time.monotonic() + 10
    while time.monotonic() < end:
        time.sleep(0.01)
    effect(ctx, "ran")


@task("q-slot")
def slot_job(ctx: RunContext) -> None:
    """A scheduled job of a few seconds (the payload's, else 3) that checks between steps, as
    the issue's 3-second task; released early by the test's RELEASE key."""
    effect(ctx, "start")
    end = time.monotonic() + float(ctx.payload.get("seconds", 3))
    try:
        while time.monotonic() < end and not _released():
            ctx.check()
            time.sleep(0.02)
    except Cancelled as exc:
        effect(ctx, "stopped", reason=str(exc))
        raise
    effect(ctx, "ran")


@task("q-rated", rate_limit="4/1s")
def rated(ctx: RunContext) -> None:
    """At most 4 starts in any second, across every worker."""
    effect(ctx, "ran")


@task("scale-job")
def scale_job(ctx: RunContext) -> None:
    """The seed's §9 job: almost no work, so the broker's cost is what is measured."""
    started_ms = int(time.time() * 1000)
    payload = ctx.payload
    client().rpush(SCALE_DONE, f"{payload['i']} {os.getpid()} {payload['t']} {started_ms}")


@task("q-turn")
def turn_job(ctx: RunContext) -> None:
    """A slot's job of 1.5 s that checks between steps: long enough for the slots fetched with
    it to find the lease held."""
    effect(ctx, "start")
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        ctx.check()
        time.sleep(0.02)
    effect(ctx, "ran")


@task("q-blocked", retries=0, time_limit="500ms")
def blocked(ctx: RunContext) -> None:
    """Blocked in one call (the payload's seconds) past its time limit, then works on."""
    effect(ctx, "start")
    time.sleep(float(ctx.payload.get("seconds", 3)))
    effect(ctx, "after")
    time.sleep(0.5)
    effect(ctx, "ran")


@task("q-waiting", retries=0, time_limit="500ms")
def waiting(ctx: RunContext) -> None:
    """Waits on its context (the payload's seconds) past its time limit."""
    effect(ctx, "start")
    ctx.cancelled.wait(float(ctx.payload.get("seconds", 10)))
    ctx.check()
    effect(ctx, "ran")
