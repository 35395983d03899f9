"""The overlap policies across clusters: separate ``cron-runner exec`` processes, three per slot
as three clusters' CronJobs would start them (CRON_RUNNER_CLUSTER_NAME), on one Redis and
scope, on consecutive slots named by their Job names (so no real minutes pass). Each task is a
ticker (tests/helpers/ticker.py): its side effects' time stamps show the order and overlap each
policy promises. Then the same with the holder frozen (SIGSTOP) past its TTL, and with Redis
restarted while a slot waits; and the round trips of a run and of a skip under each policy."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runner.testing import RedisServer
from tests.fault.common import assert_clean, event_time
from tests.fault.conftest import Figure
from tests.helpers.monitor import client_commands
from tests.helpers.proc import (
    LoggedRun,
    cronjob_env,
    exec_args,
    outcome,
    run,
    runner_env,
)
from tests.helpers.ticker import Tick, children, read_ticks, ticker_command
from tests.helpers.wait import wait_for

CLUSTERS = ("eu", "us", "ap")
TASK = "sync"
TTL_S = 3


def recent_slots(n: int) -> list[int]:
    """``n`` consecutive minutes, all past (a Job named for a future minute is refused)."""
    first = (int(time.time()) // 60 - n - 5) * 60
    return [first + 60 * i for i in range(n)]


class Cluster:
    """Starts the pods of a CronJob in one cluster, each running a ticker for its slot."""

    def __init__(self, server: RedisServer, tmp: Path, overlap: str, **env: str) -> None:
        self.server = server
        self.tmp = tmp
        self.ticks = tmp / "ticks"
        self.overlap = overlap
        self.env = env
        self.runs: dict[str, LoggedRun] = {}
        self.started_at: dict[str, float] = {}

    def start(self, cluster: str, slot: int, seconds: float, **env: str) -> LoggedRun:
        label = f"{cluster}-{slot}"
        environment = cronjob_env(
            self.server.url, TASK, "* * * * *", slot,
            CRON_RUNNER_CLUSTER_NAME=cluster, CRON_RUNNER_OVERLAP=self.overlap,
            CRON_RUNNER_LEASE_TTL=f"{TTL_S}s", **{**self.env, **env},
        )  # fmt: skip
        command = ticker_command(self.ticks, label, interval_s=0.02, seconds=seconds)
        self.started_at[label] = time.time()
        self.runs[label] = proc = LoggedRun(
            exec_args(TASK, f"pod-{slot // 60}", command), environment, self.tmp / f"{label}.log",
            start_new_session=True,
        )  # fmt: skip
        return proc

    def start_slot(self, slot: int, seconds: float) -> None:
        for cluster in CLUSTERS:
            self.start(cluster, slot, seconds)

    @contextmanager
    def frozen_holder(self, slot: int) -> Iterator[float]:
        """A pod of ``slot`` whose task ticks, its runner frozen (SIGSTOP) for the block: yields
        when it froze. Its command, in a group of its own, runs on until the supervisor acts."""
        holder = self.start("eu", slot, seconds=60)
        wait_for(lambda: self.ticked(slot), what="the holder's task")
        os.killpg(holder.pid, signal.SIGSTOP)
        try:
            yield time.time()
        finally:
            os.killpg(holder.pid, signal.SIGCONT)

    def ticked(self, slot: int) -> bool:
        return any(t.label.endswith(f"-{slot}") for t in read_ticks(self.ticks))

    def finish(self) -> dict[str, tuple[str, int]]:
        """Each run's outcome and exit code, by label, once all have ended."""
        done = {}
        for label, proc in self.runs.items():
            stderr = proc.finish(60)
            assert_clean(stderr)
            done[label] = (str(outcome(stderr)), int(proc.returncode))
        return done

    def by_slot(self, slot: int) -> list[Tick]:
        """The ticks of ``slot``'s one run: it must be one."""
        ticks = [t for t in read_ticks(self.ticks) if t.label.endswith(f"-{slot}")]
        assert len({t.label for t in ticks}) == 1, {t.label for t in ticks}
        return ticks

    def stderr(self, label: str) -> str:
        return self.runs[label].log.read_text()

    def kill_all(self) -> None:
        for proc in self.runs.values():
            for pid in (*children(proc.pid), proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.wait(10)


@pytest.fixture
def clusters(redis_server: RedisServer, tmp_path: Path) -> Any:
    made: list[Cluster] = []

    def make(overlap: str, server: RedisServer | None = None, **env: str) -> Cluster:
        made.append(Cluster(server or redis_server, tmp_path, overlap, **env))
        return made[-1]

    yield make
    for c in made:
        c.kill_all()


def history(server: RedisServer) -> list[dict[str, Any]]:
    res = run(["history", TASK, "--output", "json"], runner_env(server.url))
    assert res.returncode == 0, res.stderr
    runs: list[dict[str, Any]] = json.loads(res.stdout)["runs"]
    return runs[::-1]  # oldest first


def ran_per_slot(results: dict[str, tuple[str, int]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for label, (got, _) in results.items():
        slot = int(label.rsplit("-", 1)[1])
        counts[slot] = counts.get(slot, 0) + (got in ("ran", "replaced"))
    return counts


# -- each policy, three clusters, consecutive slots -------------------------------------------------


def test_buffer_one_the_next_slot_runs_right_after_a_later_one_replaces_the_waiter(
    clusters: Any, redis_server: RedisServer
) -> None:
    c = clusters("buffer-one")
    s0, s1, s2, s3 = recent_slots(4)
    buffer = redis_server.client()
    c.start_slot(s0, seconds=5)
    wait_for(lambda: c.ticked(s0), what="the first slot's task")
    c.start_slot(s1, seconds=0.5)
    wait_for(lambda: buffer.get(f"cron-runner:{{default:{TASK}}}:buffer") == str(s1),
             what="the second slot to wait")  # fmt: skip
    c.start_slot(s2, seconds=0.5)
    wait_for(lambda: buffer.get(f"cron-runner:{{default:{TASK}}}:buffer") == str(s2),
             what="the third slot to take the buffer")  # fmt: skip
    assert not c.ticked(s1)
    results = c.finish()
    c.start_slot(s3, seconds=0.2)  # after the others: nothing holds the lease
    results |= c.finish()

    assert ran_per_slot(results) == {s0: 1, s1: 0, s2: 1, s3: 1}, results
    first, third = c.by_slot(s0), c.by_slot(s2)
    # The waiting slot ran right after the holder: no overlap, and within a poll or so.
    gap_s = min(t.t for t in third) - max(t.t for t in first)
    assert 0 < gap_s < 1.0, gap_s
    assert max(t.fence for t in first) < min(t.fence for t in third)
    assert {got for label, got in results.items() if label.endswith(f"-{s1}")} == {
        ("skipped_held", 0)
    }
    skipped = [r for r in history(redis_server) if r["outcome"] == "skipped_held"]
    assert [(r["slot"], r["error"]) for r in skipped] == [
        (s1, f"superseded: a run of the later slot {s2} waits or ran")
    ]


def test_allow_other_slots_runs_consecutive_slots_side_by_side_each_once(
    clusters: Any, redis_server: RedisServer
) -> None:
    c = clusters("allow-other-slots")
    s0, s1 = recent_slots(2)
    c.start_slot(s0, seconds=8.0)
    wait_for(lambda: c.ticked(s0), what="the first slot's task")
    c.start_slot(s1, seconds=6.0)
    wait_for(lambda: c.ticked(s1), what="the second slot's task")
    # A lease per slot, and the task's own lease shows one of the runs: status sees it running
    # (the one shown ends first: the other shows itself at its next renewal, TTL/3).
    status = run(["status", TASK, "--output", "json"], runner_env(redis_server.url))
    (shown,) = json.loads(status.stdout)["tasks"]
    assert shown["lease"]["holder"] in {f"{cl}/pod-{s // 60}" for cl in CLUSTERS for s in (s0, s1)}
    results = c.finish()

    assert ran_per_slot(results) == {s0: 1, s1: 1}, results
    first, second = c.by_slot(s0), c.by_slot(s1)
    overlap_s = max(t.t for t in first) - min(t.t for t in second)
    assert overlap_s > 1.0, overlap_s  # both ran at once
    assert min(t.fence for t in first) < min(t.fence for t in second)
    assert sorted(r["slot"] for r in history(redis_server) if r["outcome"] == "ran") == [s0, s1]


def test_replace_stops_the_old_slot_before_the_new_one_starts(
    clusters: Any, redis_server: RedisServer, figure: Figure
) -> None:
    c = clusters("replace")
    s0, s1 = recent_slots(2)
    old = c.start("eu", s0, seconds=60)
    wait_for(lambda: c.ticked(s0), what="the old slot's task")
    asked_at = time.time()
    c.start_slot(s1, seconds=0.5)
    results = c.finish()

    assert results[f"eu-{s0}"] == ("replaced", 79), c.stderr(f"eu-{s0}")
    assert ran_per_slot(results) == {s0: 1, s1: 1}, results
    before, after = c.by_slot(s0), c.by_slot(s1)
    stopped_at = max(t.t for t in before)
    assert stopped_at < min(t.t for t in after)  # no overlap
    assert max(t.fence for t in before) < min(t.fence for t in after)
    outcomes = [(r["slot"], r["outcome"]) for r in history(redis_server)]
    assert outcomes == [(s0, "replaced"), (s1, "ran")]
    stderr = c.stderr(f"eu-{s0}")
    handover_s = round(stopped_at - asked_at, 2)
    figure("replace", handover_s=handover_s,
           new_task_started_after_s=round(min(t.t for t in after) - asked_at, 2),
           preempted_seen_after_s=round(event_time(stderr, "preempted") - asked_at, 2),
           renew_interval_s=1.0, ttl_s=TTL_S)  # fmt: skip
    # The newcomer's start (a process: about a second on this loaded 2-core machine), the
    # holder's next renewal (within a second under replace), then SIGTERM stops the ticker.
    assert handover_s < 4.0
    assert old.returncode == 79


def test_skip_records_the_skipped_slot_once_in_history(
    clusters: Any, redis_server: RedisServer
) -> None:
    c = clusters("skip")
    s0, s1 = recent_slots(2)
    c.start("eu", s0, seconds=8.0)
    wait_for(lambda: c.ticked(s0), what="the first slot's task")
    c.start_slot(s1, seconds=0.2)
    results = c.finish()

    assert ran_per_slot(results) == {s0: 1, s1: 0}, results
    assert {got for label, got in results.items() if label.endswith(f"-{s1}")} == {
        ("skipped_held", 0)
    }
    runs = history(redis_server)
    assert [(r["slot"], r["outcome"]) for r in runs] == [(s1, "skipped_held"), (s0, "ran")]
    assert runs[0]["error"] == f"held by eu/pod-{s0 // 60} for the slot {s0}"
    assert runs[0]["holder"] in {f"{cl}/pod-{s1 // 60}" for cl in CLUSTERS}


# -- the holder frozen past its TTL -----------------------------------------------------------------


@pytest.mark.parametrize("overlap", ["buffer-one", "replace"])
def test_a_frozen_holder_is_left_to_its_ttl_then_the_waiting_slot_runs(
    clusters: Any, redis_server: RedisServer, overlap: str
) -> None:
    c = clusters(overlap)
    s0, s1 = recent_slots(2)
    with c.frozen_holder(s0) as frozen_at:
        c.start_slot(s1, seconds=0.3)
        wait_for(lambda: c.ticked(s1), 30, "the waiting slot to run")
    results = c.finish()

    before, after = c.by_slot(s0), c.by_slot(s1)
    # The supervisor killed the frozen holder's command at its local expiry, before the lease
    # could expire in Redis: never two tasks at once.
    assert max(t.t for t in before) < min(t.t for t in after)
    assert min(t.t for t in after) - frozen_at > TTL_S - 1.5
    assert max(t.fence for t in before) < min(t.fence for t in after)
    assert results[f"eu-{s0}"][1] == 75  # it lost its lease
    assert ran_per_slot(results)[s1] == 1, results


@pytest.mark.parametrize("overlap", ["skip", "allow-other-slots"])
def test_a_frozen_holder_under_skip_or_allow_other_slots(
    clusters: Any, redis_server: RedisServer, overlap: str
) -> None:
    c = clusters(overlap)
    s0, s1 = recent_slots(2)
    with c.frozen_holder(s0):
        c.start_slot(s1, seconds=0.3)
        for cluster in CLUSTERS:
            c.runs[f"{cluster}-{s1}"].finish(30)
    results = c.finish()

    if overlap == "skip":
        assert ran_per_slot(results)[s1] == 0, results
        assert [r["slot"] for r in history(redis_server) if r["outcome"] == "skipped_held"] == [s1]
    else:
        assert ran_per_slot(results)[s1] == 1, results
        assert c.by_slot(s1)


# -- Redis restarted while a slot waits ---------------------------------------------------------


@pytest.mark.parametrize("overlap", ["buffer-one", "replace"])
def test_redis_restarted_while_a_slot_waits(clusters: Any, tmp_path: Path, overlap: str) -> None:
    with RedisServer(appendonly=True) as server:
        c = clusters(overlap, server, CRON_RUNNER_CONNECT_TIMEOUT="10s")
        s0, s1 = recent_slots(2)
        c.start("eu", s0, seconds=2.5 if overlap == "buffer-one" else 60)
        wait_for(lambda: c.ticked(s0), what="the holder's task")
        waiters = [c.start(cluster, s1, seconds=0.3) for cluster in CLUSTERS[1:]]
        wait_for(lambda: all(w.logged("waiting") for w in waiters), what="the slot to wait")
        server.stop(kill=True)
        time.sleep(0.5)
        server.start()
        results = c.finish()

        assert ran_per_slot(results) == {s0: 1, s1: 1}, results
        before, after = c.by_slot(s0), c.by_slot(s1)
        assert max(t.t for t in before) < min(t.t for t in after)
        assert max(t.fence for t in before) < min(t.fence for t in after)
        expected = "ran" if overlap == "buffer-one" else "replaced"
        assert results[f"eu-{s0}"][0] == expected, c.stderr(f"eu-{s0}")


# -- round trips per run and per skip, under each policy -----------------------------------------


@pytest.mark.parametrize("overlap", ["skip", "buffer-one", "replace", "allow-other-slots"])
def test_round_trips_per_run_and_per_skip_under_each_policy(
    redis_server: RedisServer, overlap: str, figure: Figure
) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_OVERLAP=overlap)
    s0, s1 = recent_slots(2)

    def pod(slot: int, *command: str) -> list[str]:
        del slot
        return exec_args(TASK, "pod", list(command))

    def at(slot: int) -> dict[str, str]:
        return cronjob_env(redis_server.url, TASK, "* * * * *", slot,
                           CRON_RUNNER_OVERLAP=overlap)  # fmt: skip

    # Caches the scripts and indexes the task: a task's first run only.
    assert run(exec_args("warm", "pod", ["true"]), env).returncode == 0
    assert run(pod(s0, "true"), at(s0 - 60)).returncode == 0
    with client_commands(redis_server) as seen:
        ran = run(pod(s0, "true"), at(s0))
        after_run = seen()
        done = run(pod(s0, "true"), at(s0))
        after_done = seen()
    assert (outcome(ran.stderr), outcome(done.stderr)) == ("ran", "skipped_done")
    assert len(after_run) == 2, after_run
    assert len(after_done) - len(after_run) == 1, after_done
    assert all('"EVALSHA"' in line for line in after_done)
    figure(f"round trips ({overlap})", run=len(after_run), skip_done=1)
    # An earlier slot still running (its lease, as its runner left it).
    holder_key = f"cron-runner:{{default:{TASK}}}:lease"
    if overlap == "allow-other-slots":
        holder_key += f":{s0}"
    redis_server.client().set(holder_key, f"eu/pod:1.2/{s0}", px=60_000)
    if overlap in ("skip", "allow-other-slots"):
        with client_commands(redis_server) as seen:
            beside = run(pod(s1, "true"), at(s1))
            commands = seen()
        want = ("skipped_held", 1) if overlap == "skip" else ("ran", 2)
        assert (outcome(beside.stderr), len(commands)) == want, commands
        figure(f"round trips ({overlap})", beside_an_earlier_slot=len(commands))
        return
    # A slot held by an earlier one under buffer-one and replace: one look per poll while it
    # waits; the last one records the skip.
    with client_commands(redis_server) as seen:
        waited = run(pod(s1, "true"), {**at(s1), "CRON_RUNNER_OVERLAP_WAIT": "1s",
                                        "CRON_RUNNER_LEASE_TTL": "6s"})  # fmt: skip
        looks = seen()
    assert outcome(waited.stderr) == "skipped_held", waited.stderr
    assert all('"EVALSHA"' in line for line in looks)
    assert 3 <= len(looks) <= 4, looks  # the first, a look every 0.5 s (TTL/12), the last
    figure(f"round trips ({overlap})", waiting_1s_poll_0_5s=len(looks))
