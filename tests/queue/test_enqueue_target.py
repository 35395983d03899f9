"""The enqueue target in process, against a real Redis: it sends once per slot, and a send
that hangs is stopped by kill() instead of leaving the run to abandon a Python thread."""

from __future__ import annotations

import json
from typing import cast

import redis

from runner import clock
from runner.config.queue import QueueSettings
from runner.config.settings import Settings, load_settings
from runner.keys import TaskKeys
from runner.logs import run_logger
from runner.queue.enqueue import EnqueueTarget
from runner.queue.messages import message_id_for, sent_key
from runner.run.targets import PythonTarget, Target
from runner.tasks import RunContext, TaskSpec, task
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


def test_the_message_names_the_run_and_carries_its_overlap_policy(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    """The worker takes the lease of the run's name under the CronJob's policy: both ride in
    the message, and buffer-one's wait defaults to the schedule's shortest gap."""
    settings = load_settings({"CRON_RUNNER_REDIS_URL": redis_server.url,
                              "CRON_RUNNER_SCHEDULE": "*/5 * * * *"})  # fmt: skip
    qs = QueueSettings(namespace="cron-runner:queue:default", overlap="buffer-one")
    target = EnqueueTarget(settings, qs, TaskSpec("report", report, "test"), retention_s=3600)
    ctx = _ctx()
    ctx.task = "nightly-report"  # run report --name nightly-report
    target.start(ctx)
    wait_for(lambda: target.poll(0.1), 10)
    assert (target.exit_code(), target.error()) == (0, None)
    (raw,) = cast(list[str], r.hvals("cron-runner:queue:default:report.msgs"))
    message = json.loads(raw)
    assert message["actor_name"] == "report"
    assert message["kwargs"] == {"slot": SLOT, "fence": 7, "payload": {}, "name": "nightly-report"}
    assert message["options"]["overlap"] == "buffer-one"
    assert message["options"]["overlap_wait"] == 300_000
