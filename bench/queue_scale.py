"""Seed 001 §9: 50,000 jobs enqueued together, 4 workers, 2 of them ``kill -9``ed mid-way.

The same workload runs on cron-runner's queue mode (Dramatiq workers, ``cron-runner
worker``) and, as the peer anchor, on RQ (4 ``rq worker`` processes), each against its own
fresh Redis configured as the seed says (appendonly, everysec, noeviction). Workers are
started first and idle; then all jobs are enqueued as fast as the client can send them.
When 40% have run, two workers and their children are killed with SIGKILL. The run ends when
every job has run (or, for RQ, when the queue is empty and nothing moves any more).

A job is almost no work: it appends ``i pid enqueued_ms started_ms`` to a Redis list, so
what is measured is the queue's own cost. From those lines:

- throughput: jobs that ran / (last start - first enqueue), in jobs/s;
- latency: start - enqueue, p50 and p99, in ms;
- lost: jobs that never ran; duplicates: jobs that ran more than once, and on which workers;
- Redis memory (``used_memory``) before the enqueue, at its peak, and after the run with the
  result list deleted (what the queue left behind).

Dramatiq re-delivers a dead worker's fetched-but-unacknowledged messages once its heartbeat
is older than the heartbeat timeout, at the next maintenance pass; both are set short here
(2 s, 5% of broker calls) as the issue asks. RQ has no re-delivery: a killed worker's job
stays in its StartedJobRegistry and is later moved to the FailedJobRegistry as abandoned.

``--leased`` sends each job as a run's message for a slot of its own, under overlap
allow-other-slots: each job then takes, renews and completes a lease of its own (issue 17),
which measures what the lease costs a job; the jobs a ``Producer`` sends, as by default, take
none.

Run: ``.venv/bin/python bench/queue_scale.py`` (``--help``; ``--json PATH`` writes the
results, which tests/queue/test_scale.py asserts on).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import redis

from runner import RunContext, task
from runner.testing import RedisServer

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DONE = "bench:done"
TASK = "scale-job"
RQ_QUEUE = "scale"
NAMESPACE = "cron-runner:queue:default"

_clients: dict[int, redis.Redis] = {}


def _client() -> redis.Redis:
    """One client per worker process, made on first use there."""
    pid = os.getpid()
    if pid not in _clients:
        _clients[pid] = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    return _clients[pid]


def _done(i: int, enqueued_ms: int) -> None:
    started_ms = int(time.time() * 1000)
    _client().rpush(DONE, f"{i} {os.getpid()} {enqueued_ms} {started_ms}")


@task(TASK)
def scale_job(ctx: RunContext) -> None:
    """cron-runner's job: one line per run."""
    _done(int(ctx.payload["i"]), int(ctx.payload["t"]))


def rq_job(i: int, enqueued_ms: int) -> None:
    """RQ's job: the same line."""
    _done(i, enqueued_ms)


@dataclass
class Result:
    system: str
    jobs: int
    workers: int
    threads: int
    killed: int
    enqueue_s: float = 0.0
    duration_s: float = 0.0
    throughput_jobs_s: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    ran: int = 0
    lost: int = 0
    duplicates: int = 0
    duplicates_on_killed_workers: int = 0
    killed_pids: list[int] = field(default_factory=list)
    drained: bool = False
    left_in_queue: dict[str, int] = field(default_factory=dict)
    memory_before_bytes: int = 0
    memory_peak_bytes: int = 0
    memory_after_bytes: int = 0
    notes: str = ""


class Workers:
    """Worker processes, each in its own session so that kill -9 takes its children too."""

    def __init__(self, commands: Sequence[list[str]], env: dict[str, str]) -> None:
        self.logs = [tempfile.TemporaryFile() for _ in commands]  # noqa: SIM115 - closed in stop()
        self.procs = [
            subprocess.Popen(cmd, env=env, stdout=log, stderr=log, cwd=ROOT, start_new_session=True)
            for cmd, log in zip(commands, self.logs, strict=True)
        ]

    def kill(self, count: int) -> list[int]:
        pids = []
        for proc in self.procs[:count]:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pids.append(proc.pid)
        return pids

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in self.logs:
            log.close()

    def tail(self) -> str:
        out = []
        for log in self.logs:
            log.seek(0)
            out.append(log.read().decode(errors="replace")[-2000:])
        return "\n---\n".join(out)


