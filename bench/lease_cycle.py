"""Lease cycle benchmark: our acquire -> complete against a raw baseline and peer libraries.

All contenders run in one process against one local Redis, interleaved: every round runs
each contender for the same number of cycles, in an order that rotates from round to
round, so that drift (CPU frequency, a noisy neighbour) hits all of them alike. Speed is
reported as the median over rounds; the ratio to raw is the median of per-round ratios.

A second, separate pass counts what one cycle costs, on connections that count their own
traffic: client round trips (a write followed by a wait for the reply), client commands
(replies read), and server commands from ``INFO commandstats`` deltas, which include the
commands that Lua scripts call. Counting never runs while speed is being timed.

Run: ``make bench`` or ``.venv/bin/python bench/lease_cycle.py --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib.metadata
import itertools
import json
import os
import platform
import pstats
import secrets
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, cast

import redis
from redis.connection import Connection, ConnectionPool

from runner.keys import TaskKeys
from runner.lease.scripts import Acquired, Fields, Held, Lease, SlotDone, new_token
from runner.testing import RedisServer

TTL_S = 30
TTL_MS = TTL_S * 1000
HOLDER = f"{socket.gethostname()}:{os.getpid()}"
# In every key, so that runs sharing one server (--redis-url) never meet each other's slots.
RUN_ID = secrets.token_hex(4)
CPU_CHUNKS = 5

# Compare-and-delete, the release every correct Redis lock needs; the raw baseline is the
# least a correct lock can do: SET NX PX, then this.
COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

LOCKS = ("ours", "raw", "redis-py", "python-redis-lock", "pottery")
SKIPS = ("ours-skip-held", "ours-skip-done")
ALL = ("ping", *LOCKS, *SKIPS)


class BenchError(RuntimeError):
    """A contender did not do what its cycle must do; its figures would be meaningless."""


@dataclass
class Tally:
    round_trips: int = 0
    replies: int = 0


class CountingConnection(Connection):
    """Counts round trips and replies on the client side, for the counting pass only."""

    tally: ClassVar[Tally] = Tally()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._awaiting_reply = False

    def send_packed_command(self, *args: Any, **kwargs: Any) -> Any:
        self._awaiting_reply = True
        return super().send_packed_command(*args, **kwargs)  # type: ignore[no-untyped-call]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        # A pipeline sends once and reads many replies: one round trip.
        if self._awaiting_reply:
            self._awaiting_reply = False
            CountingConnection.tally.round_trips += 1
        CountingConnection.tally.replies += 1
        return super().read_response(*args, **kwargs)  # type: ignore[no-untyped-call]


@dataclass
class Contender:
    name: str
    cycle: Callable[[], None]


Factory = Callable[["redis.Redis", str], Contender]


def run_record(slot: int, fence: int, started_at: float, finished_at: float) -> Fields:
    return {
        "task": "ours",
        "slot": slot,
        "holder": HOLDER,
        "fence": fence,
        "outcome": "success",
        "started_at": f"{started_at:.3f}",
        "finished_at": f"{finished_at:.3f}",
        "duration_ms": round((finished_at - started_at) * 1000),
    }


def make_ours(client: redis.Redis, ns: str) -> Contender:
    keys = TaskKeys("bench", ns, "ours")
    slots = itertools.count(int(time.time()) // 60 * 60, 60)

    def cycle() -> None:
        slot = next(slots)
        lease = Lease(client, keys, new_token(HOLDER), ttl_ms=TTL_MS)
        started_at = time.time()
        result = lease.acquire(slot)
        if not isinstance(result, Acquired):
            raise BenchError(f"ours: expected Acquired, got {result}")
        finished_at = time.time()
        state: Fields = {
            "last_outcome": "success",
            "last_slot": slot,
            "last_success_at": f"{finished_at:.3f}",
            "last_holder": HOLDER,
            "last_duration_ms": round((finished_at - started_at) * 1000),
        }
        marker = {"holder": HOLDER, "finished_at": f"{finished_at:.3f}"}
        lease.complete(slot, run_record(slot, result.fence, started_at, finished_at), state, marker)

    return Contender("ours", cycle)


def make_ours_skip_held(client: redis.Redis, ns: str) -> Contender:
    keys = TaskKeys("bench", ns, "held")
    client.set(keys.lease, new_token("other-host:1"), px=3_600_000)
    slot = int(time.time()) // 60 * 60

    def cycle() -> None:
        result = Lease(client, keys, new_token(HOLDER), ttl_ms=TTL_MS).acquire(slot)
        if not isinstance(result, Held):
            raise BenchError(f"ours-skip-held: expected Held, got {result}")

    return Contender("ours-skip-held", cycle)


def make_ours_skip_done(client: redis.Redis, ns: str) -> Contender:
    keys = TaskKeys("bench", ns, "done")
    slot = int(time.time()) // 60 * 60
    first = Lease(client, keys, new_token("other-host:1"), ttl_ms=TTL_MS)
    if not isinstance(first.acquire(slot), Acquired):
        raise BenchError("ours-skip-done: could not set up the finished slot")
    first.complete(slot, {"outcome": "success"}, {}, {"holder": "other-host:1", "finished_at": 0})

    def cycle() -> None:
        result = Lease(client, keys, new_token(HOLDER), ttl_ms=TTL_MS).acquire(slot)
        if not isinstance(result, SlotDone):
            raise BenchError(f"ours-skip-done: expected SlotDone, got {result}")

    return Contender("ours-skip-done", cycle)


def make_raw(client: redis.Redis, ns: str) -> Contender:
    key = f"bench:{{{ns}:raw}}:lease"
    sha = str(client.script_load(COMPARE_AND_DELETE))

    def cycle() -> None:
        token = new_token(HOLDER)
        if not client.set(key, token, nx=True, px=TTL_MS):
            raise BenchError("raw: SET NX refused")
        if cast(int, client.evalsha(sha, 1, key, token)) != 1:
            raise BenchError("raw: compare-and-delete found another token")

    return Contender("raw", cycle)


def make_redis_py(client: redis.Redis, ns: str) -> Contender:
    key = f"bench:{{{ns}:redis-py}}:lock"

    def cycle() -> None:
        lock = client.lock(key, timeout=TTL_S)
        if not lock.acquire(blocking=False):
            raise BenchError("redis-py Lock: not acquired")
        lock.release()

    return Contender("redis-py", cycle)


def make_python_redis_lock(client: redis.Redis, ns: str) -> Contender:
    import redis_lock  # noqa: PLC0415 - a bench extra, absent from the version-comparison venvs

    name = f"bench:{ns}:python-redis-lock"

    def cycle() -> None:
        lock = redis_lock.Lock(client, name, expire=TTL_S, auto_renewal=False)
        if not lock.acquire(blocking=False):
            raise BenchError("python-redis-lock: not acquired")
        lock.release()

    return Contender("python-redis-lock", cycle)


def make_pottery(client: redis.Redis, ns: str) -> Contender:
    from pottery import Redlock  # noqa: PLC0415 - a bench extra, as above

    key = f"bench:{ns}:pottery"

    def cycle() -> None:
        lock = Redlock(key=key, masters={client}, auto_release_time=TTL_S)
        if not lock.acquire(blocking=False):
            raise BenchError("pottery Redlock: not acquired")
        lock.release()

    return Contender("pottery", cycle)


def make_ping(client: redis.Redis, ns: str) -> Contender:
    def cycle() -> None:
        if not client.ping():
            raise BenchError("PING failed")

    return Contender("ping", cycle)


FACTORIES: dict[str, Factory] = {
    "ping": make_ping,
    "ours": make_ours,
    "raw": make_raw,
    "redis-py": make_redis_py,
    "python-redis-lock": make_python_redis_lock,
    "pottery": make_pottery,
    "ours-skip-held": make_ours_skip_held,
    "ours-skip-done": make_ours_skip_done,
}


@dataclass
class Costs:
    cycles: int
    round_trips: float
    client_commands: float
    server_commands: float
    server_by_command: dict[str, float]
    client_cpu_us: float
    server_cpu_us: float


@dataclass
class Speed:
    rates: list[float] = field(default_factory=list)
    ratios_to_raw: list[float] = field(default_factory=list)


class Pinned:
    """The client and the Redis main thread on one core, so a round trip is two context
    switches on that core and the CPU cost of a cycle decides its speed. Left to the
    scheduler on this 2-vCPU VM, each hop may also wait for the other vCPU to wake (PING
    then swings between ~20 and ~100 us from one second to the next)."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.saved: dict[int, set[int]] = {}

    def __enter__(self) -> Pinned:
        core = {min(os.sched_getaffinity(0))}
        for pid in (0, self.server_pid):
            self.saved[pid] = os.sched_getaffinity(pid)
            os.sched_setaffinity(pid, core)
        return self

    def __exit__(self, *exc: object) -> None:
        for pid, cores in self.saved.items():
            os.sched_setaffinity(pid, cores)


