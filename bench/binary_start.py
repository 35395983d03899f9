"""The self-contained runner against the Python install: size on disk and cold start.

Cold start is a whole ``cron-runner exec --name x -- true`` against a real, throwaway Redis,
each run a fresh process. The commands alternate after one untimed warm-up of each, so the
page cache is warm for all alike, and the medians are compared as a ratio.

    .venv/bin/python bench/binary_start.py --bundle DIR [--onefile FILE] [--runs 20]

DIR holds the launcher and the PyInstaller bundle (``/opt/cron-runner-bin`` in the image).
The Python install is the ``cron-runner`` beside this interpreter, its size the venv, the
standard library and the interpreter. To compare like with like, run it in the image, with its
own Python and a Redis on the host (bench/README.md)::

    scripts/image.sh env podman run --rm --network host -v $PWD/bench:/bench:ro \\
        --entrypoint /opt/cron-runner/bin/python localhost/cron-runner:test \\
        /bench/binary_start.py --bundle /opt/cron-runner-bin --redis-url redis://127.0.0.1:6399/0

``--onefile`` adds a one-file build for comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import sysconfig
from pathlib import Path

from alternating import in_turns, timed_run


def size_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 1e6
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def python_install_size_mb() -> float:
    """The venv, the interpreter's standard library, the interpreter and its libpython."""
    paths = {
        Path(sys.prefix),
        Path(sysconfig.get_path("stdlib")),
        Path(sys.executable).resolve(),
        Path(sysconfig.get_config_var("LIBDIR") or "/")
        / str(sysconfig.get_config_var("INSTSONAME") or "none"),
    }
    return sum(size_mb(p) for p in paths if p.exists())


def measure(commands: dict[str, list[str]], url: str, runs: int) -> dict[str, list[float]]:
    env = {**os.environ, "CRON_RUNNER_REDIS_URL": url}
    for command in commands.values():
        timed_run(command, env)
    return in_turns(list(commands), runs, lambda label: timed_run(commands[label], env))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--bundle", type=Path, required=True, help="the bundle directory")
    parser.add_argument("--onefile", type=Path, help="a one-file build, for comparison")
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each (>= 10)")
    parser.add_argument("--redis-url", help="a Redis to use instead of a throwaway one")
    args = parser.parse_args(argv)
    if args.runs < 10:
        parser.error("--runs must be at least 10: a median of fewer says little")

    tail = ["exec", "--name", "x", "--", "true"]
    commands = {
        "Python install (venv)": [str(Path(sys.executable).parent / "cron-runner"), *tail],
        "bundle (onedir)": [str(args.bundle / "cron-runner"), *tail],
    }
    sizes = {
        "Python install (venv)": python_install_size_mb(),
        "bundle (onedir)": size_mb(args.bundle),
    }
    if args.onefile:
        commands["one-file"] = [str(args.onefile), *tail]
        sizes["one-file"] = size_mb(args.onefile)

    if args.redis_url:
        samples = measure(commands, args.redis_url, args.runs)
    else:
        from runner.testing import RedisServer  # noqa: PLC0415 - not in the image

        with RedisServer() as server:
            samples = measure(commands, server.url, args.runs)

    base_ms = statistics.median(samples["Python install (venv)"]) * 1000
    print(f"# {args.runs} runs each, alternating; load average (1 min) {os.getloadavg()[0]:.2f}\n")
    print("| runner | size MB | median ms | min-max ms | ratio to the Python install |")
    print("|---|---:|---:|---:|---:|")
    for label, times in samples.items():
        median_ms = statistics.median(times) * 1000
        print(
            f"| {label} | {sizes[label]:.1f} | {median_ms:.1f} "
            f"| {min(times) * 1000:.1f}-{max(times) * 1000:.1f} | {median_ms / base_ms:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