def _memory(r: redis.Redis) -> tuple[int, int]:
    info = cast(dict[str, Any], r.info("memory"))
    return int(info["used_memory"]), int(info["used_memory_peak"])


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.05)


def _tally(result: Result, r: redis.Redis, killed: set[int], first_ms: int) -> None:
    """What the jobs left in DONE, and Redis's peak memory, once the run is over."""
    _analyse(result, cast(list[bytes], r.lrange(DONE, 0, -1)), killed, first_ms)
    result.memory_peak_bytes = _memory(r)[1]


@contextmanager
def _workers(
    result: Result, r: redis.Redis, commands: list[list[str]], env: dict[str, str]
) -> Iterator[Workers]:
    """The worker processes, stopped at the end; then Redis's memory once DONE is deleted."""
    pool = Workers(commands, env)
    try:
        yield pool
    finally:
        pool.stop()
    r.delete(DONE)
    result.memory_after_bytes = _memory(r)[0]
    r.connection_pool.disconnect()


def _analyse(result: Result, lines: list[bytes], killed: set[int], first_enqueue_ms: int) -> None:
    runs: dict[int, list[int]] = defaultdict(list)
    latencies = []
    last_start_ms = first_enqueue_ms
    for line in lines:
        i, pid, enqueued_ms, started_ms = (int(x) for x in line.split())
        runs[i].append(pid)
        latencies.append(started_ms - enqueued_ms)
        last_start_ms = max(last_start_ms, started_ms)
    result.ran = len(runs)
    result.lost = result.jobs - len(runs)
    repeated = {i: pids for i, pids in runs.items() if len(pids) > 1}
    result.duplicates = len(repeated)
    result.duplicates_on_killed_workers = sum(1 for pids in repeated.values() if pids[0] in killed)
    result.duration_s = (last_start_ms - first_enqueue_ms) / 1000
    result.throughput_jobs_s = result.ran / result.duration_s if result.duration_s else 0.0
    latencies.sort()
    result.latency_p50_ms = float(statistics.median(latencies))
    result.latency_p99_ms = float(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))])


def _env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRON_RUNNER_", "OTEL_"))}
    env.update(BENCH_REDIS_URL=url, PYTHONPATH=f"{ROOT / 'bench'}:{ROOT}", **extra)
    return env


def _send_slots(producer: Any, jobs: int, batch: int = 1000) -> None:
    """Each job as an enqueueing run sends a slot's: its own slot, the run's name, and overlap
    allow-other-slots, so that the jobs run side by side, each under a lease of its own."""
    from runner.queue.messages import build_message, enqueue_on, leave_heartbeats  # noqa: PLC0415

    options = {"overlap": "allow-other-slots"}
    for low in range(0, jobs, batch):
        with producer.client.pipeline(transaction=False) as pipe:
            for i in range(low, min(jobs, low + batch)):
                payload = {"i": i, "t": int(time.time() * 1000)}
                message = build_message(TASK, TASK, slot=1_600_000_000 + 60 * i, fence=0,
                                        payload=payload, message_id=None, limit_bytes=None,
                                        options=options, name=TASK)  # fmt: skip
                enqueue_on(pipe, producer.broker, message, leave=False)
            leave_heartbeats(pipe, producer.broker)
            pipe.execute()


