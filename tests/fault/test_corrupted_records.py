"""Every value read from Redis is untrusted input: each key the runner reads, written with a
wrong type or a value no runner writes, on a real Redis. ``status``, ``watchdog``, ``serve``,
``history``, ``exec`` and ``run`` each answer without a traceback, and only the damaged task is
affected: the other task of the scope is listed, judged, shown and runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from runner.schedule.slots import Schedule
from runner.testing import RedisServer
from tests.helpers.proc import run, runner_env
from tests.serve.conftest import serving

DAMAGED, OTHER = "ok", "good"  # "ok" is a registered task, so `run` reaches it too
BASE = "cron-runner:{default:%s}"
SCHEDULE = "*/5 * * * *"
CODES = (0, 1, 69, 78)  # 1: the watchdog's "something to report"


def _key(suffix: str) -> str:
    return f"{BASE % DAMAGED}:{suffix}"


def _ledger_slot() -> int:
    return Schedule.parse(SCHEDULE, "UTC", 0).previous_at_or_before(time.time() - 3600)


def _damage(case: str) -> list[list[Any]]:
    slot = _ledger_slot()
    return {
        "state_wrong_type": [["DEL", _key("state")], ["SET", _key("state"), "x"]],
        "state_wrong_values": [["HSET", _key("state"), "last_run_at", "x", "last_success_at",
                                "nan", "last_success_slot", "x", "last_slot", "1e999",
                                "schedule", "61 * * * *", "max_runtime_ms", "x",
                                "ledger_until", "inf", "expected_since", "x"]],
        "runs_wrong_type": [["DEL", _key("runs")], ["SET", _key("runs"), "x"]],
        "runs_wrong_values": [["XADD", _key("runs"), "*", "started_at", "x", "slot", "x",
                               "fence", "x", "exit_code", "x", "duration_ms", "x"]],
        "ledger_wrong_type": [["DEL", _key("missed")], ["SET", _key("missed"), "x"]],
        "ledger_wrong_members": [["ZADD", _key("missed"), "1", "abc", "2", "1e999", "3", "-5"]],
        "meta_wrong_type": [["DEL", _key("meta")], ["SET", _key("meta"), "x"]],
        "pause_wrong_values": [["HSET", _key("meta"), "paused", "1", "paused_at", "x",
                                "paused_until", "x", "paused_by", "\x00"]],
        "protocol_wrong_value": [["HSET", _key("meta"), "protocol", "abc"]],
        "protocol_min_wrong_value": [["HSET", _key("meta"), "protocol_min", "abc"]],
        "fence_wrong_value": [["SET", _key("fence"), "abc"]],
        "fence_wrong_type": [["DEL", _key("fence")], ["HSET", _key("fence"), "a", "1"]],
        "lease_wrong_type": [["DEL", _key("lease")], ["HSET", _key("lease"), "a", "1"]],
        "marker_wrong_type": [["SET", _key(f"slot:{slot}"), "x"]],
        "index_wrong_type": [["DEL", "cron-runner:{default:}:tasks"],
                             ["SET", "cron-runner:{default:}:tasks", "x"]],
    }[case]  # fmt: skip


CASES = [
    "state_wrong_type", "state_wrong_values", "runs_wrong_type", "runs_wrong_values",
    "ledger_wrong_type", "ledger_wrong_members", "meta_wrong_type", "pause_wrong_values",
    "protocol_wrong_value", "protocol_min_wrong_value", "fence_wrong_value", "fence_wrong_type",
    "lease_wrong_type", "marker_wrong_type", "index_wrong_type",
]  # fmt: skip


def _clean(res: Any, what: str, codes: tuple[int, ...] = CODES) -> None:
    assert "Traceback" not in res.stderr, f"{what}: {res.stderr}"
    assert res.returncode in codes, f"{what}: exit {res.returncode}: {res.stderr}"


@pytest.mark.parametrize("case", CASES)
def test_a_damaged_record_affects_its_own_task_alone_with_no_traceback(
    redis_server: RedisServer, tmp_path: Path, case: str
) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE=SCHEDULE)
    plain = runner_env(redis_server.url)
    for task in (DAMAGED, OTHER):
        assert run(["exec", "--name", task, "--", "true"], env).returncode == 0
    client = redis_server.client()
    slot = _ledger_slot()
    for task in (DAMAGED, OTHER):  # a slot a watchdog found missed, for each
        client.zadd(f"{BASE % task}:missed", {str(slot): slot})
    for command in _damage(case):
        client.execute_command(*command)

    status = run(["status"], plain)
    _clean(status, "status", (0,))
    assert OTHER in status.stdout, status.stdout
    watchdog = run(["watchdog"], plain)
    _clean(watchdog, "watchdog", (1,))  # the other task's missed slot is reported
    assert f"overdue: {OTHER}" in watchdog.stderr or f'"task": "{OTHER}"' in watchdog.stderr
    _clean(run(["history", OTHER], plain), "history", (0,))
    _clean(run(["history", DAMAGED], plain), "history of the damaged task")
    _clean(run(["run", DAMAGED], env), "run of the damaged task", (0, 69, 78))
    _clean(run(["exec", "--name", DAMAGED, "--", "true"], plain), "exec of the damaged task")
    mark = tmp_path / "mark"
    other = run(["exec", "--name", OTHER, "--", "sh", "-c", f"echo ran >> {mark}"], plain)
    _clean(other, "exec of the other task", (0,))
    assert mark.read_text() == "ran\n"

    with serving(plain, tmp_path / "serve.log") as served:
        code, metrics = served.get("/metrics")
        assert code == 200 and f'task="{OTHER}"' in metrics and "cron_runner_up 1" in metrics
        code, page = served.get("/")
        assert code == 200 and OTHER in page
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


CORRUPTED_LEASE_INPUTS = {
    "protocol": [["HSET", _key("meta"), "protocol", "abc"]],
    "protocol_min": [["HSET", _key("meta"), "protocol_min", "x1"]],
    "fence_value": [["SET", _key("fence"), "abc"]],
    "fence_type": [["HSET", _key("fence"), "a", "1"]],
}


@pytest.mark.parametrize("case", list(CORRUPTED_LEASE_INPUTS))
def test_a_corrupted_version_or_fence_exits_78_not_69_and_the_command_never_starts(
    redis_server: RedisServer, tmp_path: Path, case: str
) -> None:
    """Not a Redis that is away: no retry mends it. The lease taken for the acquire is given
    back, and the error names the key."""
    client = redis_server.client()
    for command in CORRUPTED_LEASE_INPUTS[case]:
        client.execute_command(*command)
    mark = tmp_path / "mark"
    res = run(["exec", "--name", DAMAGED, "--", "sh", "-c", f"echo ran >> {mark}"],
              runner_env(redis_server.url))  # fmt: skip
    assert res.returncode == 78, res.stderr
    assert "Traceback" not in res.stderr
    assert not mark.exists()
    assert (
        "corrupted record" in res.stderr
        and _key("meta" if "protocol" in case else "fence") in res.stderr
    )
    assert client.get(_key("lease")) is None