REGIMES = ("pinned", "free")


def regime(name: str, server_pid: int) -> contextlib.AbstractContextManager[object]:
    return Pinned(server_pid) if name == "pinned" else contextlib.nullcontext()


def rate_of(contender: Contender, cycles: int) -> float:
    started = time.perf_counter()
    for _ in range(cycles):
        contender.cycle()
    return cycles / (time.perf_counter() - started)


def rotated(names: list[str], by: int) -> list[str]:
    by %= len(names)
    return names[by:] + names[:by]


def measure_speed(
    client: redis.Redis, args: argparse.Namespace, server_pid: int
) -> dict[str, dict[str, Speed]]:
    """Speeds by regime, then contender. Regimes and contenders both rotate per round."""
    names: list[str] = args.names
    contenders = {name: FACTORIES[name](client, f"speed-{RUN_ID}") for name in names}
    for contender in contenders.values():
        rate_of(contender, args.warmup)
    speeds = {r: {name: Speed() for name in names} for r in args.regimes}
    for round_no in range(args.rounds):
        for regime_name in rotated(args.regimes, round_no):
            rates: dict[str, float] = {}
            with regime(regime_name, server_pid):
                for name in rotated(names, args.rotate_from + round_no):
                    rates[name] = rate_of(contenders[name], args.cycles)
            for name, rate in rates.items():
                speeds[regime_name][name].rates.append(rate)
                if "raw" in rates:
                    speeds[regime_name][name].ratios_to_raw.append(rate / rates["raw"])
    return speeds


