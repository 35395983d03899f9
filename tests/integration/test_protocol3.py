"""Protocol 3's lease scripts on a real redis-server, through the Lease API: the overlap policies,
skips counted and recorded once per slot, pause read in acquire, catch-up candidates, a finish
that keeps the lease, pause after consecutive failures, and one round trip per call whatever
the policy (docs/design.md, Overlap policies)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
import redis

from runner.config.settings import ALLOW_OTHER_SLOTS, BUFFER_ONE, OVERLAPS, REPLACE, SKIP
from runner.errors import Preempted
from runner.keys import TaskKeys
from runner.lease.scripts import (
    BUFFERED,
    GAVE_UP,
    PREEMPTING,
    PROTOCOL,
    SUPERSEDED,
    Acquired,
    Held,
    Lease,
    Paused,
    SlotDone,
    new_token,
)
from runner.testing import RedisServer
from tests.helpers.lease_tools import counting_client, pttl_ms, stream_entries

SLOT = 1_700_000_040
GAP = 60
KEYS = TaskKeys("cron-runner", "default", "p3")


def lease(client: redis.Redis, holder: str, slot: int | None, **kwargs: Any) -> Lease:
    kwargs.setdefault("ttl_ms", 60_000)
    kwargs.setdefault("indexed", False)
    return Lease(client, KEYS, new_token(holder, slot), **kwargs)


def acquired(got: object) -> Acquired:
    assert isinstance(got, Acquired), got
    return got


def held(got: object) -> Held:
    assert isinstance(got, Held), got
    return got


def meta(r: redis.Redis) -> dict[str, str]:
    return cast(dict[str, str], r.hgetall(KEYS.meta))


def marker(r: redis.Redis, slot: int) -> dict[str, str]:
    return cast(dict[str, str], r.hgetall(KEYS.slot(slot)))


def complete(lease_: Lease, slot: int, **kwargs: Any) -> None:
    lease_.complete(slot, {"slot": slot, "outcome": "ran"}, {"last_outcome": "ran"}, **kwargs)


# -- protocol and meta ------------------------------------------------------------------------


def test_skip_keeps_the_minimum_at_1_any_other_policy_raises_it_to_3_never_lowered(
    r: redis.Redis,
) -> None:
    acquired(lease(r, "a", SLOT).acquire(SLOT))
    first = meta(r)
    assert (first["protocol"], first["protocol_min"]) == (str(PROTOCOL), "1")
    since = first["since"]
    assert abs(int(since) / 1000 - time.time()) < 60
    r.delete(KEYS.lease)
    acquired(lease(r, "b", SLOT + GAP, overlap=REPLACE).acquire(SLOT + GAP))
    assert meta(r)["protocol_min"] == "3"
    r.delete(KEYS.lease)
    acquired(lease(r, "c", SLOT + 2 * GAP).acquire(SLOT + 2 * GAP))
    assert meta(r)["protocol_min"] == "3"
    assert meta(r)["since"] == since  # set once


# -- skip: counted on the marker, recorded once per slot ----------------------------------------


def test_a_slot_skipped_for_another_slot_is_recorded_once_whatever_the_replicas(
    r: redis.Redis,
) -> None:
    holder = lease(r, "holder", SLOT)
    acquired(holder.acquire(SLOT))
    for i in range(5):
        got = held(lease(r, f"replica-{i}", SLOT + GAP, skip_ttl_ms=120_000).acquire(SLOT + GAP))
        assert (got.holder, got.note) == ("holder", "")
    (record,) = stream_entries(r, KEYS.runs)
    assert record["outcome"] == "skipped_held"
    assert record["slot"] == str(SLOT + GAP)
    assert record["holder"] == "replica-0"
    assert record["error"] == f"held by holder for the slot {SLOT}"
    mark = marker(r, SLOT + GAP)
    assert mark == {"skips": "5", "skipped": "skipped_held"}  # no holder: the slot did not run
    assert 100_000 < pttl_ms(r, KEYS.slot(SLOT + GAP)) <= 120_000
    # Not run, so not done: a later run of the slot may still take it (today's skip).
    holder.release({}, {})
    acquired(lease(r, "late", SLOT + GAP).acquire(SLOT + GAP))


def test_skips_of_a_done_slot_are_counted_not_recorded(r: redis.Redis) -> None:
    first = lease(r, "a", SLOT)
    acquired(first.acquire(SLOT))
    complete(first, SLOT)
    ttl = pttl_ms(r, KEYS.slot(SLOT))
    for i in range(9):
        assert isinstance(lease(r, f"r{i}", SLOT).acquire(SLOT), SlotDone)
    assert marker(r, SLOT)["skips"] == "9"
    assert pttl_ms(r, KEYS.slot(SLOT)) <= ttl  # the marker keeps its own retention
    assert len(stream_entries(r, KEYS.runs)) == 1


def test_a_token_without_a_slot_is_counted_but_recorded_only_when_it_is_a_manual_run(
    r: redis.Redis,
) -> None:
    r.set(KEYS.lease, "old-pod:9f3a", px=60_000)  # b170e33: it may be running this very slot
    held(lease(r, "a", SLOT).acquire(SLOT))
    assert stream_entries(r, KEYS.runs) == []
    assert marker(r, SLOT) == {"skips": "1"}
    r.set(KEYS.lease, new_token("operator"), px=60_000)
    held(lease(r, "a", SLOT + GAP).acquire(SLOT + GAP))
    (record,) = stream_entries(r, KEYS.runs)
    assert record["error"] == "held by operator for a manual run"


def test_a_manual_run_that_skips_writes_nothing(r: redis.Redis) -> None:
    acquired(lease(r, "a", SLOT).acquire(SLOT))
    held(lease(r, "b", None).acquire(None))
    assert stream_entries(r, KEYS.runs) == []
    assert r.keys(f"{KEYS.base}:slot:*") == []


def test_a_skip_record_carries_the_fields_it_is_given(r: redis.Redis) -> None:
    acquired(lease(r, "a", SLOT).acquire(SLOT))
    record: dict[str, str | int] = {
        "slot": SLOT + GAP,
        "holder": "b",
        "fence": 0,
        "exit_code": 0,
        "started_at": "1.5",
    }
    held(lease(r, "b", SLOT + GAP).acquire(SLOT + GAP, skip_record=record))
    (entry,) = stream_entries(r, KEYS.runs)
    assert entry == {**{k: str(v) for k, v in record.items()}, "outcome": "skipped_held",
                     "error": f"held by a for the slot {SLOT}"}  # fmt: skip


# -- pause, read in acquire --------------------------------------------------------------------


def test_a_paused_task_skips_every_slot_once_recorded(r: redis.Redis) -> None:
    r.hset(KEYS.meta, mapping={"paused": "1", "paused_note": "db migration",
                               "paused_by": "ops@host", "paused_at": "1700000000.5",
                               "paused_until": ""})  # fmt: skip
    for i in range(3):
        got = lease(r, f"r{i}", SLOT).acquire(SLOT)
        assert got == Paused(note="db migration", by="ops@host", at=1_700_000_000.5, until=None)
    (record,) = stream_entries(r, KEYS.runs)
    assert (record["outcome"], record["error"]) == ("paused", "paused by ops@host: db migration")
    assert marker(r, SLOT) == {"skips": "3", "skipped": "paused"}
    assert r.get(KEYS.lease) is None
    assert r.get(KEYS.fence) is None


def test_a_pause_with_an_end_resumes_in_the_first_acquire_after_it(r: redis.Redis) -> None:
    r.hset(KEYS.meta, mapping={"protocol": "3", "protocol_min": "3", "paused": "1",
                               "paused_by": "ops", "paused_until": f"{time.time() - 1:.3f}",
                               "protocol_min_before_pause": "1"})  # fmt: skip
    acquired(lease(r, "a", SLOT).acquire(SLOT))
    stored = meta(r)
    assert "paused" not in stored
    assert "protocol_min_before_pause" not in stored
    assert stored["protocol_min"] == "1"  # put back as it was before the pause


def test_a_policy_that_needs_3_raises_the_minimum_a_pause_will_put_back(r: redis.Redis) -> None:
    r.hset(KEYS.meta, mapping={"protocol": "3", "protocol_min": "3", "paused": "1",
                               "protocol_min_before_pause": "1"})  # fmt: skip
    assert isinstance(lease(r, "a", SLOT, overlap=REPLACE).acquire(SLOT), Paused)
    assert meta(r)["protocol_min_before_pause"] == "3"


# -- buffer-one ----------------------------------------------------------------------------------


def test_buffer_one_one_slot_waits_a_later_one_replaces_it_an_older_never_runs_after(
    r: redis.Redis,
) -> None:
    def buffered(holder: str, slot: int) -> Lease:
        return lease(r, holder, slot, overlap=BUFFER_ONE)

    running = buffered("s0", SLOT)
    acquired(running.acquire(SLOT))
    s1, s2 = buffered("s1", SLOT + GAP), buffered("s2", SLOT + 2 * GAP)
    assert held(s1.acquire(SLOT + GAP)).note == BUFFERED
    assert held(s2.acquire(SLOT + 2 * GAP)).note == BUFFERED
    assert held(s1.acquire(SLOT + GAP)).note == SUPERSEDED
    running.release({}, {})
    got = acquired(s2.acquire(SLOT + 2 * GAP))
    assert got.fence > running.fence
    # s1 again (a retry, a late replica): the lease is held by, then free after, a newer slot.
    assert held(s1.acquire(SLOT + GAP)).note == SUPERSEDED
    complete(s2, SLOT + 2 * GAP)
    assert held(buffered("s1-late", SLOT + GAP).acquire(SLOT + GAP)).note == SUPERSEDED
    (record,) = stream_entries(r, KEYS.runs)[:1]
    assert (record["outcome"], record["slot"]) == ("skipped_held", str(SLOT + GAP))
    assert record["error"] == f"superseded: a run of the later slot {SLOT + 2 * GAP} waits or ran"
    assert [e["outcome"] for e in stream_entries(r, KEYS.runs)] == ["skipped_held", "ran"]


@pytest.mark.parametrize(("overlap", "waiting"), [(BUFFER_ONE, BUFFERED), (REPLACE, PREEMPTING)])
def test_the_last_look_of_a_wait_records_a_holder_that_never_left(
    r: redis.Redis, overlap: str, waiting: str
) -> None:
    # buffer-one: the holder ran past the wait; replace: it was asked to stop and never did.
    acquired(lease(r, "s0", SLOT, overlap=overlap).acquire(SLOT))
    s1 = lease(r, "s1", SLOT + GAP, overlap=overlap)
    assert held(s1.acquire(SLOT + GAP)).note == waiting
    assert held(s1.acquire(SLOT + GAP, final=True)).note == GAVE_UP
    (record,) = stream_entries(r, KEYS.runs)
    assert record["error"] == "held by s0 past the overlap wait"


def test_buffer_one_a_waiter_of_the_holders_own_slot_waits_for_its_holder(r: redis.Redis) -> None:
    acquired(lease(r, "a", SLOT, overlap=BUFFER_ONE).acquire(SLOT))
    got = held(lease(r, "b", SLOT, overlap=BUFFER_ONE).acquire(SLOT))
    assert (got.note, got.slot) == ("", SLOT)


# -- replace -------------------------------------------------------------------------------------


def test_replace_the_holder_is_asked_to_stop_and_the_newcomer_takes_over(r: redis.Redis) -> None:
    old = lease(r, "old", SLOT, overlap=REPLACE, ttl_ms=5_000)
    acquired(old.acquire(SLOT))
    old.renew()  # nobody asks yet
    new = lease(r, "new", SLOT + GAP, overlap=REPLACE, aux_ms=30_000)
    assert held(new.acquire(SLOT + GAP)).note == PREEMPTING
    r.pexpire(KEYS.lease, 1_000)
    with pytest.raises(Preempted) as asked:
        old.renew()
    assert (asked.value.asker, asked.value.slot) == ("new", SLOT + GAP)
    assert pttl_ms(r, KEYS.lease) > 4_000  # the renewal kept the lease while the task stops
    assert asked.value.exit_code == 79
    # Still the holder: it records its end as a holder does.
    old.complete(SLOT, {"outcome": "replaced"}, {"last_outcome": "replaced"},
                 {"outcome": "replaced"})  # fmt: skip
    got = acquired(new.acquire(SLOT + GAP))
    assert got.fence > old.fence
    assert r.get(KEYS.preempt) is None
    new.renew()  # its own request is gone: no preemption


def test_replace_an_older_slot_never_asks_a_newer_one_and_a_newer_ask_wins(
    r: redis.Redis,
) -> None:
    acquired(lease(r, "s2", SLOT + 2 * GAP, overlap=REPLACE).acquire(SLOT + 2 * GAP))
    assert held(lease(r, "s1", SLOT + GAP, overlap=REPLACE).acquire(SLOT + GAP)).note == SUPERSEDED
    r.delete(KEYS.lease)
    acquired(lease(r, "s0", SLOT, overlap=REPLACE).acquire(SLOT))
    s1, s2 = (lease(r, f"s{i}", SLOT + i * GAP, overlap=REPLACE) for i in (1, 2))
    assert held(s2.acquire(SLOT + 2 * GAP)).note == PREEMPTING
    assert held(s1.acquire(SLOT + GAP)).note == SUPERSEDED


# -- allow-other-slots ---------------------------------------------------------------------------


def test_allow_other_slots_runs_slots_side_by_side_never_one_slot_twice(r: redis.Redis) -> None:
    def per_slot(holder: str, slot: int) -> Lease:
        return lease(r, holder, slot, overlap=ALLOW_OTHER_SLOTS, ttl_ms=5_000)

    a, b = per_slot("a", SLOT), per_slot("b", SLOT + GAP)
    fa = acquired(a.acquire(SLOT)).fence
    fb = acquired(b.acquire(SLOT + GAP)).fence
    assert fb > fa
    assert held(per_slot("a2", SLOT).acquire(SLOT)).slot == SLOT
    # The task's own lease shows one of them, for status, serve and the watchdog.
    assert r.get(KEYS.lease) == a.token
    complete(a, SLOT)
    assert r.get(KEYS.slot_lease(SLOT)) is None
    assert r.get(KEYS.lease) is None
    b.renew()
    assert r.get(KEYS.lease) == b.token
    assert isinstance(per_slot("a3", SLOT).acquire(SLOT), SlotDone)
    b.release({}, {})
    assert r.keys(f"{KEYS.base}:lease*") == []


def test_allow_other_slots_respects_a_task_lease_that_may_run_its_slot(r: redis.Redis) -> None:
    """b170e33 (which reads no protocol minimum) and manual runs take the task's lease for any
    slot: a per-slot run must not start beside them."""
    r.set(KEYS.lease, "old-pod:9f3a", px=60_000)
    got = held(lease(r, "a", SLOT, overlap=ALLOW_OTHER_SLOTS).acquire(SLOT))
    assert got.token == "old-pod:9f3a"
    assert r.get(KEYS.slot_lease(SLOT)) is None
    # The task's lease showing a run of another slot does not hold this one back.
    r.set(KEYS.lease, new_token("b", SLOT - GAP), px=60_000)
    acquired(lease(r, "a", SLOT, overlap=ALLOW_OTHER_SLOTS).acquire(SLOT))


# -- catch-up candidates and a finish that keeps the lease ---------------------------------------


def test_acquire_lists_the_unrun_candidates_after_since(r: redis.Redis) -> None:
    now = int(time.time())
    r.hset(KEYS.meta, "since", str((now - 10 * GAP) * 1000))
    candidates = [now - 12 * GAP, now - 3 * GAP, now - 2 * GAP, now - GAP]
    r.hset(KEYS.slot(now - 3 * GAP), "holder", "ran-it")
    r.hset(KEYS.slot(now - 2 * GAP), mapping={"skips": "1", "skipped": "paused"})
    got = acquired(lease(r, "a", now).acquire(now, catch_up=candidates))
    # Before since (the task's history before this release), done, skipped by policy: not unrun.
    assert got.unrun == (now - GAP,)
    # A retry of the same acquire (its reply lost) lists them again.
    retried = Lease(r, KEYS, got_token(r), ttl_ms=60_000, indexed=False)
    assert acquired(retried.acquire(now, catch_up=candidates)).unrun == (now - GAP,)


def got_token(r: redis.Redis) -> str:
    return cast(str, r.get(KEYS.lease))


def test_complete_keeping_the_lease_marks_a_caught_up_slot_once(r: redis.Redis) -> None:
    mine = lease(r, "a", SLOT + GAP)
    acquired(mine.acquire(SLOT + GAP))
    for _ in range(2):  # the second is a retry whose first reply was lost
        complete(mine, SLOT, keep_lease=True)
    assert marker(r, SLOT)["holder"] == "a"
    assert r.get(KEYS.lease) == mine.token
    assert len(stream_entries(r, KEYS.runs)) == 1
    complete(mine, SLOT + GAP)
    assert r.get(KEYS.lease) is None


# -- pause after consecutive failures -----------------------------------------------------------


def test_pause_after_n_consecutive_failures_a_success_starts_the_count_again(
    r: redis.Redis,
) -> None:
    def run(slot: int, ok: bool) -> bool:
        one = lease(r, "a", slot, pause_after_failures=3)
        got = one.acquire(slot)
        if isinstance(got, Paused):
            return False
        acquired(got)
        if ok:
            complete(one, slot)
            return True
        return one.release({"outcome": "failed"}, {"last_outcome": "failed"}, failure=True).paused

    assert [run(SLOT + i * GAP, ok) for i, ok in enumerate([False, False, True])] == [False] * 2 + [
        True
    ]
    assert r.hget(KEYS.state, "consecutive_failures") == "0"
    paused = [run(SLOT + (3 + i) * GAP, False) for i in range(3)]
    assert paused == [False, False, True]
    stored = meta(r)
    assert stored["paused"] == "1"
    assert stored["paused_note"] == "paused after 3 consecutive failures"
    assert (stored["protocol_min"], stored["protocol_min_before_pause"]) == ("3", "1")
    assert abs(float(stored["paused_at"]) - time.time()) < 60
    assert isinstance(lease(r, "b", SLOT + 9 * GAP).acquire(SLOT + 9 * GAP), Paused)


def test_only_a_failure_of_the_task_counts(r: redis.Redis) -> None:
    one = lease(r, "a", SLOT, pause_after_failures=1)
    acquired(one.acquire(SLOT))
    one.release({"outcome": "terminated"}, {"last_outcome": "terminated"})
    assert r.hget(KEYS.state, "consecutive_failures") is None
    assert "paused" not in meta(r)


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", OVERLAPS)
def test_each_call_is_one_round_trip_under_every_policy(
    redis_server: RedisServer, overlap: str
) -> None:
    client, conn = counting_client(redis_server.port)

    def one(holder: str, slot: int) -> Lease:
        return Lease(client, KEYS, new_token(holder, slot), ttl_ms=60_000, overlap=overlap,
                     indexed=False)  # fmt: skip

    warm = one("warm", SLOT - GAP)
    warm.acquire(SLOT - GAP)
    warm.renew()
    complete(warm, SLOT - GAP)
    a, b, c = one("a", SLOT), one("b", SLOT + GAP), one("c", SLOT)
    calls: dict[str, Callable[[], object]] = {
        "acquire": lambda: a.acquire(SLOT),
        "acquire (another slot)": lambda: b.acquire(SLOT + GAP),
        "acquire (held, same slot)": lambda: c.acquire(SLOT),
        "renew": a.renew,
        "complete": lambda: complete(a, SLOT),
        "acquire (done)": lambda: c.acquire(SLOT),
    }
    for name, call in calls.items():
        conn.reset()
        with contextlib.suppress(Preempted):  # replace: b has asked a to stop
            call()
        assert conn.sent == ["EVALSHA"], (overlap, name)
        assert conn.replies == 1, (overlap, name)
    client.close()


def test_a_skip_is_one_round_trip_with_its_record(redis_server: RedisServer) -> None:
    client, conn = counting_client(redis_server.port)
    acquired(Lease(client, KEYS, new_token("a", SLOT), ttl_ms=60_000).acquire(SLOT))
    skipper = Lease(client, KEYS, new_token("b", SLOT + GAP), ttl_ms=60_000)
    held(skipper.acquire(SLOT + GAP))  # caches nothing new: the acquire script is loaded
    conn.reset()
    held(skipper.acquire(SLOT + 2 * GAP))
    assert conn.sent == ["EVALSHA"]
    assert len(cast(list[Any], client.xrange(KEYS.runs))) == 2
    client.close()


@pytest.mark.parametrize("overlap", [o for o in OVERLAPS if o != SKIP])
def test_overlap_names_are_checked(r: redis.Redis, overlap: str) -> None:
    assert lease(r, "a", SLOT, overlap=overlap).protocol_min == 3
    with pytest.raises(ValueError, match="expected one of skip, buffer-one"):
        lease(r, "a", SLOT, overlap=overlap.upper())
