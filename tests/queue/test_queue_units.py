"""Queue-mode pieces without a worker: settings, message ids, task options, size limits."""

from __future__ import annotations

from typing import Any

import pytest

from runner.config.queue import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MIN_BACKOFF_S,
    QueueSettings,
    load_queue_settings,
    parse_size,
)
from runner.config.settings import load_settings
from runner.errors import ConfigError
from runner.queue.messages import MessageTooLarge, build_message, message_id_for
from runner.queue.options import effective_options, message_options
from runner.tasks import QueueOptions, RunContext, TaskSpec, queue_options, task


@pytest.mark.parametrize(
    ("text", "size"),
    [("65536", 65536), ("64KiB", 65536), ("64k", 65536), ("1MiB", 1 << 20), ("2 mb", 2 << 20),
     ("1024", 1024)],
)  # fmt: skip
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text, "X") == size


@pytest.mark.parametrize(
    "text",
    ["", "lots", "-1", "1.5KiB", "64 GiB", "1023", "²", "\u0661\u0662KiB", "513MiB", "9" * 5000],
)
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ConfigError, match="X="):
        parse_size(text, "X")


def test_queue_settings_defaults_and_overrides() -> None:
    settings = load_settings({"CRON_RUNNER_SCOPE": "billing", "CRON_RUNNER_KEY_PREFIX": "acme"})
    qs = load_queue_settings(settings, {})
    assert qs == QueueSettings(namespace="acme:queue:billing")
    assert qs.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES == 64 * 1024
    env = {
        "CRON_RUNNER_MAX_MESSAGE_SIZE": "1MiB",
        "CRON_RUNNER_WORKER_QUEUES": "reports, billing",
        "CRON_RUNNER_WORKER_THREADS": "4",
        "CRON_RUNNER_WORKER_PROCESSES": "2",
        "CRON_RUNNER_QUEUE_HEARTBEAT_TIMEOUT": "15s",
        "CRON_RUNNER_QUEUE_MAINTENANCE_CHANCE": "0.01",
        "CRON_RUNNER_QUEUE_DEAD_MESSAGE_TTL": "24h",
    }
    qs = load_queue_settings(settings, env, {"WORKER_THREADS": "16"})
    assert qs.max_message_bytes == 1 << 20
    assert qs.queues == ("reports", "billing")
    assert (qs.processes, qs.threads) == (2, 16)
    assert qs.heartbeat_timeout_ms == 15000
    assert qs.maintenance_per_million == 10_000
    assert qs.dead_message_ttl_ms == 24 * 3600 * 1000


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"CRON_RUNNER_WORKER_THREADS": "0"}, "CRON_RUNNER_WORKER_THREADS='0' is not valid"),
        ({"CRON_RUNNER_WORKER_PROCESSES": "two"}, "CRON_RUNNER_WORKER_PROCESSES='two'"),
        ({"CRON_RUNNER_WORKER_THREADS": "²"}, "THREADS='²' is not valid: expected a whole number"),
        ({"CRON_RUNNER_WORKER_PROCESSES": "9" * 5000}, "expected a whole number from 1 to 256"),
        ({"CRON_RUNNER_WORKER_THREADS": "1025"}, "expected a whole number from 1 to 1024"),
        ({"CRON_RUNNER_MAX_MESSAGE_SIZE": "9" * 5000}, "SIZE='9999.*' is too large"),
        ({"CRON_RUNNER_WORKER_QUEUES": "9lives"}, "queue '9lives' is not valid"),
        ({"CRON_RUNNER_QUEUE_MAINTENANCE_CHANCE": "2"}, "expected a probability"),
        ({"CRON_RUNNER_QUEUE_HEARTBEAT_TIMEOUT": "100ms"}, "too small"),
    ],
)
def test_queue_settings_refuse_bad_values(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_queue_settings(load_settings({}), env)


def test_the_cronjobs_own_queue_options() -> None:
    env = {
        "CRON_RUNNER_QUEUE": "billing",
        "CRON_RUNNER_RETRIES_MAX": "0",
        "CRON_RUNNER_RETRIES_MIN_BACKOFF": "500ms",
        "CRON_RUNNER_RETRIES_MAX_BACKOFF": "2m",
        "CRON_RUNNER_TIME_LIMIT": "15m",
    }
    overrides = load_queue_settings(load_settings({}), env).overrides
    assert overrides == QueueOptions("billing", 0, 0.5, 120.0, 900.0)
    assert message_options(overrides) == {
        "max_retries": 0, "min_backoff": 500, "max_backoff": 120_000, "time_limit": 900_000,
    }  # fmt: skip
    assert load_queue_settings(load_settings({}), {}).overrides == QueueOptions()
    assert message_options(QueueOptions()) == {}

    @task("report", queue="reports", retries=5, max_backoff="10m")
    def report(ctx: RunContext) -> None: ...

    spec = TaskSpec("report", report, "test")
    assert effective_options(spec, QueueOptions()) == QueueOptions(
        "reports", 5, DEFAULT_MIN_BACKOFF_S, 600.0, None
    )
    assert effective_options(spec, QueueOptions(None, 1, None, None, 30.0)) == QueueOptions(
        "reports", 1, DEFAULT_MIN_BACKOFF_S, 600.0, 30.0
    )


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"CRON_RUNNER_QUEUE": "a b"}, "CRON_RUNNER_QUEUE='a b' is not a queue name"),
        ({"CRON_RUNNER_RETRIES_MAX": "²"}, "CRON_RUNNER_RETRIES_MAX='²' is not valid"),
        ({"CRON_RUNNER_RETRIES_MAX": "9" * 5000}, "expected a whole number from 0 to"),
        ({"CRON_RUNNER_TIME_LIMIT": "0"}, "CRON_RUNNER_TIME_LIMIT='0' is too small"),
        ({"CRON_RUNNER_RETRIES_MIN_BACKOFF": "9" * 400}, "too large"),
        ({"CRON_RUNNER_RETRIES_MIN_BACKOFF": "1m", "CRON_RUNNER_RETRIES_MAX_BACKOFF": "1s"},
         "CRON_RUNNER_RETRIES_MIN_BACKOFF is above CRON_RUNNER_RETRIES_MAX_BACKOFF"),
    ],
)  # fmt: skip
def test_the_cronjobs_own_queue_options_refused(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_queue_settings(load_settings({}), env)


def test_message_id_is_per_task_and_slot() -> None:
    one = message_id_for("default", "report", 1_700_000_000, fence=7)
    assert one == message_id_for("default", "report", 1_700_000_000, fence=8)
    assert one != message_id_for("default", "report", 1_700_000_060, fence=7)
    assert one != message_id_for("default", "other", 1_700_000_000, fence=7)
    assert one != message_id_for("billing", "report", 1_700_000_000, fence=7)
    # Manual runs have no slot: one id per acquisition.
    assert message_id_for("default", "report", None, 1) != message_id_for(
        "default", "report", None, 2
    )


def test_task_queue_options() -> None:
    @task("report", queue="reports", retries=5, min_backoff="2s", max_backoff="10m",
          time_limit=90)  # fmt: skip
    def report(ctx: RunContext) -> None: ...

    def plain(ctx: RunContext) -> None: ...

    assert queue_options(report) == QueueOptions("reports", 5, 2.0, 600.0, 90.0)
    assert queue_options(plain) == QueueOptions()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"queue": "9-lives"}, "queue='9-lives' is not valid"),
        ({"retries": -1}, "retries=-1 must be 0 or more"),
        ({"min_backoff": "1m", "max_backoff": "1s"}, "min_backoff is above max_backoff"),
        ({"time_limit": "soon"}, "is not a duration"),
        ({"time_limit": 0}, "must be positive"),
    ],
)
def test_task_queue_options_refused(options: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        task("report", **options)


def test_message_size_limit_counts_the_encoded_message() -> None:
    small = build_message("report", "report", slot=1, fence=1, payload={"id": 1},
                          message_id=None, limit_bytes=1024)  # fmt: skip
    assert small.kwargs == {"slot": 1, "fence": 1, "payload": {"id": 1}}
    with pytest.raises(MessageTooLarge) as info:
        build_message("report", "report", slot=1, fence=1, payload={"blob": "x" * 2000},
                      message_id=None, limit_bytes=1024)  # fmt: skip
    assert info.value.exit_code == 78
    assert info.value.limit == 1024 and info.value.size > 2000
