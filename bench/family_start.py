"""The self-contained runner's cold start in app images of each libc family, next to the
Python install's: a whole ``cron-runner exec --name x -- TRUE`` against a real, throwaway Redis,
each run a fresh process, the commands taking turns (alternating.py).

Each family is an image's root filesystem as a tarball (``podman export``, or the cached
roots of scripts/image.sh); the bundle is copied into it as the chart's init container copies
it, and the runner is started with ``chroot``, the host's /proc bound into the root, as the
distroless uid. Root only (chroot, mount).

    .venv/bin/python bench/family_start.py --bundle DIR \\
        --root musl=ROOT.tar=/bin/busybox,true --root static=ROOT.tar=/app/busybox,true ...

TRUE is the image's own no-op command, comma-separated. The Python install is the
``cron-runner`` beside this interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from alternating import in_turns, timed_run
from binary_start import size_mb

DISTROLESS = "65532:65532"


@contextlib.contextmanager
def family_root(tarball: Path, bundle: Path) -> Iterator[Path]:
    """The image's root with the bundle at /cron-runner and the host's /proc bound in."""
    with tempfile.TemporaryDirectory(prefix="family-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # the distroless uid walks it
        subprocess.run(["tar", "-C", tmp, "-xf", str(tarball)], check=True)
        shutil.copytree(bundle, root / "cron-runner", symlinks=True)
        (root / "proc").mkdir(exist_ok=True)
        (root / "tmp").mkdir(exist_ok=True)
        (root / "tmp").chmod(0o1777)
        subprocess.run(["mount", "--bind", "/proc", str(root / "proc")], check=True)
        try:
            yield root
        finally:
            subprocess.run(["umount", str(root / "proc")], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--bundle", type=Path, required=True, help="launcher + bundle/")
    parser.add_argument(
        "--root", action="append", default=[], help="NAME=TARBALL=TRUE,ARGS (repeatable)"
    )
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each (>= 10)")
    args = parser.parse_args(argv)
    if args.runs < 10:
        parser.error("--runs must be at least 10: a median of fewer says little")
    if os.geteuid() != 0:
        parser.error("needs root: chroot and mount")

    from runner.testing import RedisServer  # noqa: PLC0415 - the host's dev venv

    base = "Python install (venv)"
    commands = {base: [str(Path(sys.executable).parent / "cron-runner"), "exec", "--name", "x"]}
    commands[base] += ["--", "true"]
    with contextlib.ExitStack() as stack:
        for spec in args.root:
            name, tarball, true = spec.split("=", 2)
            root = stack.enter_context(family_root(Path(tarball), args.bundle))
            commands[f"bundle in {name}"] = [
                "chroot", f"--userspec={DISTROLESS}", str(root),
                "/cron-runner/cron-runner", "exec", "--name", "x", "--", *true.split(","),
            ]  # fmt: skip
        server = stack.enter_context(RedisServer())
        env = {"CRON_RUNNER_REDIS_URL": server.url, "PATH": os.environ["PATH"], "HOME": "/tmp"}
        for command in commands.values():
            timed_run(command, env)
        samples = in_turns(list(commands), args.runs, lambda label: timed_run(commands[label], env))

    base_ms = statistics.median(samples[base]) * 1000
    print(f"# {args.runs} runs each, alternating; load average (1 min) {os.getloadavg()[0]:.2f}")
    print(f"# bundle (launcher + bundle/): {size_mb(args.bundle):.1f} MB\n")
    print("| runner | median ms | min-max ms | ratio to the Python install |")
    print("|---|---:|---:|---:|")
    for label, times in samples.items():
        median_ms = statistics.median(times) * 1000
        print(
            f"| {label} | {median_ms:.1f} | {min(times) * 1000:.1f}-{max(times) * 1000:.1f} "
            f"| {median_ms / base_ms:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