def info(admin: redis.Redis, section: str) -> dict[str, Any]:
    return cast(dict[str, Any], admin.info(section))


def close(client: redis.Redis) -> None:
    client.close()  # type: ignore[no-untyped-call]


def command_calls(admin: redis.Redis) -> Counter[str]:
    stats = info(admin, "commandstats")
    calls = Counter({name.removeprefix("cmdstat_"): s["calls"] for name, s in stats.items()})
    del calls["info"]
    return calls


def server_pid(target: dict[str, Any]) -> int:
    """The Redis main thread, to pin; only a Redis on this machine can be pinned."""
    if target.get("host") not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("the benchmark pins Redis to a core: give a Redis on this machine")
    admin = redis.Redis(connection_pool=ConnectionPool(**target))
    pid = int(info(admin, "server")["process_id"])
    close(admin)
    return pid


def server_cpu_s(admin: redis.Redis) -> float:
    cpu = info(admin, "cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def measure_costs(target: dict[str, Any], name: str, cycles: int, warmup: int) -> Costs:
    """Counts on counting connections; CPU, separately, on plain ones (no counting overhead).

    Run pinned (see Pinned): unpinned, an idle VM also bills the waking of a vCPU as CPU time.
    """
    counting_pool = ConnectionPool(connection_class=CountingConnection, **target)
    plain_pool = ConnectionPool(**target)
    counting = redis.Redis(connection_pool=counting_pool)
    plain = redis.Redis(connection_pool=plain_pool)
    admin = redis.Redis(connection_pool=ConnectionPool(**target))
    try:
        contender = FACTORIES[name](counting, f"costs-{RUN_ID}")
        rate_of(contender, warmup)
        before = command_calls(admin)
        CountingConnection.tally = Tally()
        rate_of(contender, cycles)
        tally = CountingConnection.tally
        server = command_calls(admin)
        server.subtract(before)

        contender = FACTORIES[name](plain, f"cpu-{RUN_ID}")
        rate_of(contender, warmup)
        # CPU time is noisy on a shared machine: the median of several chunks.
        chunk = max(1, cycles // CPU_CHUNKS)
        client_cpu_us, server_cpu_us = [], []
        for _ in range(CPU_CHUNKS):
            server_before_s, client_before_s = server_cpu_s(admin), time.process_time()
            rate_of(contender, chunk)
            client_cpu_us.append((time.process_time() - client_before_s) / chunk * 1e6)
            server_cpu_us.append((server_cpu_s(admin) - server_before_s) / chunk * 1e6)
        return Costs(
            cycles=cycles,
            round_trips=tally.round_trips / cycles,
            client_commands=tally.replies / cycles,
            server_commands=sum(server.values()) / cycles,
            server_by_command={cmd: n / cycles for cmd, n in sorted(server.items()) if n},
            client_cpu_us=statistics.median(client_cpu_us),
            server_cpu_us=statistics.median(server_cpu_us),
        )
    finally:
        for client in (counting, plain, admin):
            close(client)
        counting_pool.disconnect()
        plain_pool.disconnect()


def profile(target: dict[str, Any], name: str, cycles: int, warmup: int) -> None:
    """Where one contender's client time goes: cProfile, heaviest functions first."""
    client = redis.Redis(connection_pool=ConnectionPool(**target))
    contender = FACTORIES[name](client, f"profile-{RUN_ID}")
    rate_of(contender, warmup)
    profiler = cProfile.Profile()
    profiler.runcall(rate_of, contender, cycles)
    close(client)
    print(f"# cProfile of {cycles} cycles of {name} (the profiler inflates per-call costs)")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)


def version_of(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment(admin: redis.Redis) -> dict[str, Any]:
    server = info(admin, "server")
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "redis_py": version_of("redis"),
        "hiredis": version_of("hiredis"),
        "python_redis_lock": version_of("python-redis-lock"),
        "pottery": version_of("pottery"),
        "redis_server": server.get("redis_version", "?"),
        "load_average_1m": os.getloadavg()[0],
    }


def fmt_count(value: float) -> str:
    return str(round(value)) if abs(value - round(value)) < 0.005 else f"{value:.2f}"


def speed_cells(speed: Speed | None) -> list[str]:
    if speed is None:
        return ["-", "-"]
    rate = statistics.median(speed.rates)
    low, high = min(speed.rates), max(speed.rates)
    ratio = f"{statistics.median(speed.ratios_to_raw):.2f}" if speed.ratios_to_raw else "-"
    return [f"{rate:.0f} ({low:.0f}-{high:.0f})", ratio]


def cost_cells(costs: Costs | None) -> list[str]:
    if costs is None:
        return ["-"] * 5
    detail = ", ".join(f"{cmd} {fmt_count(n)}" for cmd, n in costs.server_by_command.items())
    return [
        fmt_count(costs.round_trips),
        fmt_count(costs.client_commands),
        f"{fmt_count(costs.server_commands)} ({detail})",
        f"{costs.client_cpu_us:.0f}",
        f"{costs.server_cpu_us:.0f}",
    ]


def table(
    names: list[str], speeds: dict[str, dict[str, Speed]], costs: dict[str, Costs]
) -> Iterator[str]:
    heads = [f"{r}: median cycles/s (min-max) | {r}: x raw" for r in speeds]
    yield (
        "| contender | " + " | ".join(heads) + " | client round trips | client commands"
        " | server commands (incl. script-internal) | client CPU us | server CPU us |"
    )
    yield "|---|" + "---:|---:|" * len(speeds) + "---:|---:|---|---:|---:|"
    for name in names:
        if name == "ping":
            continue
        cells = [c for r in speeds for c in speed_cells(speeds[r].get(name))]
        cells += cost_cells(costs.get(name))
        yield f"| {name} | " + " | ".join(cells) + " |"


def check_targets(
    speeds: dict[str, dict[str, Speed]], costs: dict[str, Costs]
) -> tuple[list[str], bool, bool]:
    """Lines of PASS/MISS, whether every count target holds, whether every speed target holds."""
    lines: list[str] = []
    counts_ok = True
    speed_ok = True
    wanted_round_trips = {"ours": 2, "ours-skip-held": 1, "ours-skip-done": 1}
    for name, wanted in wanted_round_trips.items():
        if name not in costs:
            continue
        round_trips = costs[name].round_trips
        ok = round_trips == wanted
        counts_ok &= ok
        verdict = "PASS" if ok else "MISS"
        lines.append(f"{verdict} {name}: {fmt_count(round_trips)} round trips, want {wanted}")
    for regime_name, by_name in speeds.items():
        if "ours" in by_name and by_name["ours"].ratios_to_raw:
            ratio = statistics.median(by_name["ours"].ratios_to_raw)
            ok = ratio >= 0.95
            speed_ok &= ok
            verdict = "PASS" if ok else "MISS"
            lines.append(f"{verdict} ours ({regime_name}): {ratio:.2f}x raw, want >= 0.95x")
    return lines, counts_ok, speed_ok


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cycles", type=int, default=2000, help="cycles per contender per round")
    parser.add_argument("--warmup", type=int, default=300, help="untimed cycles before round 1")
    parser.add_argument(
        "--count-cycles", type=int, default=1000, help="cycles in the counting and CPU passes"
    )
    parser.add_argument(
        "--only", default=",".join(ALL), help=f"comma-separated subset of {','.join(ALL)}"
    )
    parser.add_argument("--skip-counts", action="store_true", help="time only; no counting pass")
    parser.add_argument(
        "--regimes",
        default=",".join(REGIMES),
        help="pinned: client and Redis on one core (CPU cost decides); free: as the scheduler "
        "places them (a round trip may also wait for a vCPU to wake, like a short network hop)",
    )
    parser.add_argument(
        "--rotate-from", type=int, default=0, help="where the first round's rotation starts"
    )
    parser.add_argument(
        "--redis-url",
        help="use this Redis (must be otherwise idle, or the server counts are wrong) "
        "instead of starting a throwaway redis-server",
    )
    parser.add_argument(
        "--profile", metavar="NAME", help="instead of the benchmark, cProfile one contender"
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write the results as JSON ('-' = stdout)"
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when the speed target is missed too"
    )
    args = parser.parse_args(argv)
    args.names = [n for n in args.only.split(",") if n]
    args.regimes = [r for r in args.regimes.split(",") if r]
    if not args.regimes or set(args.regimes) - set(REGIMES):
        parser.error(f"--regimes takes a comma-separated subset of {','.join(REGIMES)}")
    unknown = {*args.names, *([args.profile] if args.profile else [])} - set(ALL)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; choose from {','.join(ALL)}")
    return args


def run(args: argparse.Namespace, url: str) -> int:
    # Every client decodes replies, as the runner's does.
    pool = ConnectionPool.from_url(url)  # type: ignore[no-untyped-call]
    target = {**pool.connection_kwargs, "decode_responses": True}
    if args.profile:
        with Pinned(server_pid(target)):
            profile(target, args.profile, args.count_cycles, args.warmup)
        return 0
    admin = redis.Redis(connection_pool=ConnectionPool(**target))
    env = environment(admin)
    close(admin)
    client = redis.Redis(connection_pool=ConnectionPool(**target))
    speeds = measure_speed(client, args, server_pid(target))
    close(client)
    costs: dict[str, Costs] = {}
    if not args.skip_counts:
        with Pinned(server_pid(target)):
            for name in args.names:
                costs[name] = measure_costs(target, name, args.count_cycles, args.warmup)
    lines, counts_ok, speed_ok = check_targets(speeds, costs)
    report = {
        "environment": env,
        "settings": {
            k: getattr(args, k) for k in ("rounds", "cycles", "warmup", "count_cycles", "regimes")
        },
        "speed": {r: {n: asdict(s) for n, s in by_name.items()} for r, by_name in speeds.items()},
        "costs": {name: asdict(c) for name, c in costs.items()},
        "targets": lines,
    }
    if args.json == "-":
        json.dump(report, sys.stdout)
        return 0
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    print(
        f"# {env['cpu']}, {env['cores']} cores; Python {env['python']}; "
        f"redis-py {env['redis_py']}, hiredis {env['hiredis']}; Redis {env['redis_server']}"
    )
    print(
        f"# load average (1 min) {env['load_average_1m']:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end: above ~0.5 other work shares these cores"
    )
    print(
        f"# {args.rounds} rounds x {args.cycles} cycles, interleaved, rotating order; "
        f"regimes: {', '.join(args.regimes)}\n"
    )
    pings = [
        f"{r} {1e6 / statistics.median(by_name['ping'].rates):.0f} us"
        for r, by_name in speeds.items()
        if "ping" in by_name
    ]
    if pings:
        print(f"PING (median round trip): {', '.join(pings)}\n")
    for line in table(args.names, speeds, costs):
        print(line)
    print()
    for line in lines:
        print(line)
    return 0 if counts_ok and (speed_ok or not args.strict) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.redis_url:
        return run(args, args.redis_url)
    with RedisServer() as server:
        return run(args, server.url)


if __name__ == "__main__":
    sys.exit(main())
