"""What telemetry costs a cold ``cron-runner exec --name x -- true``, and what it costs when off.

Commands, alternating, after one untimed run of each, against one throwaway Redis:

- ``off``: this venv (telemetry extra installed), no OTLP endpoint;
- ``on``: this venv, ``OTEL_EXPORTER_OTLP_ENDPOINT`` set to a real OTLP/HTTP receiver on
  loopback (the tests' one), so each run builds the SDK, records and exports;
- ``without-extra``: with ``--without-extra VENV``, a venv where cron-runner is installed
  without the telemetry extra (``python3 -m venv V && V/bin/pip install -c constraints.txt -e .``).

Also lists which ``opentelemetry`` modules one run imported, per command.

Run: ``.venv/bin/python bench/telemetry_start.py [--runs 15] [--without-extra /tmp/notel]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from alternating import in_turns, timed_run

from runner.testing import RedisServer
from tests.helpers.otlp import OtlpReceiver

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import sys; from runner.cli.main import main; code = main(sys.argv[1:]); "
    "print(sum(m.startswith('opentelemetry') for m in sys.modules), file=sys.__stdout__); "
    "sys.exit(code)"
)


def otel_modules(python: str, env: dict[str, str]) -> int:
    done = subprocess.run(
        [python, "-c", PROBE, "exec", "--name", "x", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=15, help="timed runs of each (>= 10)")
    parser.add_argument("--without-extra", metavar="VENV", help="a venv without the extra")
    args = parser.parse_args(argv)
    if args.runs < 10:
        parser.error("--runs must be at least 10")

    here = Path(sys.executable).parent
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CRON_RUNNER_"))}
    with RedisServer() as server, OtlpReceiver() as receiver:
        base.update(CRON_RUNNER_REDIS_URL=server.url, CRON_RUNNER_LOG_LEVEL="warning")
        on = {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        cases: dict[str, tuple[Path, dict[str, str]]] = {
            "off (extra installed, no endpoint)": (here, base),
            "on (endpoint set, exports to a receiver)": (here, on),
        }
        if args.without_extra:
            cases["without the extra"] = (Path(args.without_extra) / "bin", base)
        commands = {
            label: ([str(bin_dir / "cron-runner"), "exec", "--name", "x", "--", "true"], env)
            for label, (bin_dir, env) in cases.items()
        }
        modules = {
            label: otel_modules(str(bin_dir / "python"), env)
            for label, (bin_dir, env) in cases.items()
        }
        for command, env in commands.values():
            timed_run(command, env)
        samples = in_turns(list(commands), args.runs, lambda label: timed_run(*commands[label]))
        exported = len(receiver.traces)

    print(f"# {args.runs} runs each, alternating; load average (1 min) {os.getloadavg()[0]:.2f}\n")
    print(
        "| `cron-runner exec --name x -- true` | median ms | min-max ms | opentelemetry modules |"
    )
    print("|---|---:|---:|---:|")
    for label, runs in samples.items():
        print(
            f"| {label} | {statistics.median(runs) * 1000:.1f} | "
            f"{min(runs) * 1000:.1f}-{max(runs) * 1000:.1f} | {modules[label]} |"
        )
    print(
        f"\nthe receiver got {exported} trace exports (one per 'on' run, warm-up and probe included)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
