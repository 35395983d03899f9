"""Fault matrix row 4: a Sentinel failover forced while a task runs. 1 primary, 1 replica and
3 sentinels, all real (Debian's redis-server and redis-sentinel); the runners find the primary
through the sentinels only (CRON_RUNNER_REDIS_SENTINELS)."""

from __future__ import annotations

import time
from pathlib import Path

from runner.errors import StoreUnavailable
from runner.testing import free_port
from tests.fault.common import (
    assert_clean,
    event,
    finished,
    overlap_ms,
    run_until_ran,
    stale_writes_accepted,
    start_when_free,
)
from tests.fault.conftest import Figure
from tests.helpers.proc import LEASE, exec_args, outcome, run, runner_env, spawn
from tests.helpers.tcpproxy import TcpProxy
from tests.helpers.ticker import read_ticks, ticker_command
from tests.helpers.topologies import SentinelTopology
from tests.helpers.wait import wait_for

SCHEDULE = "0 0 * * *"


def _env(topology: SentinelTopology, **extra: str) -> dict[str, str]:
    return runner_env(
        "redis://ignored.invalid:6379/0",
        CRON_RUNNER_REDIS_SENTINELS=topology.sentinel_env,
        CRON_RUNNER_REDIS_SENTINEL_MASTER=topology.master_name,
        CRON_RUNNER_LEASE_TTL="3s",
        **extra,
    )


def test_row4a_failover_mid_run_with_min_replicas_1_the_lease_survives(
    tmp_path: Path, figure: Figure
) -> None:
    ticks = tmp_path / "ticks"
    with SentinelTopology() as topology:
        env = _env(topology, CRON_RUNNER_REDIS_MIN_REPLICAS="1", CRON_RUNNER_SCHEDULE=SCHEDULE)
        old_port = topology.master_port()
        # Longer than the TTL: renewals must reach the new primary for the run to finish.
        a = spawn(exec_args("failover", "pod-a", ticker_command(ticks, "a", seconds=5)), env)
        wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
        new_port = topology.failover()
        assert new_port != old_port
        # A contender that asks the sentinels now lands on the new primary: the lease is there.
        # (The same command: one task has one definition.)
        b = run(exec_args("failover", "pod-b", ticker_command(ticks, "a", seconds=5)), env)
        assert (b.returncode, outcome(b.stderr)) == (0, "skipped_held"), b.stderr
        _, a_err = a.communicate(timeout=30)
        assert_clean(a_err)
        assert (a.returncode, outcome(a_err)) == (0, "ran"), a_err
        # The run completed on the new primary: its slot marker is there, the fence goes on.
        new_primary = topology.server_on(new_port).client()
        assert new_primary.keys("cron-runner:{default:failover}:slot:*")
        assert new_primary.get(LEASE % "failover") is None
        # No MIN_REPLICAS: the old primary has not rejoined as a replica yet (row 4c).
        c = run(
            exec_args("failover", "pod-c", ["true"]),
            {**env, "CRON_RUNNER_SCHEDULE": "", "CRON_RUNNER_REDIS_MIN_REPLICAS": "0"},
        )
        assert event(c.stderr, "acquired")["fence"] > event(a_err, "acquired")["fence"]
    figure(
        "4a",
        duplicates=0,
        overlap_ms=0,
        contender_during_failover=outcome(b.stderr),
        exit_codes={"a": a.returncode, "b": b.returncode},
    )


