"""Cold start: a whole ``cron-runner exec --name x -- true`` against ``python -c "import redis"``.

A CronJob pod starts the runner cold every time, so start-up is on the hot path. Each
run is a fresh process; the commands alternate, after one untimed warm-up of each (so
the page cache is warm for all alike), and the medians are compared. The runner talks
to a real Redis: a throwaway one, or ``--redis-url``.

First the ``runner`` and ``redis`` packages are byte-compiled (``compileall``), as a wheel
install or the image has them: with PYTHONDONTWRITEBYTECODE set (or a tree edited since
its last run) every start would otherwise compile our modules again, some 70 ms that no
user pays.

Run: ``.venv/bin/python bench/cold_start.py`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from alternating import in_turns, timed_run

from runner.testing import RedisServer

NOT_READY = 2


class NotReady(RuntimeError):
    """The CLI answers --help but cannot run a command yet."""


def cron_runner_binary() -> str | None:
    beside = Path(sys.executable).parent / "cron-runner"
    if beside.exists():
        return str(beside)
    return shutil.which("cron-runner")


def ready(binary: str | None) -> bool:
    if binary is None:
        return False
    done = subprocess.run([binary, "exec", "--help"], capture_output=True, check=False)
    return done.returncode == 0


def wait_until_ready(wait_s: float) -> str | None:
    deadline = time.monotonic() + wait_s
    while True:
        binary = cron_runner_binary()
        if ready(binary):
            return binary
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))


def byte_compile(packages: tuple[str, ...] = ("runner", "redis")) -> list[str]:
    """Write the .pyc files of ``packages`` (as this interpreter finds them) where they are
    missing or stale, as installing a wheel does; returns the directories."""
    compiled = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        for directory in (spec.submodule_search_locations or []) if spec else []:
            if not compileall.compile_dir(directory, quiet=1):
                raise RuntimeError(f"cannot byte-compile {directory}")
            compiled.append(directory)
    return compiled


def import_times(binary: str, env: dict[str, str], top: int) -> Iterator[str]:
    """The slowest imports of one runner start, cumulative, from ``-X importtime``."""
    command = [sys.executable, "-X", "importtime", binary, "exec", "--name", "x", "--", "true"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    rows: list[tuple[int, str]] = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        rows.append((int(cumulative), name.rstrip()))
    for cumulative_us, name in sorted(rows, reverse=True)[:top]:
        yield f"{cumulative_us / 1000:8.1f} ms  {name}"


def measure(binary: str, url: str, runs: int) -> dict[str, list[float]]:
    env = {**os.environ, "CRON_RUNNER_REDIS_URL": url}
    commands = {
        "cron-runner exec --name x -- true": [binary, "exec", "--name", "x", "--", "true"],
        'python -c "import redis"': [sys.executable, "-c", "import redis"],
        'python -c "pass"': [sys.executable, "-c", "pass"],
    }
    for label, command in commands.items():
        try:
            timed_run(command, env)
        except RuntimeError as exc:
            raise NotReady(f"the untimed first run of `{label}` failed: {exc}") from exc
    return in_turns(list(commands), runs, lambda label: timed_run(commands[label], env))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=15, help="timed runs of each command (>= 10)")
    parser.add_argument("--redis-url", help="a Redis to use instead of a throwaway one")
    parser.add_argument(
        "--wait", type=float, default=0.0, metavar="S", help="poll up to S seconds for the CLI"
    )
    parser.add_argument(
        "--importtime", type=int, default=0, metavar="N", help="show N slowest imports"
    )
    args = parser.parse_args(argv)
    if args.runs < 10:
        parser.error("--runs must be at least 10: a median of fewer says little")

    binary = wait_until_ready(args.wait)
    if binary is None:
        print(
            "cron-runner is not ready: `cron-runner exec --help` does not exit 0 "
            f"(looked beside {sys.executable} and on PATH)",
            file=sys.stderr,
        )
        return NOT_READY

    compiled = byte_compile()
    with RedisServer() as server:
        url = args.redis_url or server.url
        try:
            times_s = measure(binary, url, args.runs)
        except NotReady as exc:
            print(f"cron-runner is not ready: {exc}", file=sys.stderr)
            return NOT_READY
        importtime_lines = list(
            import_times(binary, {**os.environ, "CRON_RUNNER_REDIS_URL": url}, args.importtime)
        )

    print(f"# {args.runs} runs each, alternating; load average (1 min) {os.getloadavg()[0]:.2f}")
    print(f"# byte-compiled first: {', '.join(compiled)}\n")
    print("| command | median ms | min-max ms |")
    print("|---|---:|---:|")
    for label, samples in times_s.items():
        print(
            f"| `{label}` | {statistics.median(samples) * 1000:.1f} "
            f"| {min(samples) * 1000:.1f}-{max(samples) * 1000:.1f} |"
        )
    runner_ms, import_redis_ms = (statistics.median(s) * 1000 for s in list(times_s.values())[:2])
    print(
        f"\nratio: cron-runner exec / python -c 'import redis' = {runner_ms / import_redis_ms:.2f}x"
    )
    if importtime_lines:
        print(f"\n# {len(importtime_lines)} slowest imports of one runner start (cumulative)")
        for line in importtime_lines:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
