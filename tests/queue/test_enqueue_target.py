"""The enqueue target in process, against a real Redis: it sends once per slot, and a send
that hangs is stopped by kill() instead of leaving the run to abandon a Python thread."""

from __future__ import annotations

import json
from typing import Any, cast

import redis

from runner import clock
from runner.cli.main import with_task_options
from runner.config.queue import QueueSettings
from runner.config.settings import Settings, load_settings
from runner.keys import TaskKeys
from runner.logs import run_logger
from runner.queue.enqueue import EnqueueTarget
from runner.queue.messages import message_id_for, sent_key
from runner.run.targets import PythonTarget, Target
from runner.tasks import RunContext, RunOptions, TaskSpec, run_options, task
from runner.testing import RedisServer
from tests.helpers.tcpproxy import TcpProxy
from tests.helpers.wait import wait_for

SLOT = 1_767_261_600


@task("report")
def report(ctx: RunContext) -> None: ...


def _target(settings: Settings) -> EnqueueTarget:
    qs = QueueSettings(namespace=f"{settings.lease.prefix}:queue:{settings.lease.scope}")
    return EnqueueTarget(settings, qs, TaskSpec("report", report, "test"), retention_s=3600)


def _ctx(fence: int = 7) -> RunContext:
    return RunContext(task="report", slot=SLOT, fencing_token=fence, holder="pod-1",
                      logger=run_logger("report", "pod-1"))  # fmt: skip


def test_sends_the_slots_message_once(redis_server: RedisServer, r: redis.Redis) -> None:
    settings = load_settings({"CRON_RUNNER_REDIS_URL": redis_server.url})
    first: Target = _target(settings)
    assert not isinstance(first, PythonTarget)
    first.start(_ctx())
    wait_for(lambda: first.poll(0.1), 10)
    assert (first.exit_code(), first.error()) == (0, None)
    message_id = message_id_for("default", "report", SLOT, 7)
    assert r.get(sent_key(TaskKeys("cron-runner", "default", "report"), message_id))
    assert r.llen("cron-runner:queue:default:report") == 1

    again = _target(settings)
    again.start(_ctx(fence=8))  # a retried Job of the same slot: the message is not sent again
    wait_for(lambda: again.poll(0.1), 10)
    assert (again.exit_code(), again.error()) == (0, None)
    assert r.llen("cron-runner:queue:default:report") == 1


def test_a_hung_send_is_killed_not_abandoned(redis_server: RedisServer) -> None:
    with TcpProxy(redis_server.port) as proxy:
        proxy.blackhole()  # the connection opens, and no answer ever comes
        settings = load_settings({"CRON_RUNNER_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0",
                                  "CRON_RUNNER_CONNECT_TIMEOUT": "60s"})  # fmt: skip
        target = _target(settings)
        target.start(_ctx())
        assert not target.poll(1.0)
        killed_at = clock.monotonic()
        assert target.kill()
        wait_for(lambda: target.poll(0.05), 30)
        # Not after the 5 s socket timeout the send was waiting out: its connection was cut.
        assert clock.monotonic() - killed_at < 4.0
        assert target.exit_code() == 1
        assert (target.error() or "").startswith("Terminated: enqueue: stopped")


def _sent(r: redis.Redis, settings: Settings, spec: TaskSpec, run_name: str) -> dict[str, Any]:
    """Send the slot's message as ``run TASK --name run_name`` does; the message as stored."""
    qs = QueueSettings(namespace="cron-runner:queue:default")
    target = EnqueueTarget(settings, qs, spec, retention_s=3600)
    ctx = _ctx()
    ctx.task = run_name
    target.start(ctx)
    wait_for(lambda: target.poll(0.1), 10)
    assert (target.exit_code(), target.error()) == (0, None)
    raws = cast(list[str], r.hvals(f"cron-runner:queue:default:{spec.name}.msgs"))
    (message,) = [m for m in map(json.loads, raws) if m["kwargs"]["name"] == run_name]
    return cast(dict[str, Any], message)


@task("tidy", overlap="replace", overlap_wait="45s")
def tidy(ctx: RunContext) -> None: ...


def test_the_message_names_the_run_and_carries_its_overlap_policy(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    """The worker takes the lease of the run's name under the run's own policy (flag, variable,
    else @task's): both ride in the message; buffer-one's wait defaults to the schedule's
    shortest gap, replace's to the worker's own."""
    env = {"CRON_RUNNER_REDIS_URL": redis_server.url, "CRON_RUNNER_SCHEDULE": "*/5 * * * *"}
    settings = load_settings({**env, "CRON_RUNNER_OVERLAP": "buffer-one"})
    message = _sent(r, settings, TaskSpec("report", report, "test"), "nightly-report")
    assert message["actor_name"] == "report"
    assert message["kwargs"] == {"slot": SLOT, "fence": 7, "payload": {}, "name": "nightly-report"}
    assert (message["options"]["overlap"], message["options"]["overlap_wait"]) == (
        "buffer-one", 300_000,
    )  # fmt: skip

    # @task(overlap=, overlap_wait=), as `run tidy` reads them where no flag or variable did.
    spec = TaskSpec("tidy", tidy, "test")
    settings = with_task_options(load_settings(env), run_options(tidy))
    options = _sent(r, settings, spec, "tidy")["options"]
    assert (options["overlap"], options["overlap_wait"]) == ("replace", 45_000)
    options = _sent(r, with_task_options(load_settings({**env, "CRON_RUNNER_OVERLAP": "replace"}),
                                         RunOptions()), spec, "tidy-2")["options"]  # fmt: skip
    assert options["overlap"] == "replace" and "overlap_wait" not in options
    # And the pause after consecutive failures, which the workers' failures count towards.
    settings = load_settings({**env, "CRON_RUNNER_PAUSE_ON_FAILURES": "3"})
    options = _sent(r, settings, spec, "tidy-3")["options"]
    assert (options["pause_on_failures"], "overlap" in options) == (3, False)
