"""What the fault tests share: starting a second holder until it takes over, reading the
runner's log lines and the tasks' ticks, and the checks every row makes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from tests.helpers.proc import events, outcome, run, spawn
from tests.helpers.ticker import Tick, read_ticks
from tests.helpers.wait import wait_for

DOCUMENTED_EXIT_CODES = {0, 1, 64, 69, 75, 78, 143}


def event_time(stderr: str, name: str) -> float:
    """Wall time of the runner's first ``name`` event (its JSON ``ts``, millisecond precision)."""
    for e in events(stderr):
        if e.get("event") == name:
            return (
                datetime.strptime(e["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
            )
    raise AssertionError(f"no {name!r} event in:\n{stderr}")


def event(stderr: str, name: str) -> dict[str, Any]:
    found = [e for e in events(stderr) if e.get("event") == name]
    assert found, f"no {name!r} event in:\n{stderr}"
    return found[0]


def assert_clean(stderr: str) -> None:
    """A documented outcome, never a crash."""
    assert "Traceback" not in stderr, stderr


def finished(*procs: subprocess.Popen[str]) -> list[str]:
    """Wait for each run to end; their stderr, each a documented outcome, never a crash."""
    errs = [proc.communicate(timeout=30)[1] for proc in procs]
    for err in errs:
        assert_clean(err)
    return errs


def run_until_ran(
    args: list[str], env: dict[str, str], *, timeout_s: float = 30
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Start the same run again and again, as a CronJob's retries would, until one runs the
    task. Returns that run and the outcomes of the runs before it."""
    before: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        res = run(args, env)
        assert_clean(res.stderr)
        got = outcome(res.stderr) or f"exit {res.returncode}"
        if got == "ran":
            return res, before
        before.append(got)
        assert time.monotonic() < deadline, f"no run took over within {timeout_s} s: {before}"
        time.sleep(0.05)


def _ticked_or_ended(proc: subprocess.Popen[str], ticks: Path, label: str) -> bool:
    return proc.poll() is not None or bool(read_ticks(ticks, label))


def start_when_free(
    args: list[str], env: dict[str, str], ticks: Path, label: str, *, timeout_s: float = 30
) -> tuple[subprocess.Popen[str], list[str]]:
    """Like ``run_until_ran``, but returns the run that took over while its task is running
    (once it has ticked)."""
    before: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        proc = spawn(args, env)
        wait_for(partial(_ticked_or_ended, proc, ticks, label), timeout_s, f"{label} to tick")
        if read_ticks(ticks, label):
            return proc, before
        _, stderr = proc.communicate()
        assert_clean(stderr)
        before.append(outcome(stderr) or f"exit {proc.returncode}")
        assert time.monotonic() < deadline, f"no run took over within {timeout_s} s: {before}"
        time.sleep(0.05)


def overlap_ms(first: list[Tick], second: list[Tick]) -> float:
    """How long the first holder's task kept ticking after the second's started (> 0: both
    ran at once); negative: the gap between them."""
    return round((max(t.t for t in first) - min(t.t for t in second)) * 1000, 1)


def sink_writes(sink: Path) -> list[tuple[str, int]]:
    """(label, fence) of every write the fenced sink accepted, in commit order."""
    db = sqlite3.connect(sink)
    try:
        return [(str(label), int(fence)) for label, fence in db.execute(
            "SELECT label, fence FROM writes ORDER BY rowid")]  # fmt: skip
    finally:
        db.close()


def stale_writes_accepted(sink: Path, stale: str, newer: str) -> int:
    """Writes by ``stale`` that the sink accepted after its first write by ``newer``."""
    writes = sink_writes(sink)
    labels = [label for label, _ in writes]
    if newer not in labels:
        return 0
    return labels[labels.index(newer) :].count(stale)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _sink_write_locked(sink: Path) -> bool:
    db = sqlite3.connect(sink, timeout=0, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        db.close()


def freeze_outside_a_sink_write(groups: tuple[int, ...], writer: int, sink: Path) -> None:
    """SIGSTOP every group at a moment the writer holds no write lock on the sink.

    A writer frozen inside its transaction would block every later writer for as long as it is
    frozen: that is SQLite's lock, not the fault under test, and under load it made the next
    holder's task fail with 'database is locked'."""
    for _ in range(200):
        for group in groups:
            os.killpg(group, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not _stopped(writer) and time.monotonic() < deadline:
            time.sleep(0.005)
        if _stopped(writer) and not _sink_write_locked(sink):
            return
        for group in reversed(groups):
            os.killpg(group, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError("could not freeze the holder outside a write to its sink")