def test_row4b_failover_without_replica_acks_loses_the_lease_and_shows_the_window(
    tmp_path: Path, figure: Figure
) -> None:
    """The replica receives nothing (its replication link goes through a proxy that black-holes
    it, while the link still looks up), then it is promoted. With MIN_REPLICAS=1 the run is
    refused before it starts; with 0 it runs, the key is lost in the failover, a second holder
    starts on the new primary, and the first learns it at its next renewal and stops."""
    ticks, sink = tmp_path / "ticks", tmp_path / "sink.db"
    primary_port = free_port()
    with (
        TcpProxy(primary_port) as link,
        SentinelTopology(primary_port=primary_port, replica_upstream_port=link.port) as topology,
    ):
        env = _env(topology)
        assert (
            run(exec_args("window", "warm", ["true"]), env).returncode == 0
        )  # fence 1, replicated
        link.blackhole()

        refused = run(exec_args("window", "pod-r", ticker_command(ticks, "r")),
                      {**env, "CRON_RUNNER_REDIS_MIN_REPLICAS": "1"})  # fmt: skip
        assert_clean(refused.stderr)
        assert refused.returncode == 69, refused.stderr
        assert "only 0 of 1 replicas acknowledged" in refused.stderr
        assert not read_ticks(ticks, "r")

        a = spawn(exec_args("window", "pod-a", ticker_command(ticks, "a", sink=sink)), env)
        wait_for(lambda: read_ticks(ticks, "a"), what="A's task to start")
        topology.failover()
        b, before = start_when_free(
            exec_args("window", "pod-b", ticker_command(ticks, "b", seconds=1.5, sink=sink)),
            env, ticks, "b",
        )  # fmt: skip
        a_err, b_err = finished(a, b)
    assert (a.returncode, outcome(a_err)) == (75, "lease_lost"), a_err
    assert "renew refused: not the lease owner (lease is held by pod-b)" in a_err
    assert (b.returncode, outcome(b_err)) == (0, "ran"), b_err
    fences = (event(a_err, "acquired")["fence"], event(b_err, "acquired")["fence"])
    # The counter's last INCRs never reached the replica (the refused run's and A's), yet B's
    # fence is above A's: it is never below the new primary's clock in ms.
    assert fences[1] > fences[0], fences
    # So a sink guarded by the fence takes B's writes and none of A's after B's first.
    a_ticks, b_ticks = read_ticks(ticks, "a"), read_ticks(ticks, "b")
    assert {t.outcome for t in b_ticks} == {"accepted"}
    assert stale_writes_accepted(sink, "a", "b") == 0
    overlap = overlap_ms(a_ticks, b_ticks)
    # The window: from B's start to A's next renewal (every ttl/3 = 1 s), plus the kill.
    assert overlap <= 1000 + 1000, overlap
    figure(
        "4b",
        duplicates=1 if overlap > 0 else 0,
        overlap_ms=max(overlap, 0),
        fences=fences,
        stale_writes_refused=sum(t.outcome == "rejected" for t in a_ticks),
        refused_with_min_replicas_1=refused.returncode,
        b_waited_for=before,
        exit_codes={"a": a.returncode, "b": b.returncode, "min_replicas_1": refused.returncode},
    )


def test_row4c_after_a_failover_min_replicas_refuses_runs_until_a_replica_is_back(
    tmp_path: Path, figure: Figure
) -> None:
    """With one replica and MIN_REPLICAS=1, the new primary has no replica until Sentinel has
    demoted the old one and it has resynced: until then every run is refused (exit 69, task not
    run) and retried, as a Job retries. Then runs go on, the fence still going up."""
    with SentinelTopology() as topology:
        env = _env(topology, CRON_RUNNER_REDIS_MIN_REPLICAS="1")
        first, _ = run_until_ran(exec_args("follow", "pod-a", ["true"]), env)
        topology.failover()
        switched_at = time.monotonic()
        second, refusals = run_until_ran(exec_args("follow", "pod-b", ["true"]), env, timeout_s=60)
        refused_s = round(time.monotonic() - switched_at, 1)
        fences = [event(x.stderr, "acquired")["fence"] for x in (first, second)]
    # Refused at least once (the old primary needs seconds to rejoin), and only ever by the
    # replica check's exit code: an empty list would mean MIN_REPLICAS was not applied.
    assert refusals, "no run was refused while the new primary had no replica"
    assert set(refusals) == {f"exit {StoreUnavailable.exit_code}"}, refusals
    assert fences[1] > fences[0]
    figure("4c", duplicates=0, overlap_ms=0, runs_refused=len(refusals),
           refused_for_s=refused_s, fences=fences,
           exit_codes={"refused": 69, "after": second.returncode})  # fmt: skip
