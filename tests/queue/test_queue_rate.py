"""The per-task rate limit of queue mode (issue 17, item 5): `@task(rate_limit="N/DURATION")`
or the enqueueing CronJob's CRON_RUNNER_RATE_LIMIT, shared by every worker through Dramatiq's
WindowRateLimiter on the same Redis. Never more than N starts in any window, and nothing
dropped: a job over the limit goes back to its queue with a delay, never to the dead letters.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest
import redis

from runner.config.queue import load_queue_settings
from runner.config.rates import RateLimit, parse_rate_limit
from runner.config.settings import load_settings
from runner.errors import ConfigError
from runner.keys import TaskKeys
from runner.queue.limits import delay_ms
from runner.queue.options import job_policy, message_options
from runner.tasks import RunContext, TaskSpec, task
from runner.testing import RedisServer
from tests.helpers.proc import events, outcome
from tests.helpers.wait import wait_for
from tests.queue.helpers import (
    WorkerProc,
    cli,
    effects,
    producer,
    queue_env,
    send_slot,
    start_worker,
    stats,
    unacked,
)
from tests.queue.queue_tasks import rated

KEYS = TaskKeys("cron-runner", "default", "q-slot")
JOBS = 24
LIMIT, WINDOW_S = 4, 1.0  # q-rated: rate_limit="4/1s"
# The task records its start a moment after the limiter let it through, and on a busy machine
# that moment can be a tenth of a second later for one job than for another: its own clock is
# held to windows this much shorter. Redis's clock (MONITOR) is held to the whole window.
SLACK_S = 0.2
_STOP = "test:monitor:stop"


def most_in_any_window(times: list[float], window_s: float) -> int:
    times = sorted(times)
    return max(sum(1 for t in times[i:] if t < s + window_s) for i, s in enumerate(times))


class Admissions:
    """Every start the limiter let through, as Redis saw it: MONITOR shows the one SET of each
    successful WindowRateLimiter acquire (a refused one writes nothing, and a transaction
    aborted by WATCH runs none of its commands), with the server's time."""

    def __init__(self, server: RedisServer) -> None:
        self.client = redis.Redis(port=server.port, decode_responses=True)
        self.times: list[float] = []
        # Entering the monitor waits for MONITOR's OK: it is on before the first job is sent.
        self._feed = self.client.monitor().__enter__()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        try:
            for command in self._feed.listen():
                text = command["command"]
                if _STOP in text:
                    return
                if text.startswith("SET ") and ":rate@" in text:
                    self.times.append(float(command["time"]))
        finally:
            self._feed.__exit__(None, None, None)

    def stop(self) -> list[float]:
        self.client.get(_STOP)
        self._thread.join(10)
        self.client.close()
        return self.times