def run_cron_runner(
    jobs: int, workers: int, threads: int, kill: int, kill_at: float, *, leased: bool = False
) -> Result:
    from runner.config.queue import QueueSettings  # noqa: PLC0415
    from runner.config.settings import load_settings  # noqa: PLC0415
    from runner.queue.producer import Producer  # noqa: PLC0415
    from runner.queue.stats import queue_stats  # noqa: PLC0415

    system = "cron-runner (Dramatiq, a lease per job)" if leased else "cron-runner (Dramatiq)"
    result = Result(system, jobs, workers, threads, kill)
    with RedisServer(appendonly=True) as server:
        r = redis.Redis(port=server.port)
        env = _env(
            server.url,
            CRON_RUNNER_REDIS_URL=server.url,
            CRON_RUNNER_TASK_MODULES="queue_scale",
            CRON_RUNNER_LOG_FORMAT="json",
            CRON_RUNNER_LOG_LEVEL="WARNING",
            CRON_RUNNER_WORKER_POLL_INTERVAL="100ms",
            CRON_RUNNER_QUEUE_HEARTBEAT_TIMEOUT="2s",
            CRON_RUNNER_QUEUE_MAINTENANCE_CHANCE="0.05",
            CRON_RUNNER_SHUTDOWN_GRACE="5s",
        )
        command = [str(BIN / "cron-runner"), "worker", "--threads", str(threads)]
        argvs = [[*command, "--holder", f"w{n}"] for n in range(workers)]
        with _workers(result, r, argvs, env) as pool:
            _wait(lambda: int(cast(int, r.zcard(f"{NAMESPACE}:__heartbeats__"))) >= workers,
                  30, "the workers to start")  # fmt: skip
            result.memory_before_bytes = _memory(r)[0]
            settings = load_settings({"CRON_RUNNER_REDIS_URL": server.url})
            producer = Producer(settings, QueueSettings(namespace=NAMESPACE), queues={TASK: TASK})
            started = time.monotonic()
            first_ms = int(time.time() * 1000)
            if leased:
                _send_slots(producer, jobs)
            else:
                producer.send_many(
                    TASK, ({"i": i, "t": int(time.time() * 1000)} for i in range(jobs)), batch=1000
                )
            result.enqueue_s = time.monotonic() - started
            producer.close()
            _wait(lambda: int(cast(int, r.llen(DONE))) >= jobs * kill_at, 300, "the kill point")
            killed = pool.kill(kill)
            result.killed_pids = killed

            def all_ran() -> bool:
                return (
                    len({line.split()[0] for line in cast(list[bytes], r.lrange(DONE, 0, -1))})
                    >= jobs
                )

            _wait(lambda: int(cast(int, r.llen(DONE))) >= jobs and all_ran(), 300, "every job")

            def drained() -> bool:
                (row,) = queue_stats(r, NAMESPACE, [TASK])
                acks = sum(
                    int(cast(int, r.scard(k))) for k in r.scan_iter(match=f"{NAMESPACE}:__acks__.*")
                )
                result.left_in_queue = {"ready": row.ready, "in_flight": row.in_flight,
                                        "delayed": row.delayed, "dead": row.dead, "unacked": acks}  # fmt: skip
                return not any(result.left_in_queue.values())

            try:
                _wait(drained, 60, "the queue to drain")
                result.drained = True
            except TimeoutError:
                result.drained = False
            _tally(result, r, set(killed), first_ms)
    result.notes = (f"{workers} `cron-runner worker` processes x {threads} threads; heartbeat "
                    "timeout 2s, maintenance 5%")  # fmt: skip
    return result


