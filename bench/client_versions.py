"""redis-py versions side by side: PING latency, the raw baseline and our cycle, per client.

Each client lives in its own throwaway virtual environment (never the project's .venv).
One Redis serves them all; every round runs ``lease_cycle.py --rounds 1`` once under each
interpreter, in an order that rotates from round to round, and the medians over rounds
are compared. ``--make-venvs DIR`` creates the four environments the README's figures
come from.

Run: ``.venv/bin/python bench/client_versions.py --make-venvs /tmp/cron-runner-clients``
then ``.venv/bin/python bench/client_versions.py --python NAME=PATH ...`` (see --help).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from runner.testing import RedisServer

ROOT = Path(__file__).resolve().parent.parent
LEASE_CYCLE = ROOT / "bench" / "lease_cycle.py"
CONTENDERS = "ping,raw,ours"

# What each throwaway environment holds (croniter was a runtime dependency when the figures
# in bench/README.md were taken; the runner no longer needs it, and it is never imported here).
# The package itself comes from PYTHONPATH, so nothing is installed from the work tree.
VARIANTS = {
    "redis-5.2.1": ["redis==5.2.1", "croniter==6.2.4"],
    "redis-5.2.1+hiredis": ["redis==5.2.1", "hiredis==3.5.0", "croniter==6.2.4"],
    "redis-8.1.0": ["redis==8.1.0", "croniter==6.2.4"],
    "redis-8.1.0+hiredis": ["redis==8.1.0", "hiredis==3.5.0", "croniter==6.2.4"],
}


def make_venvs(directory: Path) -> list[str]:
    specs = []
    for name, requirements in VARIANTS.items():
        venv = directory / name
        python = venv / "bin" / "python"
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True)
        specs.append(f"{name}={python}")
    return specs


def one_round(python: str, url: str, cycles: int, warmup: int, rotate_from: int) -> dict[str, Any]:
    command = [
        python, str(LEASE_CYCLE), "--redis-url", url, "--rounds", "1",
        "--cycles", str(cycles), "--warmup", str(warmup), "--only", CONTENDERS,
        "--skip-counts", "--rotate-from", str(rotate_from), "--json", "-",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="an interpreter whose environment has the client to measure (repeat)",
    )
    parser.add_argument("--make-venvs", metavar="DIR", help="create the environments, then run")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    args = parser.parse_args(argv)
    specs: list[str] = list(args.python)
    if args.make_venvs:
        specs += make_venvs(Path(args.make_venvs))
    if not specs:
        parser.error("give --python NAME=PATH at least once, or --make-venvs DIR")
    clients = dict(spec.split("=", 1) for spec in specs)
    names = list(clients)

    # rates[client][regime][contender]: one figure per round; ratios[client][regime]: ours/raw
    rates: dict[str, dict[str, dict[str, list[float]]]] = {}
    ratios: dict[str, dict[str, list[float]]] = {}
    versions: dict[str, dict[str, Any]] = {}
    first_env: dict[str, Any] = {}
    with RedisServer() as server:
        for round_no in range(args.rounds):
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            for name in order:
                report = one_round(clients[name], server.url, args.cycles, args.warmup, round_no)
                versions[name] = report["environment"]
                first_env = first_env or report["environment"]
                for regime, by_contender in report["speed"].items():
                    for contender, speed in by_contender.items():
                        rates.setdefault(name, {}).setdefault(regime, {}).setdefault(
                            contender, []
                        ).extend(speed["rates"])
                    ratios.setdefault(name, {}).setdefault(regime, []).extend(
                        by_contender["ours"]["ratios_to_raw"]
                    )

    env = first_env
    regimes = list(rates[names[0]])
    print(
        f"# {env['cpu']}, {env['cores']} cores; Python {env['python']}; Redis {env['redis_server']}"
    )
    print(
        f"# load average (1 min) {env['load_average_1m']:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end"
    )
    print(f"# {args.rounds} rounds x {args.cycles} cycles per contender, interleaved\n")
    for regime in regimes:
        print(f"{regime}:\n")
        print(
            "| client | redis-py | hiredis | PING us | raw cycles/s | ours cycles/s | ours x raw "
            f"| raw vs {names[0]} |"
        )
        print("|---|---|---|---:|---:|---:|---:|---:|")
        first_raw = statistics.median(rates[names[0]][regime]["raw"])
        for name in names:
            by = rates[name][regime]
            raw = statistics.median(by["raw"])
            print(
                f"| {name} | {versions[name]['redis_py']} | {versions[name]['hiredis']} "
                f"| {1e6 / statistics.median(by['ping']):.0f} | {raw:.0f} "
                f"| {statistics.median(by['ours']):.0f} "
                f"| {statistics.median(ratios[name][regime]):.2f} | {raw / first_raw:.2f} |"
            )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
