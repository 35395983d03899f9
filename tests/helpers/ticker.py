"""A task's side effects, for fault tests: one line per tick, and optionally a fenced write.

Usage: ticker.py TICKS_FILE LABEL [--interval S] [--seconds S] [--sink DB] [--ignore-term]

Each tick appends ``LABEL FENCE WALL_TIME OUTCOME`` to TICKS_FILE, where FENCE is
``$CRON_RUNNER_FENCING_TOKEN``. With ``--sink``, each tick first writes to a SQLite
database guarded by the fencing token, the way a task should guard its real writes:

    UPDATE guard SET fence = :fence WHERE id = 1 AND fence <= :fence

OUTCOME is ``accepted`` or ``rejected`` (a newer holder has written), or ``tick`` without a
sink. Runs for ``--seconds`` (forever when 0), then exits 0. With ``--ignore-term`` it
ignores SIGTERM, as a task that does not clean up would: only SIGKILL stops it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Tick:
    label: str
    fence: int
    t: float  # wall time (time.time()): every process on the machine shares it
    outcome: str


def read_ticks(path: Path, label: str | None = None) -> list[Tick]:
    if not path.exists():
        return []
    ticks = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4 and (label is None or parts[0] == label):
            ticks.append(Tick(parts[0], int(parts[1]), float(parts[2]), parts[3]))
    return ticks


def ticker_command(
    ticks: Path,
    label: str,
    *,
    interval_s: float = 0.02,
    seconds: float = 0.0,
    sink: Path | None = None,
    ignore_term: bool = False,
) -> list[str]:
    """The argv of a command task that ticks into ``ticks`` (the child of ``cron-runner exec``)."""
    argv = [sys.executable, __file__, str(ticks), label, "--interval", str(interval_s),
            "--seconds", str(seconds)]  # fmt: skip
    if sink:
        argv += ["--sink", str(sink)]
    return [*argv, "--ignore-term"] if ignore_term else argv


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def supervisor_of(runner_pid: int) -> int:
    """The pid of the supervisor ``cron-runner exec`` forks beside its command."""
    from runner.run.supervisor import NAME  # noqa: PLC0415 - the helper also runs as a script

    (pid,) = [c for c in children(runner_pid) if _comm(c) == NAME.decode()]
    return pid


def command_of(runner_pid: int) -> int:
    """The pid of the command ``cron-runner exec`` runs: its child that is not the supervisor."""
    from runner.run.supervisor import NAME  # noqa: PLC0415

    (pid,) = [c for c in children(runner_pid) if _comm(c) != NAME.decode()]
    return pid


def fenced_write(db: sqlite3.Connection, label: str, fence: int, t: float) -> bool:
    """One transaction: accepted only if no write with a higher fence came before."""
    with db:
        db.execute("BEGIN IMMEDIATE")
        accepted = (
            db.execute(
                "UPDATE guard SET fence = ? WHERE id = 1 AND fence <= ?", (fence, fence)
            ).rowcount
            == 1
        )
        if accepted:
            db.execute("INSERT INTO writes VALUES (?, ?, ?)", (label, fence, t))
    return accepted


def open_sink(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    with db:
        db.execute("BEGIN IMMEDIATE")
        db.execute("CREATE TABLE IF NOT EXISTS guard (id INTEGER PRIMARY KEY, fence INTEGER)")
        db.execute("CREATE TABLE IF NOT EXISTS writes (label TEXT, fence INTEGER, t REAL)")
        db.execute("INSERT OR IGNORE INTO guard VALUES (1, 0)")
    return db


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("ticks")
    parser.add_argument("label")
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--sink")
    parser.add_argument("--ignore-term", action="store_true")
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fence = int(os.environ.get("CRON_RUNNER_FENCING_TOKEN", "0"))
    db = open_sink(args.sink) if args.sink else None
    end = time.monotonic() + args.seconds if args.seconds else None
    with open(args.ticks, "a", buffering=1) as ticks:
        while end is None or time.monotonic() < end:
            t = time.time()
            outcome = "tick"
            if db is not None:
                outcome = "accepted" if fenced_write(db, args.label, fence, t) else "rejected"
            ticks.write(f"{args.label} {fence} {t:.6f} {outcome}\n")
            time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
