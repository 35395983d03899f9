"""Fault matrix row 7: replicas whose wall clocks are wrong, run under libfaketime
(``faketime -m -f '+12.5s' cron-runner ...``, Debian's faketime package), with ``--schedule``
slots. tests/helpers/faketime_sleep works around that libfaketime's broken ``time.sleep``.

The trigger (a CronJob controller, a crontab) fires at its own clock's fire time T; each
replica computes the slot on its own clock, which is off by its skew. The monotonic clock is
left alone (FAKETIME_DONT_FAKE_MONOTONIC): only the wall clock is wrong, as on a real node.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from pathlib import Path

from runner.testing import RedisServer
from tests.fault.common import assert_clean, event
from tests.fault.conftest import Figure
from tests.helpers.proc import CRON_RUNNER, ROOT, outcome, runner_env, side_effects

SCHEDULE = "*/5 * * * *"
GAP_S = 300
TOLERANCE_S = 30
SLEEP_FIX = Path(__file__).resolve().parents[1] / "helpers" / "faketime_sleep"


def _faketime() -> str:
    found = shutil.which("faketime")
    assert found, "faketime is not installed: apt-get install faketime"
    return found


def _spawn_skewed(
    env: dict[str, str],
    fire_time: float,
    skew_s: float,
    name: str,
    *,
    effects: Path,
    hold_s: float,
) -> subprocess.Popen[str]:
    # The replica's clock reads fire_time + skew_s now.
    offset = fire_time + skew_s - time.time()
    # The skew in the environment, not the command: all replicas share one task definition.
    command = f'echo "ran $CRON_RUNNER_SLOT $SKEW" >> {effects}; sleep {hold_s}'
    argv = [_faketime(), "-m", "-f", f"{offset:+.3f}s", CRON_RUNNER,
            "exec", "--name", name, "--holder", f"skew{skew_s:+g}",
            "--schedule", SCHEDULE, "--skew-tolerance", f"{TOLERANCE_S}s",
            "--", "sh", "-c", command]  # fmt: skip
    return subprocess.Popen(
        argv,
        env={
            **env,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": f"{SLEEP_FIX}:{ROOT}",
            "SKEW": f"{skew_s}",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _next_fire_time() -> float:
    return math.ceil(time.time() / GAP_S) * GAP_S


def test_row7a_replicas_skewed_within_the_tolerance_run_the_slot_once(
    redis_server: RedisServer, tmp_path: Path, figure: Figure
) -> None:
    """Skews of -14..+14 s around a fire time: pairwise within the 30 s tolerance. The replica
    whose clock is 14 s behind still reads a time before T; without the tolerance it would
    take the previous slot and run again."""
    effects = tmp_path / "effects"
    env = runner_env(redis_server.url)
    fire_time = _next_fire_time()
    skews = [-14.0, -7.0, 0.0, 7.0, 14.0]
    procs = [
        (s, _spawn_skewed(env, fire_time + 1, s, "skewed", effects=effects, hold_s=0.3))
        for s in skews
    ]
    results = []
    for skew, proc in procs:
        _, stderr = proc.communicate(timeout=60)
        assert_clean(stderr)
        results.append((skew, proc.returncode, outcome(stderr), stderr))
    assert [code for _, code, _, _ in results] == [0] * len(skews), results
    outcomes = sorted(o or "" for _, _, o, _ in results)
    assert outcomes.count("ran") == 1, outcomes
    assert set(outcomes) <= {"ran", "skipped_held", "skipped_done"}
    ran = side_effects(effects)
    assert len(ran) == 1
    assert int(ran[0].split()[1]) == int(fire_time)
    # Every replica computed the same slot, whatever its clock said.
    slots = {event(err, "start")["slot"] for _, _, _, err in results}
    assert slots == {int(fire_time)}, slots
    figure("7a", duplicates=0, overlap_ms=0, skews_s=skews, tolerance_s=TOLERANCE_S,
           outcomes=outcomes, exit_codes=sorted({c for _, c, _, _ in results}))  # fmt: skip


def test_row7b_a_clock_behind_by_more_than_the_tolerance_takes_the_previous_slot(
    redis_server: RedisServer, tmp_path: Path, figure: Figure
) -> None:
    """The documented limit: a replica 40 s behind reads T - 39 s, so its slot is the previous
    fire time; if that slot never ran, it runs it now, next to the on-time replica's T."""
    effects = tmp_path / "effects"
    env = runner_env(redis_server.url)
    fire_time = _next_fire_time()
    runs = []
    for skew in (0.0, -40.0):
        proc = _spawn_skewed(env, fire_time + 1, skew, "too-skewed", effects=effects, hold_s=0)
        _, stderr = proc.communicate(timeout=60)
        assert_clean(stderr)
        runs.append((proc.returncode, outcome(stderr), event(stderr, "start")["slot"]))
    assert runs == [(0, "ran", int(fire_time)), (0, "ran", int(fire_time) - GAP_S)], runs
    assert len(side_effects(effects)) == 2
    figure("7b", duplicates=1, overlap_ms=0, skews_s=[0, -40], tolerance_s=TOLERANCE_S,
           slots=[s for _, _, s in runs], exit_codes=[c for c, _, _ in runs])  # fmt: skip
