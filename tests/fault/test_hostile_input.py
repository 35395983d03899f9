"""Fault matrix row 9: bad and hostile input. Settings from arbitrary environment values, and
task names and keys (huge, unicode, braces that would break the hash tag, control characters,
lone surrogates as os.environ holds undecodable bytes): either accepted and safe, or refused
with ConfigError (exit 78). Never another exception, never a traceback."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from runner.config.queue import (
    MAX_MESSAGE_BYTES_LIMIT,
    MAX_PROCESSES,
    MAX_THREADS,
    load_queue_settings,
)
from runner.config.settings import load_settings
from runner.errors import ConfigError, UnknownTask
from runner.keys import TaskKeys
from runner.lease import store
from runner.queue.options import message_options
from runner.schedule.markers import resolve_slot, retention_s, stale_slot_reason
from runner.tasks import Registry, RunContext, task
from tests.fault.conftest import Figure
from tests.helpers.proc import CRON_RUNNER, runner_env

VARIABLES = [
    "REDIS_URL", "REDIS_USERNAME", "REDIS_PASSWORD", "REDIS_TLS_CA_FILE", "REDIS_TLS_CERT_FILE",
    "REDIS_TLS_KEY_FILE", "REDIS_SENTINELS", "REDIS_SENTINEL_MASTER", "REDIS_SENTINEL_PASSWORD",
    "REDIS_PASSWORD_FILE", "REDIS_SENTINEL_PASSWORD_FILE", "TASK_SHARES_CREDENTIALS",
    "TELEMETRY_FLUSH_TIMEOUT",
    "REDIS_CLUSTER", "REDIS_MIN_REPLICAS", "KEY_PREFIX", "LEASE_TTL", "CONNECT_TIMEOUT",
    "SKEW_TOLERANCE", "SLOT_RETENTION", "SHUTDOWN_GRACE", "TASK_MODULES", "MODE", "SCHEDULE",
    "TIMEZONE", "JOB_NAME", "CRONJOB_NAME", "SCHEDULED_TIMESTAMP", "HOLDER", "SCOPE", "LOG_FORMAT", "LOG_LEVEL",
    "PAUSE_ON_FAILURES",
    # Queue mode (runner/config/queue.py), read by `worker`, `dlq` and an enqueue-mode `run`.
    "MAX_MESSAGE_SIZE", "WORKER_QUEUES", "WORKER_PROCESSES", "WORKER_THREADS",
    "WORKER_POLL_INTERVAL", "QUEUE_HEARTBEAT_TIMEOUT", "QUEUE_MAINTENANCE_CHANCE",
    "QUEUE_DEAD_MESSAGE_TTL", "QUEUE", "RETRIES_MAX", "RETRIES_MIN_BACKOFF",
    "RETRIES_MAX_BACKOFF", "TIME_LIMIT", "RATE_LIMIT",
]  # fmt: skip

# Values a fuzzer rarely finds on its own: the edges of each parser.
EDGES = [
    "", " ", "0", "-1", "1e400", "9" * 400, "9" * 5000, "0.0001", "1ms", "500ms", "1h", "nan",
    "inf", "²", "١٢", "true", "TRUE", "yes", "maybe", "redis://", "redis://h:0/0",
    "redis://h:99999/0", "redis://[::1", "redis://[::1]:6379/0", "redis://h/0?socket_timeout=x",
    "redis://h:6379/x", "rediss://h", "unix://", "unix:///tmp/s.sock", "http://h",
    "redis://u:p@h:1/2", "a:1,b:2", "a:x", ":1", "h:", "h:1,,", "* * * * *", "61 * * * *",
    "*/5 * * * *", "@hourly", "0 0 31 2 *", "UTC", "Europe/Berlin", "../../etc/passwd",
    "/etc/passwd", "Etc/GMT+99", "{x}", "a{b}c", "a}b{", "x" * 300, "é", "任务", "a\nb",
    "a\tb", "\udcff", "a\udc80b", "report-29000000", "report-", "-", "run", "enqueue",
]  # fmt: skip

hostile_text = st.one_of(
    st.sampled_from(EDGES),
    st.text(st.characters(exclude_characters="\x00"), max_size=80),
    st.text(st.characters(codec="ascii", exclude_characters="\x00"), max_size=12),
)


def _safe_to_use(env: dict[str, str]) -> None:
    """What the CLI does with settings before a run, everything but the network: each step
    either works or raises ConfigError."""
    try:
        s = load_settings(env)
        qs = load_queue_settings(s, env)
        assert 0 < qs.max_message_bytes <= MAX_MESSAGE_BYTES_LIMIT
        assert 0 < qs.processes <= MAX_PROCESSES and 0 < qs.threads <= MAX_THREADS
        assert all(isinstance(v, int) and v > 0 for k, v in message_options(qs.overrides).items()
                   if k not in ("max_retries", "rate_limit"))  # fmt: skip
        assert s.lease.ttl_ms > 0
        assert urlsplit(s.redis.display_url).password is None
        TaskKeys(s.lease.prefix, s.lease.scope, "task").all_keys()
        retention_s(s)
        stale_slot_reason(s, resolve_slot(s, time.time()), time.time())
        if not s.redis.cluster:  # Cluster's client reads the slot table at once: that is I/O
            store.connect(s.redis, s.lease.ttl_s).close()
    except ConfigError:
        return


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(VARIABLES), hostile_text, max_size=6))
@example({"LEASE_TTL": "9" * 400})
@example({"REDIS_MIN_REPLICAS": "²"})
@example({"WORKER_THREADS": "²"})
@example({"WORKER_PROCESSES": "9" * 5000})
@example({"MAX_MESSAGE_SIZE": "9" * 5000})
@example({"RETRIES_MAX": "²", "TIME_LIMIT": "9" * 400})
@example({"REDIS_URL": "redis://[::1"})
@example({"REDIS_URL": "redis://h/0?socket_timeout=x"})
@example({"SCHEDULE": "* * * * *", "SKEW_TOLERANCE": "9" * 400})
@example({"TIMEZONE": "x" * 300})
@example({"SCHEDULED_TIMESTAMP": "0001-01-01T00:00:00+14:00", "JOB_NAME": "x-29579100"})
@example(
    {
        "SCHEDULE": "@every 1h",
        "JOB_NAME": "x-23667840",
        "SCHEDULED_TIMESTAMP": "2015-01-01T00:00:00Z",
    }
)
def test_row9_settings_from_any_environment_are_usable_or_a_config_error(
    values: dict[str, str],
) -> None:
    _safe_to_use({"CRON_RUNNER_" + k: v for k, v in values.items()})


def _noop(ctx: RunContext) -> None:
    del ctx


@settings(max_examples=400, deadline=None)
@given(hostile_text)
@example("x" * 100_000)
@example("{default:other}")
@example("a}{b")
def test_row9_task_names_are_refused_or_keep_one_hash_tag(name: str) -> None:
    try:
        keys = TaskKeys("cron-runner", "default", name)
    except ConfigError:
        # @task applies the rule the keys do: a name they refuse is never registered.
        with pytest.raises(ConfigError):
            task(name)
        return
    for key in keys.all_keys(1_700_000_000):
        assert key.count("{") == key.count("}") == 1
        assert len(key) < 200
    assert len({key_slot(k.encode()) for k in keys.all_keys(1_700_000_000)}) == 1
    # A name the keys take, @task takes too, and the registry finds that task by it, as given.
    fn = task(name)(_noop)
    registry = Registry()
    registry.add(name, fn, "test")
    assert registry.names() == [name]
    assert registry.resolve(name).fn is fn
    with pytest.raises(UnknownTask):
        Registry().resolve(name)


@pytest.mark.parametrize(
    "reference", ["..:x", ".:x", ":x", "x:", "-:x", "a b:c", "tests..sample_tasks:ok",
                  "tests.sample_tasks:nope", "tests.sample_tasks:", "\udcff:x"],
)  # fmt: skip
def test_row9_task_references_are_resolved_or_a_config_error(reference: str) -> None:
    with pytest.raises(ConfigError):
        Registry().resolve(reference)


CLI_CASES = {
    "huge name": (["exec", "--name", "x" * 100_000, "--", "true"], {}),
    "unicode name": (["exec", "--name", "任务", "--", "true"], {}),
    "braces": (["exec", "--name", "{default:other}", "--", "true"], {}),
    "newline": (["exec", "--name", "a\nb", "--", "true"], {}),
    "dash name": (["exec", "--name", "-x", "--", "true"], {}),
    "unknown task": (["run", "{x}"], {}),
    "bad reference": (["run", "..:x"], {}),
    "huge ttl": (["exec", "--name", "x", "--", "true"], {"CRON_RUNNER_LEASE_TTL": "9" * 400}),
    "superscript": (["exec", "--name", "x", "--", "true"], {"CRON_RUNNER_REDIS_MIN_REPLICAS": "²"}),
    "broken ipv6": (["exec", "--name", "x", "--", "true"], {"CRON_RUNNER_REDIS_URL": "redis://[::1"}),
    "url option": (["exec", "--name", "x", "--", "true"],
                   {"CRON_RUNNER_REDIS_URL": "redis://h/0?socket_timeout=x"}),
    "prefix braces": (["exec", "--name", "x", "--", "true"], {"CRON_RUNNER_KEY_PREFIX": "{p}"}),
    "long time zone": (["exec", "--name", "x", "--", "true"], {"CRON_RUNNER_TIMEZONE": "x" * 300}),
    "worker superscript": (["worker", "--threads", "²"], {}),
    "worker huge processes": (["worker", "--processes", "9" * 5000], {}),
    "worker huge size": (["worker"], {"CRON_RUNNER_MAX_MESSAGE_SIZE": "9" * 5000}),
    "enqueue superscript": (["run", "ok"], {"CRON_RUNNER_MODE": "enqueue",
                                            "CRON_RUNNER_WORKER_THREADS": "²"}),
    "dlq huge size": (["dlq", "list", "ok"], {"CRON_RUNNER_MAX_MESSAGE_SIZE": "9" * 5000}),
    "enqueue bad retries": (["run", "ok"], {"CRON_RUNNER_MODE": "enqueue",
                                            "CRON_RUNNER_RETRIES_MAX": "9" * 5000}),
    "enqueue bad queue": (["run", "ok"], {"CRON_RUNNER_MODE": "enqueue",
                                          "CRON_RUNNER_QUEUE": "{x}"}),
}  # fmt: skip


def test_row9_hostile_input_through_the_cli_exits_78_or_64_without_a_traceback(
    tmp_path: Path, figure: Figure
) -> None:
    codes = {}
    for case, (args, extra) in CLI_CASES.items():
        env = runner_env("redis://127.0.0.1:1/0", CRON_RUNNER_CONNECT_TIMEOUT="200ms", **extra)
        res = subprocess.run([CRON_RUNNER, *args], env=env, capture_output=True, text=True,
                             timeout=60)  # fmt: skip
        assert "Traceback" not in res.stderr, (case, res.stderr)
        # A malformed command line is a usage error (64); a bad value, a configuration error.
        assert res.returncode in (64, 78), (case, res.stderr)
        codes[case] = res.returncode
    figure("9", duplicates=0, overlap_ms=0, generated_examples_max=800, explicit_examples=13,
           references=10, cli_cases=len(codes),
           exit_codes=sorted(set(codes.values())))  # fmt: skip