def run_rq(jobs: int, workers: int, kill: int, kill_at: float, worker_class: str) -> Result:
    from rq import Queue  # noqa: PLC0415

    result = Result(
        f"RQ {_rq_version()} ({worker_class.rsplit('.', 1)[-1]})", jobs, workers, 1, kill
    )
    with RedisServer(appendonly=True) as server:
        r = redis.Redis(port=server.port)
        env = _env(server.url)
        command = [str(BIN / "rq"), "worker", "--url", server.url, "--path", str(ROOT / "bench"),
                   "--worker-class", worker_class, "--logging_level", "WARNING", RQ_QUEUE]  # fmt: skip
        argvs = [[*command, "--name", f"rq{n}"] for n in range(workers)]
        with _workers(result, r, argvs, env) as pool:
            _wait(lambda: int(cast(int, r.scard("rq:workers"))) >= workers, 30, "the RQ workers")
            result.memory_before_bytes = _memory(r)[0]
            queue = Queue(RQ_QUEUE, connection=r)
            started = time.monotonic()
            first_ms = int(time.time() * 1000)
            for low in range(0, jobs, 1000):
                batch = [
                    # By name: run as a script, this module is __main__ to itself.
                    Queue.prepare_data(
                        "queue_scale.rq_job", args=(i, int(time.time() * 1000)), result_ttl=0
                    )
                    for i in range(low, min(jobs, low + 1000))
                ]
                queue.enqueue_many(batch)
            result.enqueue_s = time.monotonic() - started
            _wait(lambda: int(cast(int, r.llen(DONE))) >= jobs * kill_at, 300, "the kill point")
            result.killed_pids = pool.kill(kill)

            last = [-1, time.monotonic()]

            def settled() -> bool:
                count = int(cast(int, r.llen(DONE)))
                if count != last[0]:
                    last[:] = [count, time.monotonic()]
                return queue.count == 0 and time.monotonic() - last[1] > 3

            _wait(settled, 300, "RQ's queue to empty and settle")
            result.left_in_queue = {"ready": queue.count,
                                    "started_registry": len(queue.started_job_registry)}  # fmt: skip
            result.drained = queue.count == 0
            _tally(result, r, set(result.killed_pids), first_ms)
    result.notes = (f"{workers} `rq worker` processes ({worker_class}), one job at a time each; "
                    "killed workers' jobs are not re-delivered")  # fmt: skip
    return result


def _rq_version() -> str:
    import rq  # noqa: PLC0415

    return str(rq.__version__)


def report(results: Sequence[Result]) -> str:
    head = ("| system | jobs/s | p50 ms | p99 ms | ran | lost | duplicates | drained | "
            "Redis before / peak / after |")  # fmt: skip
    rows = [head, "|" + " --- |" * 9]
    for res in results:
        mib = [f"{b / 2**20:.1f}" for b in (res.memory_before_bytes, res.memory_peak_bytes,
                                             res.memory_after_bytes)]  # fmt: skip
        rows.append(
            f"| {res.system} | {res.throughput_jobs_s:,.0f} | {res.latency_p50_ms:,.0f} | "
            f"{res.latency_p99_ms:,.0f} | {res.ran:,} | {res.lost} | {res.duplicates} "
            f"({res.duplicates_on_killed_workers} from killed) | "
            f"{'yes' if res.drained else 'no'} | {' / '.join(mib)} MiB |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8, help="threads per cron-runner worker")
    parser.add_argument("--kill", type=int, default=2, help="workers to kill -9 mid-way")
    parser.add_argument("--kill-at", type=float, default=0.4, help="share of jobs run first")
    parser.add_argument("--rq-worker-class", default="rq.worker.SimpleWorker",
                        help="rq.worker.SimpleWorker (in-process) or rq.Worker (fork per job)")  # fmt: skip
    parser.add_argument("--skip-rq", action="store_true")
    parser.add_argument("--leased", action="store_true",
                        help="each job a slot's, under a lease of its own (allow-other-slots)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    results = [run_cron_runner(args.jobs, args.workers, args.threads, args.kill, args.kill_at,
                               leased=args.leased)]  # fmt: skip
    print(report(results), flush=True)
    if not args.skip_rq:
        results.append(
            run_rq(args.jobs, args.workers, args.kill, args.kill_at, args.rq_worker_class)
        )
        print(report(results[1:]).splitlines()[-1])
        ratio = results[0].throughput_jobs_s / results[1].throughput_jobs_s
        print(f"throughput ratio cron-runner / RQ: {ratio:.2f}")
    for res in results:
        print(f"{res.system}: {res.notes}; enqueue {res.enqueue_s:.2f}s; killed {res.killed_pids}; "
              f"left {res.left_in_queue}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
