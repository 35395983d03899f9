"""Instructions per lease cycle, client and server, counted by callgrind: a figure that does
not move with the load of a shared machine, where lease_cycle.py's timings move by tens of
percent from one minute to the next.

- server: one redis-server runs under callgrind, counting only while it reads and executes
  client commands (``--toggle-collect=processInputBuffer``: its timers, which run by the clock
  and so more often per cycle under valgrind, are left out); the counters are zeroed before
  and read after each contender's cycles.
- client: the contender runs in a Python process under callgrind, twice, for a few and for
  many cycles: the difference divided by the extra cycles is its cost per cycle, start-up and
  imports cancelled out. The kernel's share (system calls) is not counted, on either side.

Not a replacement for timing (a system call, a context switch, a cache miss all cost without
instructions), but the way to tell whether a change made a cycle cheaper while other work
shares the cores. Needs valgrind (Debian: apt-get install valgrind); slow (minutes).

Run: ``.venv/bin/python bench/lease_instructions.py`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from lease_cycle import FACTORIES, LOCKS, SKIPS

from runner.testing import RedisServer, free_port, redis_server_binary

CLIENT_FEW = 100
# The child process of the client count: run a contender's cycles against a Redis, then exit.
CLIENT_CHILD = """
import sys
import redis
from lease_cycle import FACTORIES
port, name, cycles = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
client = redis.Redis(port=port, decode_responses=True)
contender = FACTORIES[name](client, f"ir-{name}-{cycles}")
for _ in range(cycles):
    contender.cycle()
"""


def total_ir(callgrind_out: Path) -> int:
    for line in callgrind_out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {callgrind_out}")


class ServerUnderCallgrind:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.out = directory / "server.callgrind"
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}",
             "--toggle-collect=processInputBuffer", redis_server_binary(),
             "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(directory),
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.client = redis.Redis(port=self.port, decode_responses=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start under valgrind") from None
                time.sleep(0.2)

    def control(self, flag: str) -> None:
        subprocess.run(
            ["callgrind_control", flag, str(self.proc.pid)], check=True, capture_output=True
        )

    def per_cycle(self, name: str, cycles: int, warmup: int) -> float:
        contender = FACTORIES[name](self.client, f"ir-{name}")
        for _ in range(warmup):
            contender.cycle()
        self.control("-z")
        for _ in range(cycles):
            contender.cycle()
        before = set(self.directory.glob("server.callgrind*"))
        self.control("-d")
        (dump,) = set(self.directory.glob("server.callgrind*")) - before
        return total_ir(dump) / cycles

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]
        self.proc.terminate()
        self.proc.wait()


def client_ir(port: int, name: str, cycles: int, directory: Path) -> int:
    out = directory / f"client-{name}-{cycles}.callgrind"
    here = Path(__file__).resolve().parent
    # A fixed hash seed: the two runs must differ only by their number of cycles.
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(here)}
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
         "-c", CLIENT_CHILD, str(port), name, str(cycles)],
        check=True, capture_output=True, env=env, cwd=here,
    )  # fmt: skip
    return total_ir(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=300, help="counted cycles per contender")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument(
        "--only", default="ours,raw,redis-py,ours-skip-held,ours-skip-done",
        help=f"comma-separated subset of {','.join((*LOCKS, *SKIPS))}",
    )  # fmt: skip
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    if unknown := set(names) - set(FACTORIES):
        parser.error(f"unknown contenders {sorted(unknown)}")
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        print("needs valgrind (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2

    rows: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="lease-ir-") as tmp:
        directory = Path(tmp)
        server = ServerUnderCallgrind(directory)
        try:
            server_ir = {n: server.per_cycle(n, args.cycles, args.warmup) for n in names}
        finally:
            server.close()
        with RedisServer() as plain:
            for name in names:
                few = client_ir(plain.port, name, CLIENT_FEW, directory)
                many = client_ir(plain.port, name, CLIENT_FEW + args.cycles, directory)
                rows[name] = ((many - few) / args.cycles, server_ir[name])

    print(
        f"# instructions per cycle (callgrind), {args.cycles} cycles; redis-py {redis.__version__}"
    )
    print("| contender | client | server | both |")
    print("|---|---:|---:|---:|")
    for name, (client, server_part) in rows.items():
        print(f"| {name} | {client / 1000:.0f}k | {server_part / 1000:.0f}k "
              f"| {(client + server_part) / 1000:.0f}k |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
