"""The lease scripts on a real redis-server: exclusion, stale holders, slots, fencing, round trips."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis

from runner.errors import LeaseNotOwned
from runner.keys import TaskKeys
from runner.lease.scripts import SCRIPTS, Acquired, Held, Lease, SlotDone, holder_of, new_token
from runner.testing import RedisServer
from tests.helpers.lease_tools import (
    command_calls,
    counting_client,
    delta,
    dump_keys,
    pttl_ms,
    run_helper,
    stream_entries,
)
from tests.helpers.wait import wait_for

SLOT = 1_700_000_040
KEYS = TaskKeys("cron-runner", "default", "report")


def lease_for(client: redis.Redis, holder: str, **kwargs: Any) -> Lease:
    kwargs.setdefault("ttl_ms", 60_000)
    # The scope's index (another key, written after the script) is the tenant tests' subject.
    kwargs.setdefault("indexed", False)
    return Lease(client, KEYS, new_token(holder), **kwargs)


def fence_of(got: object) -> int:
    assert isinstance(got, Acquired), got
    return got.fence


def marker_for(lease: Lease, finished_at: float = 1_700_000_100.5) -> dict[str, str | float]:
    return {"holder": lease.holder, "finished_at": f"{finished_at:.3f}"}


def slot_keys(r: redis.Redis) -> list[str]:
    return sorted(r.scan_iter(match=f"{KEYS.base}:slot:*"))


# -- mutual exclusion ---------------------------------------------------------------------


@pytest.mark.parametrize("slot", [None, SLOT])
def test_fifty_processes_released_together_exactly_one_acquires(
    redis_server: RedisServer, r: redis.Redis, slot: int | None
) -> None:
    keys = TaskKeys("cron-runner", "contention", "invoice")
    trials, contenders = 5 if slot is None else 2, 50
    last_fence = 0
    for trial in range(1, trials + 1):
        args = [str(redis_server.port), keys.task, str(contenders)]
        proc = run_helper("contend.py", *args, *([str(slot)] if slot is not None else []))
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["ready"] == contenders
        assert report["failed"] == 0, proc.stderr
        results = report["results"]
        assert len(results) == contenders
        # Every contender was connected and waiting before any was let go.
        assert min(res["released_at"] for res in results) >= report["all_ready_at"]

        winners = [res for res in results if res["kind"] == "acquired"]
        assert len(winners) == 1, f"trial {trial}: {len(winners)} processes acquired"
        winner = winners[0]
        losers = [res for res in results if res is not winner]
        assert {res["kind"] for res in losers} == {"held"}
        assert {res["holder_token"] for res in losers} == {winner["token"]}
        assert all(0 < res["ttl_ms"] <= 60_000 for res in losers)
        # The fence moved once per trial, by the one winner.
        assert winner["fence"] > last_fence
        last_fence = winner["fence"]
        assert r.get(keys.lease) == winner["token"]
        assert r.get(keys.fence) == str(last_fence)

        # The lease runs out (as if its holder died) before the next trial.
        r.delete(keys.lease)


def test_held_names_the_holder_and_its_remaining_ttl(r: redis.Redis) -> None:
    a = lease_for(r, "pod-a", ttl_ms=30_000)
    b = lease_for(r, "pod-b")
    fence = fence_of(a.acquire(SLOT))
    got = b.acquire(SLOT)
    assert isinstance(got, Held)
    assert got.token == a.token
    assert got.holder == "pod-a"
    assert 0 < got.ttl_ms <= 30_000
    assert r.get(KEYS.fence) == str(fence)


def test_token_is_holder_plus_randomness() -> None:
    tokens = {new_token("web-7d9f:1234") for _ in range(1000)}
    assert len(tokens) == 1000
    assert {holder_of(t) for t in tokens} == {"web-7d9f:1234"}


# -- stale holder -------------------------------------------------------------------------


def test_stale_holder_is_refused_everything_and_changes_nothing(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    # History that must survive: an earlier slot that ran, its record and the state hash.
    earlier = lease_for(r, "pod-earlier")
    assert isinstance(earlier.acquire(SLOT - 60), Acquired)
    earlier.complete(SLOT - 60, {"outcome": "ran"}, {"last_success": "1"}, marker_for(earlier))

    stale = lease_for(r, "pod-stale", ttl_ms=200)
    stale_fence = fence_of(stale.acquire(SLOT))
    wait_for(lambda: not r.exists(KEYS.lease), what="the stale holder's lease to expire")
    current = lease_for(r, "pod-current", ttl_ms=60_000)
    assert fence_of(current.acquire(SLOT)) > stale_fence

    values_before, ttls_before = dump_keys(redis_server.port)
    assert set(values_before) == {
        k.encode()
        for k in (KEYS.lease, KEYS.fence, KEYS.meta, KEYS.runs, KEYS.state, KEYS.slot(SLOT - 60))
    }

    with pytest.raises(LeaseNotOwned) as renew:
        stale.renew()
    with pytest.raises(LeaseNotOwned) as complete:
        stale.complete(SLOT, {"outcome": "ran"}, {"last_success": "2"}, marker_for(stale))
    with pytest.raises(LeaseNotOwned) as release:
        stale.release({"outcome": "failed"}, {"last_failure": "2"})
    for refused, operation in ((renew, "renew"), (complete, "complete"), (release, "release")):
        assert refused.value.operation == operation
        assert refused.value.current_holder == "pod-current"
        assert refused.value.exit_code == 75

    values_after, ttls_after = dump_keys(redis_server.port)
    assert values_after == values_before
    lease = KEYS.lease.encode()
    # Not extended, and not cut down to the stale holder's 200 ms either.
    assert 200 < ttls_after[lease] <= ttls_before[lease]
    marker = KEYS.slot(SLOT - 60).encode()
    assert 0 < ttls_after[marker] <= ttls_before[marker]
    assert ttls_after[KEYS.fence.encode()] == ttls_before[KEYS.fence.encode()] == -1

    # The current holder is unaffected: it renews and completes the slot as usual.
    current.renew()
    current.complete(SLOT, {"outcome": "ran"}, {"last_success": "3"}, marker_for(current))
    got = stale.acquire(SLOT)
    assert isinstance(got, SlotDone)
    assert got.holder == "pod-current"


def test_stale_holder_refused_when_the_lease_is_free(r: redis.Redis) -> None:
    stale = lease_for(r, "pod-stale", ttl_ms=100)
    assert isinstance(stale.acquire(SLOT), Acquired)
    wait_for(lambda: not r.exists(KEYS.lease), what="the lease to expire")
    for call in (
        stale.renew,
        lambda: stale.complete(SLOT, {"outcome": "ran"}, {}, marker_for(stale)),
        lambda: stale.release({"outcome": "failed"}, {}),
    ):
        with pytest.raises(LeaseNotOwned) as refused:
            call()
        assert refused.value.current_holder is None
    assert slot_keys(r) == []
    assert not r.exists(KEYS.lease, KEYS.runs, KEYS.state)


# -- slots --------------------------------------------------------------------------------


def test_completed_slot_is_done_even_though_the_lease_is_free(r: redis.Redis) -> None:
    first = lease_for(r, "pod-a", retention_ms=7_200_000)
    fence = fence_of(first.acquire(SLOT))
    first.complete(
        SLOT, {"outcome": "ran"}, {"last_success": "x"}, marker_for(first, 1_700_000_099.25)
    )
    assert not r.exists(KEYS.lease)
    assert r.hgetall(KEYS.slot(SLOT)) == {
        "holder": "pod-a",
        "finished_at": "1700000099.250",
        "token": first.token,
    }
    assert 0 < pttl_ms(r, KEYS.slot(SLOT)) <= 7_200_000

    late = lease_for(r, "pod-b")
    assert late.acquire(SLOT) == SlotDone(holder="pod-a", finished_at=1_700_000_099.25)
    # The skip touched neither the lease nor the fence.
    assert not r.exists(KEYS.lease)
    assert r.get(KEYS.fence) == str(fence)
    # Other slots, and manual runs, are still open.
    assert fence_of(late.acquire(SLOT + 60)) > fence


def test_marker_retention_is_the_configured_one(r: redis.Redis) -> None:
    lease = lease_for(r, "pod-a", retention_ms=5_000)
    lease.acquire(SLOT)
    lease.complete(SLOT, {}, {}, marker_for(lease))
    assert 0 < pttl_ms(r, KEYS.slot(SLOT)) <= 5_000


def test_failed_release_leaves_the_slot_open_for_a_retry(r: redis.Redis) -> None:
    failed = lease_for(r, "pod-a")
    fence = fence_of(failed.acquire(SLOT))
    failed.release({"outcome": "failed", "exit_code": 1}, {"last_failure": "x"})
    assert not r.exists(KEYS.lease)
    assert slot_keys(r) == []

    retry = lease_for(r, "pod-b")
    assert fence_of(retry.acquire(SLOT)) > fence
    retry.complete(SLOT, {"outcome": "ran"}, {}, marker_for(retry))
    assert lease_for(r, "pod-c").acquire(SLOT) == SlotDone(
        holder="pod-b", finished_at=1_700_000_100.5
    )


def test_manual_runs_never_write_a_marker(r: redis.Redis) -> None:
    for fence in (1, 2):
        manual = lease_for(r, f"pod-{fence}")
        assert isinstance(manual.acquire(None), Acquired)
        manual.complete(None, {"outcome": "ran"}, {"last_success": str(fence)}, marker_for(manual))
    failed = lease_for(r, "pod-3")
    assert isinstance(failed.acquire(None), Acquired)
    failed.release({"outcome": "failed"}, {"last_failure": "3"})
    assert slot_keys(r) == []
    assert r.xlen(KEYS.runs) == 3
    assert r.hgetall(KEYS.state) == {"last_success": "2", "last_failure": "3"}


def test_complete_and_release_record_the_run(r: redis.Redis) -> None:
    lease = lease_for(r, "pod-a")
    lease.acquire(SLOT)
    lease.complete(SLOT, {"outcome": "ran", "fence": 1}, {"last_slot": SLOT}, marker_for(lease))
    other = lease_for(r, "pod-b")
    other.acquire(SLOT + 60)
    other.release({"outcome": "failed", "exit_code": 3}, {"last_failure": "now"})
    records = stream_entries(r, KEYS.runs)
    assert records == [{"outcome": "ran", "fence": "1"}, {"outcome": "failed", "exit_code": "3"}]
    assert r.hgetall(KEYS.state) == {"last_slot": str(SLOT), "last_failure": "now"}


def test_runs_stream_is_capped(r: redis.Redis) -> None:
    for i in range(400):
        lease = lease_for(r, f"pod-{i}", runs_maxlen=10)
        lease.acquire(None)
        lease.release({"i": i}, {})
    # MAXLEN ~ trims whole stream nodes (100 entries by default), never below the cap.
    records = stream_entries(r, KEYS.runs)
    assert 10 <= len(records) <= 10 + 100
    assert records[-1] == {"i": "399"}


def test_record_writes_an_outcome_without_touching_someone_elses_lease(r: redis.Redis) -> None:
    gone = lease_for(r, "pod-a")
    other = lease_for(r, "pod-b")
    assert isinstance(other.acquire(SLOT), Acquired)
    gone.record({"outcome": "lease_lost"}, {"last_failure": "x"})
    assert r.get(KEYS.lease) == other.token
    assert slot_keys(r) == []
    assert r.xlen(KEYS.runs) == 1


# -- fencing ------------------------------------------------------------------------------


def test_fencing_tokens_strictly_increase_across_acquisitions(r: redis.Redis) -> None:
    fences = []
    for i in range(20):
        lease = lease_for(r, f"pod-{i % 3}")
        got = lease.acquire(SLOT + 60 * i if i % 2 else None)
        assert isinstance(got, Acquired)
        fences.append(got.fence)
        if i % 3 == 0:
            lease.release({}, {})
        elif i % 3 == 1:
            lease.complete(SLOT + 60 * i, {}, {}, marker_for(lease))
        else:
            r.delete(KEYS.lease)  # expired: its holder died
    assert fences == sorted(set(fences))
    assert len(fences) == 20


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    # appendfsync always: Redis writes and fsyncs the AOF before it replies, so every fence
    # a client was given is on disk even when the server is killed with SIGKILL right after.
    # With the default everysec a crash may drop the last second of writes, and whether it
    # does depends on timing: the test could not be deterministic. SIGKILL (not SIGTERM,
    # which flushes on shutdown anyway) is the restart that can actually lose data.
    with RedisServer(appendonly=True, extra_args=["--appendfsync", "always"]) as server:
        client = server.client()
        config = cast(dict[str, str], client.config_get("append*"))
        assert (config["appendonly"], config["appendfsync"]) == ("yes", "always")
        client.close()
        yield server


def test_fencing_survives_a_redis_restart_with_aof(aof_server: RedisServer) -> None:
    fences = []
    client = aof_server.client()
    for i in range(5):
        lease = lease_for(client, f"pod-{i}")
        got = lease.acquire(SLOT + 60 * i)
        assert isinstance(got, Acquired)
        fences.append(got.fence)
        lease.complete(SLOT + 60 * i, {}, {}, marker_for(lease))
    holder = lease_for(client, "pod-holding")
    got = holder.acquire(None)
    assert isinstance(got, Acquired)
    fences.append(got.fence)
    client.close()

    for kill in (True, False):
        aof_server.restart(kill=kill)
        client = aof_server.client()
        # The lease, the fence and the slot markers all came back from the AOF.
        assert client.get(KEYS.lease) == holder.token
        assert isinstance(lease_for(client, "pod-late").acquire(None), Held)
        assert lease_for(client, "pod-late").acquire(SLOT) == SlotDone(
            holder="pod-0", finished_at=1_700_000_100.5
        )
        holder.client = client
        holder.release({}, {})
        holder = lease_for(client, "pod-after-restart")
        got = holder.acquire(None)
        assert isinstance(got, Acquired)
        fences.append(got.fence)
        client.close()
    assert fences == sorted(set(fences))
    assert len(fences) == 8


def test_reentrant_acquire_returns_the_same_fence_without_incr(r: redis.Redis) -> None:
    lease = lease_for(r, "pod-a", ttl_ms=60_000)
    fence = fence_of(lease.acquire(SLOT))
    r.pexpire(KEYS.lease, 1_000)
    before = command_calls(r)
    # The runner's retry of an acquire whose reply was lost.
    assert lease.acquire(SLOT) == Acquired(fence=fence)
    assert delta(before, command_calls(r), "incr", "set") == {"incr": 0, "set": 0}
    assert r.get(KEYS.fence) == str(fence)
    assert r.get(KEYS.lease) == lease.token
    assert pttl_ms(r, KEYS.lease) > 1_000  # refreshed to the full TTL
    # Still exclusive: another token is held off, and does not bump the fence either.
    assert isinstance(lease_for(r, "pod-b").acquire(SLOT), Held)
    assert r.get(KEYS.fence) == str(fence)


# -- round trips --------------------------------------------------------------------------


def test_every_operation_is_one_round_trip_once_scripts_are_cached(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    client, conn = counting_client(redis_server.port)
    lease = lease_for(client, "pod-a")
    lease.acquire(SLOT)  # caches the scripts on the server
    lease.renew()
    lease.complete(SLOT, {}, {}, marker_for(lease))
    other = lease_for(client, "pod-b")
    other.acquire(None)
    other.release({}, {})
    r.delete(KEYS.lease)

    cases = {
        "acquire": lambda: lease.acquire(SLOT + 60),
        "acquire (held)": lambda: other.acquire(SLOT + 60),
        "renew": lease.renew,
        "complete": lambda: lease.complete(SLOT + 60, {"o": "ran"}, {"s": 1}, marker_for(lease)),
        "acquire (slot done)": lambda: other.acquire(SLOT + 60),
        "acquire (manual)": lambda: other.acquire(None),
        "release": lambda: other.release({"o": "failed"}, {"s": 2}),
        "record": lambda: other.record({"o": "lost"}, {}),
    }
    for name, call in cases.items():
        conn.reset()
        before = command_calls(r)
        call()
        after = command_calls(r)
        assert conn.sent == ["EVALSHA"], name
        assert conn.replies == 1, name
        assert delta(before, after, "evalsha", "eval", "script") == {
            "evalsha": 1,
            "eval": 0,
            "script": 0,
        }, name
    client.close()


def test_noscript_costs_one_eval_then_the_script_is_cached_again(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    client, conn = counting_client(redis_server.port)
    lease = lease_for(client, "pod-a")
    fence = fence_of(lease.acquire(SLOT))
    r.script_flush()
    assert r.script_exists(*(s.sha for s in SCRIPTS.values())) == [False, False, False]

    before = command_calls(r)
    conn.reset()
    assert lease.acquire(SLOT) == Acquired(fence=fence)  # re-entrant, through EVAL this time
    assert conn.sent == ["EVALSHA", "EVAL"]
    assert conn.replies == 2
    assert delta(before, command_calls(r), "evalsha", "eval", "script") == {
        "evalsha": 1,
        "eval": 1,
        "script": 0,
    }
    assert r.script_exists(SCRIPTS["acquire"].sha) == [True]

    conn.reset()
    lease.acquire(SLOT)
    assert conn.sent == ["EVALSHA"]

    # Each script pays once: renew and finish were flushed too.
    conn.reset()
    lease.renew()
    lease.renew()
    lease.complete(SLOT, {}, {}, marker_for(lease))
    assert conn.sent == ["EVALSHA", "EVAL", "EVALSHA", "EVALSHA", "EVAL"]
    assert lease_for(client, "pod-b").acquire(SLOT) == SlotDone("pod-a", 1_700_000_100.5)
    client.close()


def test_marker_is_written_even_when_the_caller_gives_none(r: redis.Redis) -> None:
    lease = lease_for(r, "pod-a")
    assert isinstance(lease.acquire(SLOT), Acquired)
    lease.complete(SLOT, {}, {})
    done = lease_for(r, "pod-b").acquire(SLOT)
    assert isinstance(done, SlotDone)
    assert done.holder == "pod-a"


def test_complete_retried_after_a_lost_reply_succeeds_and_changes_nothing(r: redis.Redis) -> None:
    lease = lease_for(r, "pod-a")
    assert isinstance(lease.acquire(SLOT), Acquired)
    lease.complete(SLOT, {"outcome": "ran"}, {}, marker_for(lease))
    before = {k: r.dump(k) for k in cast(list[str], r.keys("*"))}
    lease.complete(SLOT, {"outcome": "ran"}, {}, marker_for(lease))  # the retry
    assert {k: r.dump(k) for k in cast(list[str], r.keys("*"))} == before
    # Another token is still refused.
    with pytest.raises(LeaseNotOwned):
        lease_for(r, "pod-b").complete(SLOT, {}, {})


# -- the scope's task index ---------------------------------------------------------------------


def test_a_refused_index_write_is_logged_and_the_finish_still_counts(
    redis_server: RedisServer, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Runs (Lease) and unleased records (journal) share one index write: refused (no +sadd),
    both log it once and return what the finish did; the next finish tries again."""
    from runner.lease import journal  # noqa: PLC0415

    r.execute_command("ACL", "SETUSER", "no-sadd", "reset", "on", ">pw", "~*", "+@all", "-sadd")
    client = redis.Redis(port=redis_server.port, username="no-sadd", password="pw",
                         decode_responses=True)  # fmt: skip
    lease = lease_for(client, "pod-a", indexed=True)
    assert isinstance(lease.acquire(SLOT), Acquired)
    with caplog.at_level("WARNING", logger="runner"):
        lease.complete(SLOT, {"outcome": "ran"}, {"last_outcome": "ran"}, marker_for(lease))
        journal.record_unleased(client, KEYS, {"outcome": "ran"}, {"last_outcome": "ran"},
                                runs_maxlen=100)  # fmt: skip
    failed = [rec for rec in caplog.records if getattr(rec, "event", None) == "index_failed"]
    assert len(failed) == 2, caplog.text
    assert all("the ACL needs +sadd" in rec.getMessage() for rec in failed)
    assert r.hget(KEYS.state, "last_outcome") == "ran"
    assert not r.hget(KEYS.state, "indexed")  # so the next finish tries again
    assert not r.sismember(KEYS.index, KEYS.task)
    client.close()
