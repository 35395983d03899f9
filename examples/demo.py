"""`make demo`: the seed article's three-terminal test, with five replicas and real signals.

Starts a throwaway Redis, then shows, with the installed `cron-runner`:
1. five replicas of one job started together: exactly one runs it, four skip;
2. a second wave in the same slot: all skip, the slot is done;
3. SIGTERM in the middle of a run: the task stops, the lease is released, exit 143;
4. kill -9 of the holder: the retry of its slot waits, and takes over once the lease's TTL has passed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import IO

from runner.testing import RedisServer

CRON_RUNNER = str(Path(sys.executable).parent / "cron-runner")
SCHEDULE = "*/5 * * * *"
TTL = "3s"
BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")

rows: list[tuple[str, str, str]] = []
logs: dict[int, IO[str]] = {}


def say(text: str) -> None:
    print(f"\n{BOLD}{text}{RESET}", flush=True)


def env_for(redis_url: str, holder: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRON_RUNNER_")}
    env.update(
        CRON_RUNNER_REDIS_URL=redis_url,
        CRON_RUNNER_HOLDER=holder,
        CRON_RUNNER_LEASE_TTL=TTL,
        CRON_RUNNER_SHUTDOWN_GRACE="2s",
        CRON_RUNNER_LOG_FORMAT="json",
    )
    return env


def start(
    redis_url: str, holder: str, name: str, command: str, **extra_env: str
) -> subprocess.Popen[str]:
    # Logs go to a file, not a pipe: a killed runner's orphaned child would hold a pipe open.
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in show()
    proc = subprocess.Popen(
        [CRON_RUNNER, "exec", "--name", name, "--schedule", SCHEDULE, "--", "sh", "-c", command],
        env={**env_for(redis_url, holder), **extra_env},
        stderr=log,
        text=True,
    )
    logs[proc.pid] = log
    return proc


def show(holder: str, proc: subprocess.Popen[str]) -> str:
    """Print a replica's log lines readably; return its outcome."""
    proc.wait(timeout=60)
    log = logs.pop(proc.pid)
    log.seek(0)
    result = "?"
    for line in log.read().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            print(f"  {holder:<10} {line}")
            continue
        # Every run line has every run field, null until known.
        if event.get("outcome") is not None:
            result = event["outcome"]
        detail = " ".join(
            f"{k}={event[k]}"
            for k in ("run_holder", "fence", "finished_at", "reason")
            if event.get(k) is not None
        )
        print(f"  {holder:<10} {event.get('msg', '')}  {DIM}{detail}{RESET}")
    log.close()
    print(f"  {holder:<10} {DIM}exit code {proc.returncode}{RESET}")
    return f"{result} (exit {proc.returncode})"


def count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def main() -> int:
    started = time.monotonic()
    with TemporaryDirectory() as tmp, RedisServer() as redis_server:
        url = redis_server.url
        effects = Path(tmp) / "invoices.log"
        work = f'echo "invoice batch sent by $CRON_RUNNER_HOLDER" >> {effects}; sleep 1'
        print(f"Embedded Redis on {url}; job 'invoices' on schedule '{SCHEDULE}', lease TTL {TTL}.")

        say("1. Five replicas fire the same schedule at the same moment")
        procs = {f"replica-{i}": start(url, f"replica-{i}", "invoices", work) for i in range(1, 6)}
        wave1 = [show(h, p) for h, p in procs.items()]
        rows.append(
            ("5 replicas, same slot", f"{count(effects)} run", ", ".join(sorted(set(wave1))))
        )

        say("2. A second wave in the same slot: the slot is already done")
        procs = {f"late-{i}": start(url, f"late-{i}", "invoices", work) for i in range(1, 4)}
        wave2 = [show(h, p) for h, p in procs.items()]
        rows.append(
            (
                "3 late replicas, same slot",
                f"{count(effects)} run in total",
                ", ".join(sorted(set(wave2))),
            )
        )

        say("3. SIGTERM in the middle of a run (a pod being evicted)")
        proc = start(url, "evicted", "reports", "echo working; sleep 30")
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        term = show("evicted", proc)
        lease_left = redis_server.client().exists("cron-runner:{default:reports}:lease")
        rows.append(("SIGTERM mid-run", "lease released" if not lease_left else "LEASE LEFT", term))

        say(
            "4. kill -9 of the whole holder (a node dies): its retry waits for the lease to "
            "expire, then takes the slot over"
        )
        pidfile = Path(tmp) / "backup.pid"
        # One task, one command (a different one would be refused): how long it works is in
        # the environment.
        backup = f"echo $$ > {pidfile}; echo backing up; sleep $BACKUP_SECONDS"
        holder = start(url, "doomed", "backup", backup, BACKUP_SECONDS="30")
        while not (pidfile.exists() and pidfile.read_text().strip()):
            time.sleep(0.05)
        holder.send_signal(signal.SIGKILL)
        os.killpg(int(pidfile.read_text()), signal.SIGKILL)  # the command's own process group
        killed_at = time.monotonic()
        show("doomed", holder)
        first_retry = ""
        while True:
            nxt = start(url, "successor", "backup", backup, BACKUP_SECONDS="0")
            result = show("successor", nxt)
            first_retry = first_retry or result
            if result.startswith("ran") or time.monotonic() - killed_at > 15:
                break
            time.sleep(0.5)
        took_over_s = time.monotonic() - killed_at
        rows.append(
            (
                "kill -9 of the holder",
                f"first retry: {first_retry}",
                f"taken over after {took_over_s:.1f}s (TTL {TTL})",
            )
        )

        say("Summary")
        width = max(len(r[0]) for r in rows)
        for what, seen, outcome in rows:
            print(f"  {what:<{width}}  {seen:<28}  {outcome}")
        print(
            f"\nInvoice side effects: {count(effects)} (expected 1). Finished in {time.monotonic() - started:.0f}s."
        )
        return 0 if count(effects) == 1 and not lease_left else 1


if __name__ == "__main__":
    raise SystemExit(main())
