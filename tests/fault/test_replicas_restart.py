"""Fault matrix row 8 (seed 002, section 9): 50 replicas of one scheduled task start while
Redis is killed and restarted (AOF everysec, as the chart's bundled Redis). At most one
successful run, never two runs at once; every replica ends with a documented exit code; none
hangs; none prints a traceback."""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path

from runner.testing import RedisServer
from tests.fault.common import DOCUMENTED_EXIT_CODES, assert_clean, event_time
from tests.fault.conftest import Figure
from tests.helpers.proc import outcome, runner_env, spawn
from tests.helpers.wait import schedule_far_from_edges

REPLICAS = 50


def test_row8_50_replicas_while_redis_restarts_run_once_and_all_exit_documented(
    tmp_path: Path, figure: Figure
) -> None:
    effects = tmp_path / "effects"
    command = ["sh", "-c",
               f'echo "start $CRON_RUNNER_HOLDER $(date +%s.%N)" >> {effects}; sleep 2; '
               f'echo "end $CRON_RUNNER_HOLDER $(date +%s.%N)" >> {effects}']  # fmt: skip
    procs: list[subprocess.Popen[str]] = []
    schedule = schedule_far_from_edges(300)  # every replica computes the same slot
    with RedisServer(appendonly=True) as server:
        # The TTL outlasts the outage plus a renew interval: the holder keeps its lease. (If
        # it did not, it would stop its task and another replica would run the slot, never
        # at the same time, and only one would succeed: the assertions below allow that.)
        env = runner_env(server.url, CRON_RUNNER_SCHEDULE=schedule,
                         CRON_RUNNER_LEASE_TTL="5s", CRON_RUNNER_CONNECT_TIMEOUT="5s")  # fmt: skip
        for i in range(REPLICAS):
            if i == REPLICAS // 2:
                server.stop(kill=True)
                down_at = time.monotonic()
                time.sleep(0.5)  # replicas keep starting into the outage
            if i == REPLICAS // 2 + 5:
                server.start()
                down_ms = round((time.monotonic() - down_at) * 1000)
            procs.append(spawn(["exec", "--name", "report", "--holder", f"replica-{i}", "--",
                                *command], env))  # fmt: skip
            time.sleep(0.04)
        results = [(p.wait(timeout=90), p.communicate(timeout=10)[1]) for p in procs]
    for _, stderr in results:
        assert_clean(stderr)
    codes = [code for code, _ in results]
    assert set(codes) <= DOCUMENTED_EXIT_CODES, codes
    outcomes = [outcome(stderr) or f"exit {code}" for code, stderr in results]
    assert outcomes.count("ran") == 1, outcomes
    # Each run that started its task: from its start to its end, or to its runner's finish.
    runs = []
    for line in effects.read_text().splitlines():
        kind, holder, t = line.split()
        if kind == "start":
            i = int(holder.removeprefix("replica-"))
            runs.append((float(t), event_time(results[i][1], "finished"), outcomes[i]))
    runs.sort()
    overlaps = [b[0] - a[1] for a, b in itertools.pairwise(runs) if b[0] < a[1]]
    assert overlaps == [], runs
    assert [o for _, _, o in runs].count("ran") == 1
    counts = {o: outcomes.count(o) for o in sorted(set(outcomes))}
    figure("8", duplicates=len(runs) - 1, overlap_ms=0, replicas=REPLICAS,
           redis_down_ms=down_ms, outcomes=counts,
           exit_codes={c: codes.count(c) for c in sorted(set(codes))})  # fmt: skip