def test_four_workers_never_start_more_than_n_in_any_window_and_drop_nothing(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    env = queue_env(redis_server)
    for _ in range(4):
        start_worker(workers, env, "--threads", "4")
    admissions = Admissions(redis_server)
    p = producer(redis_server)
    for n in range(JOBS):
        p.send("q-rated", {"n": n})
    p.close()
    wait_for(lambda: len(effects(r, "ran")) == JOBS, 120, "every job to run")
    wait_for(lambda: unacked(r) == 0 and stats(r, "q-rated").delayed == 0, 30, "the queue")
    admitted = admissions.stop()
    ran = effects(r, "ran")
    assert sorted(e["payload"]["n"] for e in ran) == list(range(JOBS)), "each exactly once"
    assert len({e["holder"] for e in ran}) > 1, "the workers shared the work"
    assert len(admitted) == JOBS
    assert most_in_any_window(admitted, WINDOW_S) <= LIMIT
    assert most_in_any_window([e["at"] for e in ran], WINDOW_S - SLACK_S) <= LIMIT
    # Nothing failed into the dead letters; the ones held back went back with a delay.
    row = stats(r, "q-rated")
    assert (row.ready, row.in_flight, row.delayed, row.dead) == (0, 0, 0, 0)
    held_back = [e for w in workers for e in w.events("rate_limited")]
    assert held_back, "24 jobs on 16 threads at 4 a second: some had to wait"
    assert not [e for w in workers for e in w.events("retry_scheduled")]


def test_jobs_of_slots_count_their_start_once_they_hold_the_lease(
    redis_server: RedisServer, r: redis.Redis, workers: list[WorkerProc]
) -> None:
    # allow-other-slots, 2 starts a second: each job takes its slot's lease, and one held back
    # releases it before going back to the queue, so that it runs later under a new fence.
    options = {"overlap": "allow-other-slots", "rate_limit": "2/1s"}
    slots = [1_700_000_000 + 60 * n for n in range(8)]
    for worker in range(2):
        start_worker(workers, queue_env(redis_server), "--threads", "4", holder=f"w{worker}-")
    admissions = Admissions(redis_server)
    for slot in slots:
        send_slot(r, "q-slot", slot, payload={"seconds": 0.05}, options=options)
    wait_for(lambda: len(effects(r, "ran")) == len(slots), 60, "every slot to run")
    wait_for(lambda: unacked(r) == 0 and stats(r, "q-slot").delayed == 0, 30, "the queue")
    admitted = admissions.stop()
    assert sorted(e["slot"] for e in effects(r, "ran")) == slots, "each slot exactly once"
    assert len(admitted) == len(slots)
    assert most_in_any_window(admitted, 1.0) <= 2
    assert [e for w in workers for e in w.events("rate_limited")]
    entries = cast(list[tuple[str, dict[str, str]]], r.xrange(KEYS.runs))
    outcomes = [fields["outcome"] for _, fields in entries]
    assert outcomes == ["ran"] * len(slots), "held back is not a run: nothing recorded for it"
    assert not list(r.scan_iter(f"{KEYS.lease}*"))


def test_the_cronjobs_rate_limit_rides_in_the_message_and_wins_over_the_tasks() -> None:
    qs = load_queue_settings(load_settings({}), {"CRON_RUNNER_RATE_LIMIT": "10/1m"})
    assert qs.overrides.rate_limit == RateLimit(10, 60)
    options = message_options(qs.overrides)
    assert options == {"rate_limit": "10/60s"}
    spec = TaskSpec("q-rated", rated, "test")
    assert job_policy(options, spec).rate_limit == RateLimit(10, 60)
    assert job_policy({}, spec).rate_limit == RateLimit(4, 1)

    overlap = message_options(qs.overrides, overlap="buffer-one", overlap_wait_s=90)
    assert overlap == {"rate_limit": "10/60s", "overlap": "buffer-one", "overlap_wait": 90_000}
    assert job_policy(overlap, spec)[:2] == ("buffer-one", 90.0)
    # skip, the default, adds nothing: a default task's message is what it was.
    assert message_options(qs.overrides, overlap="skip", overlap_wait_s=90) == options
    with pytest.raises(ConfigError, match="upgrade the workers"):
        job_policy({"overlap": "buffer-all"}, spec)


@pytest.mark.parametrize(
    ("text", "rate"),
    [("10/1m", RateLimit(10, 60)), ("1/1s", RateLimit(1, 1)), (" 5 / 30s ", RateLimit(5, 30)),
     ("100/1h", RateLimit(100, 3600)), ("7/90", RateLimit(7, 90)),
     ("1000000/1s", RateLimit(1_000_000, 1))],
)  # fmt: skip
def test_parse_rate_limit(text: str, rate: RateLimit) -> None:
    assert parse_rate_limit(text, "X") == rate
    assert parse_rate_limit(str(rate), "X") == rate


@pytest.mark.parametrize(
    "text",
    ["", "10", "10/", "/1m", "0/1m", "-1/1m", "ten/1m", "10/soon", "10/500ms", "10/1.5s",
     "10/2h", "10 per minute", "1000001/1s", "²/1s", "10/1m/2"],
)  # fmt: skip
def test_parse_rate_limit_refuses(text: str) -> None:
    with pytest.raises(ConfigError, match=r"X=.* is not valid: expected N/DURATION"):
        parse_rate_limit(text, "X")


def test_task_rate_limit_refused() -> None:
    with pytest.raises(ConfigError, match=r"task 'report': rate_limit='0/1m' is not valid"):
        task("report", rate_limit="0/1m")

    @task("report", rate_limit="3/10s")
    def report(ctx: RunContext) -> None: ...

    assert job_policy({}, TaskSpec("report", report, "test")).rate_limit == RateLimit(3, 10)


def test_delay_grows_to_the_window_with_jitter() -> None:
    rate = RateLimit(10, 60)
    first = [delay_ms(rate, 0) for _ in range(50)]
    assert all(500 <= d <= 1000 for d in first) and len(set(first)) > 1
    assert all(61_000 <= delay_ms(rate, 12) <= 122_000 for _ in range(20))


@pytest.mark.parametrize(
    ("value", "says"),
    [("ten/1m", "CRON_RUNNER_RATE_LIMIT='ten/1m' is not valid: expected N/DURATION"),
     ("10/500ms", "CRON_RUNNER_RATE_LIMIT='10/500ms' is not valid: expected N/DURATION")],
)  # fmt: skip
def test_a_bad_rate_limit_exits_78_before_the_lease(
    redis_server: RedisServer, value: str, says: str
) -> None:
    env = queue_env(redis_server, CRON_RUNNER_MODE="enqueue", CRON_RUNNER_RATE_LIMIT=value)
    done = cli(env, "run", "q-ok")
    assert (done.returncode, "Traceback" in done.stderr) == (78, False), done.stderr
    assert says in done.stderr
    assert "whole seconds from 1s to 1h" in done.stderr
    assert not events(done.stderr) or outcome(done.stderr) is None


def test_a_worker_refuses_a_task_with_a_bad_rate_limit(
    redis_server: RedisServer, tmp_path: Any
) -> None:
    (tmp_path / "bad_rate_tasks.py").write_text(
        "from runner import RunContext, task\n\n"
        "@task('limited', rate_limit='5 a minute')\n"
        "def limited(ctx: RunContext) -> None: ...\n"
    )
    env = queue_env(redis_server, CRON_RUNNER_TASK_MODULES="bad_rate_tasks")
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    done = cli(env, "worker")
    assert (done.returncode, "Traceback" in done.stderr) == (78, False), done.stderr
    assert (
        "task 'limited': rate_limit='5 a minute' is not valid: expected N/DURATION" in done.stderr
    )
