"""Start-up cost of a change: ``exec --name x -- true`` from two source trees, before and after.

Each tree is run as ``python -m runner`` with the tree first on ``PYTHONPATH`` (the editable
install's finder comes after it), so both use this venv's packages and differ only in the
runner's own code. ``--before`` is a git revision, extracted with ``git archive`` into a
temporary directory; ``--after`` is a directory (default: this checkout). The runs alternate,
after one untimed warm-up of each, against one throwaway Redis; the medians are compared.
Then the supervisor alone (runner/supervisor.py), which a whole start hides in its noise: its
fork and its stop, timed in this process, which has imported what the runner imports.

Run: ``.venv/bin/python bench/exec_start.py --before main`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import compileall
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from runner.testing import RedisServer

ROOT = Path(__file__).resolve().parents[1]


def extract(revision: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision, "runner"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def timed_run(tree: Path, env: dict[str, str], cwd: str) -> float:
    command = [sys.executable, "-m", "runner", "exec", "--name", "x", "--", "true"]
    started = time.perf_counter()
    done = subprocess.run(
        command, env={**env, "PYTHONPATH": str(tree)}, cwd=cwd, capture_output=True, check=False
    )
    elapsed_s = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{tree}: exited {done.returncode}:\n{done.stderr.decode(errors='replace')}")
    return elapsed_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--before", required=True, help="git revision, e.g. main")
    parser.add_argument("--after", type=Path, default=ROOT, help="source tree (default: here)")
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each (>= 10)")
    args = parser.parse_args(argv)
    if args.runs < 10:
        parser.error("--runs must be at least 10: a median of fewer says little")

    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server:
        trees = {
            f"before ({args.before})": extract(args.before, Path(tmp) / "before"),
            f"after ({args.after})": args.after.resolve(),
        }
        # Both trees byte-compiled, as an install has them: under PYTHONDONTWRITEBYTECODE a stale
        # .pyc would be compiled again at every start, and that, not the change, would be timed.
        for tree in trees.values():
            if not compileall.compile_dir(tree / "runner", quiet=1):
                sys.exit(f"cannot byte-compile {tree / 'runner'}")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CRON_RUNNER_", "OTEL_"))}
        env["CRON_RUNNER_REDIS_URL"] = server.url
        for tree in trees.values():
            timed_run(tree, env, tmp)
        times_s: dict[str, list[float]] = {label: [] for label in trees}
        labels = list(trees)
        for run_no in range(args.runs):
            for label in labels if run_no % 2 == 0 else labels[::-1]:
                times_s[label].append(timed_run(trees[label], env, tmp))

    print(f"# {args.runs} runs each, alternating; load average (1 min) {os.getloadavg()[0]:.2f}\n")
    print("| `exec --name x -- true` | median ms | min-max ms |")
    print("|---|---:|---:|")
    for label, samples in times_s.items():
        print(
            f"| {label} | {statistics.median(samples) * 1000:.1f} "
            f"| {min(samples) * 1000:.1f}-{max(samples) * 1000:.1f} |"
        )
    before_ms, after_ms = (statistics.median(s) * 1000 for s in times_s.values())
    print(f"\nratio after / before = {after_ms / before_ms:.3f}")
    print_supervisor_cost(runs=50)
    return 0


def print_supervisor_cost(runs: int) -> None:
    import runner.cli.main  # noqa: PLC0415 - the runner's modules, for a fork of its size
    import runner.run.execution  # noqa: F401, PLC0415
    from runner.run.supervisor import Supervisor  # noqa: PLC0415

    command = subprocess.Popen(["sleep", "60"], process_group=0)
    started_ms, stopped_ms = [], []
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            supervisor = Supervisor(command.pid, time.monotonic() + 60, kill_children=False)
            t1 = time.perf_counter()
            supervisor.stop()
            started_ms.append((t1 - t0) * 1000)
            stopped_ms.append((time.perf_counter() - t1) * 1000)
    finally:
        command.kill()
        command.wait()
    print(
        f"supervisor, median of {runs}: start (fork) {statistics.median(started_ms):.2f} ms, "
        f"stop {statistics.median(stopped_ms):.2f} ms"
    )


if __name__ == "__main__":
    sys.exit(main())
