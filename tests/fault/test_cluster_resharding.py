"""Fault matrix row 5: Redis Cluster (3 primaries, ``redis-cli --cluster create``) with the
task's hash slot moved to another node while the task runs: the whole move (MOVED), and a
move caught halfway (ASK for a key already moved, TRYAGAIN for a script whose keys are split).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from redis.crc import key_slot

from runner.keys import TaskKeys
from runner.testing import RedisServer
from tests.fault.common import assert_clean, event, finished
from tests.fault.conftest import Figure
from tests.helpers.proc import LEASE, events, exec_args, outcome, run, runner_env, spawn
from tests.helpers.ticker import read_ticks, ticker_command
from tests.helpers.topologies import ClusterTopology
from tests.helpers.wait import wait_for

SCHEDULE = "0 0 * * *"


def _env(cluster: ClusterTopology) -> dict[str, str]:
    return runner_env(cluster.url, CRON_RUNNER_REDIS_CLUSTER="true", CRON_RUNNER_LEASE_TTL="3s",
                      CRON_RUNNER_SCHEDULE=SCHEDULE)  # fmt: skip


def _pttl_importing(node: RedisServer, key: str) -> int:
    """The key's PTTL on a node that is importing its slot (ASKING lets us read it there)."""
    c = node.client()
    try:
        pipe = c.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.pttl(key)
        return int(pipe.execute()[1])
    finally:
        c.close()


def _errors(node: RedisServer, code: str) -> int:
    """How many ``code`` error replies the node has sent (INFO errorstats)."""
    c = node.client()
    try:
        stats = cast(dict[str, dict[str, int]], c.info("errorstats"))
        return int(stats.get(f"errorstat_{code}", {}).get("count", 0))
    finally:
        c.close()


def test_row5a_slot_moved_to_another_node_mid_run_the_run_follows_it(
    tmp_path: Path, figure: Figure
) -> None:
    ticks = tmp_path / "ticks"
    with ClusterTopology() as cluster:
        env = _env(cluster)
        slot = key_slot((LEASE % "moving").encode())
        source = cluster.owner_of_slot(slot)
        target = next(n for n in cluster.nodes if n is not source)
        a = spawn(exec_args("moving", "pod-a", ticker_command(ticks, "a", seconds=4)), env)
        wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
        moved = cluster.migrate_slot(slot, target)
        # The same command (one task, one definition): B must skip, so it never ticks.
        b = run(exec_args("moving", "pod-b", ticker_command(ticks, "a", seconds=4)), env)
        _, a_err = a.communicate(timeout=30)
        assert_clean(a_err)
        assert_clean(b.stderr)
        assert (a.returncode, outcome(a_err)) == (0, "ran"), a_err
        # Held by A, its run of the same slot, which B sees renew (or finish).
        assert b.returncode == 0, b.stderr
        assert outcome(b.stderr) in ("skipped_held", "skipped_done"), b.stderr
        assert cluster.owner_of_slot(slot) is target
        assert target.client().keys("cron-runner:{default:moving}:slot:*")
        assert not source.client().keys("cron-runner:{default:moving}:*")
    assert moved >= 2  # the lease and the fence at least
    assert len({t.fence for t in read_ticks(ticks, "a")}) == 1  # A's ticks only
    figure("5a", duplicates=0, overlap_ms=0, keys_moved=moved,
           exit_codes={"a": a.returncode, "b": b.returncode})  # fmt: skip


def test_row5b_slot_caught_halfway_ask_and_tryagain_are_retried(
    tmp_path: Path, figure: Figure
) -> None:
    """The lease key is on the new node, the fence still on the old: renewals (one key) are
    redirected with ASK; an acquisition (lease + fence) gets TRYAGAIN and is retried under the
    connect deadline until the move completes, then finds the lease held."""
    ticks = tmp_path / "ticks"
    keys = TaskKeys("cron-runner", "default", "halfway")
    with ClusterTopology() as cluster:
        env = _env(cluster)
        slot = key_slot(keys.lease.encode())
        target = next(n for n in cluster.nodes if n is not cluster.owner_of_slot(slot))
        a = spawn(exec_args("halfway", "pod-a", ticker_command(ticks, "a", seconds=4)), env)
        wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
        source = cluster.begin_migration(slot, target)
        cluster.move_keys(slot, source, target, only=[keys.lease])
        moved_ttl_ms = _pttl_importing(target, keys.lease)
        b = spawn(exec_args("halfway", "pod-b", ticker_command(ticks, "a", seconds=4)), env)
        # A renews through ASK: the moved lease's TTL, which only runs down, goes back up.
        wait_for(lambda: _pttl_importing(target, keys.lease) > moved_ttl_ms, what="A to renew")
        # B's acquisition (lease and fence, now on two nodes) meets TRYAGAIN.
        wait_for(lambda: _errors(source, "TRYAGAIN") > 0, what="B to meet TRYAGAIN")
        b_waiting = b.poll() is None
        cluster.move_keys(slot, source, target)
        cluster.finish_migration(slot, target)
        a_err, b_err = finished(a, b)
    assert (a.returncode, outcome(a_err)) == (0, "ran"), a_err
    assert b.returncode == 0, b_err
    assert outcome(b_err) in ("skipped_held", "skipped_done"), b_err
    assert b_waiting
    assert not [e for e in events(a_err) if e.get("event") == "lease_lost"]
    assert len({t.fence for t in read_ticks(ticks, "a")}) == 1  # A's ticks only
    figure("5b", duplicates=0, overlap_ms=0, contender_waited_for_the_move=b_waiting,
           fence=event(a_err, "acquired")["fence"],
           exit_codes={"a": a.returncode, "b": b.returncode})  # fmt: skip
