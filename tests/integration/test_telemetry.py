"""OpenTelemetry through the real CLI, exported to a real OTLP/HTTP receiver, on real Redis."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.errors import StoreUnavailable
from runner.testing import RedisServer, free_port
from tests.helpers.otlp import HungCollector, OtlpReceiver, Point, ReceivedSpan
from tests.helpers.proc import (
    LEASE,
    ROOT,
    events,
    outcome,
    run,
    runner_env,
    side_effects,
    spawn_started,
)
from tests.helpers.wait import wait_for

TASKS = "tests.sample_tasks,tests.helpers.traced_tasks"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


def _env(redis_url: str, endpoint: str, **extra: str) -> dict[str, str]:
    return runner_env(
        redis_url, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, CRON_RUNNER_TASK_MODULES=TASKS, **extra
    )


def _by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    named = {s.name: s for s in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


def _points(rx: OtlpReceiver, metric: str) -> list[Point]:
    return [p for p in rx.points() if p.metric == metric]


def _runs_by_outcome(rx: OtlpReceiver) -> dict[str, float]:
    return {p.attributes["cron_runner.outcome"]: p.value for p in _points(rx, "cron_runner.runs")}


def test_a_run_exports_its_span_tree_attributes_and_metrics(
    redis_server: RedisServer, receiver: OtlpReceiver
) -> None:
    env = _env(
        redis_server.url,
        receiver.endpoint,
        CRON_RUNNER_SCHEDULE="0 0 * * *",
        CRON_RUNNER_HOLDER="pod-a",
        OTEL_SERVICE_NAME="billing-jobs",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
    )
    res = run(["run", "traced"], env)
    assert res.returncode == 0, res.stderr
    slot = next(e["slot"] for e in events(res.stderr) if e.get("event") == "start")
    fence = next(e["fence"] for e in events(res.stderr) if e.get("event") == "acquired")

    spans = _by_name(receiver.spans())
    assert set(spans) == {"run traced", "connect", "acquire", "task", "complete", "user-work"}
    root = spans["run traced"]
    assert root.parent_span_id == b""
    phases = ("connect", "acquire", "task", "complete")
    for child in phases:
        assert spans[child].parent_span_id == root.span_id, child
    # The phases follow one another: each ends before the next starts.
    for before, after in itertools.pairwise(phases):
        assert spans[before].end_ns <= spans[after].start_ns, (before, after)
    # The task's own span, made with the global tracer in the task's thread, nests under "task".
    assert spans["user-work"].parent_span_id == spans["task"].span_id
    assert spans["user-work"].attributes == {"user.fencing_token": fence}
    assert len({s.trace_id for s in spans.values()}) == 1
    assert root.attributes == {
        "cron_runner.task": "traced",
        "cron_runner.holder": "pod-a",
        "cron_runner.slot": slot,
        "cron_runner.fencing_token": fence,
        "cron_runner.outcome": "ran",
        "cron_runner.exit_code": 0,
    }
    assert root.resource["service.name"] == "billing-jobs"
    assert root.resource["deployment.environment"] == "test"

    assert _runs_by_outcome(receiver) == {"ran": 1}
    by_metric = {p.metric: p for p in receiver.points()}
    assert by_metric["cron_runner.run.duration"].count == 1
    assert by_metric["cron_runner.run.duration"].unit == "s"
    assert by_metric["cron_runner.lock.wait"].count == 1
    assert by_metric["cron_runner.lock.wait"].attributes["cron_runner.outcome"] == "ran"
    assert by_metric["cron_runner.lease.renewals"].value == 0  # a fast task: no renewal due
    assert by_metric["cron_runner.lease.renewals.failed"].value == 0
    # One export of each signal, at exit.
    assert sorted(receiver.paths) == ["/v1/metrics", "/v1/traces"]


def test_failed_and_skipped_runs(
    redis_server: RedisServer, r: redis.Redis, receiver: OtlpReceiver
) -> None:
    env = _env(redis_server.url, receiver.endpoint)
    failed = run(["exec", "--name", "seven", "--", "sh", "-c", "exit 7"], env)
    assert failed.returncode == 7
    spans = _by_name(receiver.spans())
    assert set(spans) == {"run seven", "connect", "acquire", "task", "release"}
    root = spans["run seven"]
    assert root.attributes["cron_runner.outcome"] == "failed"
    assert root.attributes["cron_runner.exit_code"] == 7
    assert "cron_runner.slot" not in root.attributes  # a manual run has no slot
    assert root.status_code == 2  # STATUS_CODE_ERROR
    assert _runs_by_outcome(receiver) == {"failed": 1}

    r.set(LEASE % "held", "other-pod:abcd", px=60_000)
    held = run(["exec", "--name", "held", "--", "true"], env)
    assert (held.returncode, outcome(held.stderr)) == (0, "skipped_held")
    scheduled = {**env, "CRON_RUNNER_SCHEDULE": "0 0 * * *"}
    assert run(["exec", "--name", "daily", "--", "true"], scheduled).returncode == 0
    done = run(["exec", "--name", "daily", "--", "true"], scheduled)
    assert (done.returncode, outcome(done.stderr)) == (0, "skipped_done")

    roots = [s for s in receiver.spans() if s.name.startswith("run ")]
    outcomes = sorted(s.attributes["cron_runner.outcome"] for s in roots)
    assert outcomes == ["failed", "ran", "skipped_done", "skipped_held"]
    for root in roots:
        children = {s.name for s in receiver.spans() if s.parent_span_id == root.span_id}
        if root.attributes["cron_runner.outcome"].startswith("skipped"):
            assert children == {"connect", "acquire"}
            assert "cron_runner.fencing_token" not in root.attributes
    waits = _points(receiver, "cron_runner.lock.wait")
    assert sorted(p.attributes["cron_runner.outcome"] for p in waits) == outcomes


def test_lease_lost_counts_renewals_and_the_failed_one(
    redis_server: RedisServer, r: redis.Redis, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    env = _env(
        redis_server.url,
        receiver.endpoint,
        SIDE_EFFECTS=str(effects),
        TASK_SECONDS="30",
        CRON_RUNNER_LEASE_TTL="1500ms",
    )
    proc = spawn_started(["run", "slow"], env, effects)
    wait_for(lambda: len(side_effects(effects, "step")) > 25, what="a renewal's worth of steps")
    r.set(LEASE % "slow", "thief:0000", px=60_000)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 75, stderr
    root = _by_name(receiver.spans())["run slow"]
    assert root.attributes["cron_runner.outcome"] == "lease_lost"
    assert root.attributes["cron_runner.exit_code"] == 75
    renewed = next(p for p in receiver.points() if p.metric == "cron_runner.lease.renewals")
    failed = next(p for p in receiver.points() if p.metric == "cron_runner.lease.renewals.failed")
    assert renewed.value >= 1
    assert failed.value == 1
    assert _runs_by_outcome(receiver) == {"lease_lost": 1}


def test_sigterm_still_delivers_telemetry(
    redis_server: RedisServer, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    env = _env(redis_server.url, receiver.endpoint, SIDE_EFFECTS=str(effects), TASK_SECONDS="30")
    proc = spawn_started(["run", "slow"], env, effects)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    spans = _by_name(receiver.spans())
    assert spans["run slow"].attributes["cron_runner.outcome"] == "terminated"
    assert {"connect", "acquire", "task", "release"} <= set(spans)
    assert _runs_by_outcome(receiver) == {"terminated": 1}


def test_redis_unreachable_is_an_unavailable_run(receiver: OtlpReceiver) -> None:
    env = _env(
        f"redis://127.0.0.1:{free_port()}/0", receiver.endpoint, CRON_RUNNER_CONNECT_TIMEOUT="300ms"
    )
    res = run(["exec", "--name", "nowhere", "--", "true"], env)
    assert res.returncode == 69
    spans = _by_name(receiver.spans())
    # Redis never answered: the run ended in its connect phase and tried no acquire.
    assert set(spans) == {"run nowhere", "connect"}
    assert spans["connect"].parent_span_id == spans["run nowhere"].span_id
    assert spans["connect"].status_code == 2
    assert "exception" in spans["connect"].events
    assert spans["run nowhere"].attributes["cron_runner.outcome"] == "unavailable"
    assert _runs_by_outcome(receiver) == {"unavailable": 1}
    # The lock wait counts the time spent connecting, even when that is all there was.
    waits = _points(receiver, "cron_runner.lock.wait")
    assert [p.attributes["cron_runner.outcome"] for p in waits] == ["unavailable"]


def test_refused_credentials_end_the_run_in_its_connect_phase(receiver: OtlpReceiver) -> None:
    with RedisServer(extra_args=["--requirepass", "right"]) as server:
        unknown = run(["run", "no-such-task"], _env(server.url, receiver.endpoint))
        assert unknown.returncode == 78
        assert receiver.spans() == []  # refused before the run: nothing to trace

        wrong = _env(server.url, receiver.endpoint, CRON_RUNNER_REDIS_PASSWORD="wrong")
        res = run(["exec", "--name", "refused", "--", "true"], wrong)
    assert res.returncode == 78, res.stderr
    spans = _by_name(receiver.spans())
    assert set(spans) == {"run refused", "connect"}
    assert spans["connect"].parent_span_id == spans["run refused"].span_id
    assert spans["connect"].status_code == 2
    assert spans["run refused"].attributes["cron_runner.exit_code"] == 78


@pytest.mark.parametrize("collector", ["hung", "refusing"])
def test_dead_collector_costs_at_most_the_flush_timeout(
    redis_server: RedisServer, collector: str
) -> None:
    with HungCollector() as hung:
        endpoint = hung.endpoint if collector == "hung" else f"http://127.0.0.1:{free_port()}"
        env = _env(
            redis_server.url,
            endpoint,
            CRON_RUNNER_TELEMETRY_FLUSH_TIMEOUT="1s",
            # Unbounded, the exporter would retry for this long.
            OTEL_EXPORTER_OTLP_TIMEOUT="60",
        )
        started = time.monotonic()
        res = run(["exec", "--name", "dead", "--", "sh", "-c", "exit 5"], env)
        elapsed_s = time.monotonic() - started
    assert res.returncode == 5, res.stderr
    assert outcome(res.stderr) == "failed"
    assert "telemetry_dropped" in [e.get("event") for e in events(res.stderr)]
    # The flush timeout is kept: 1 s plus process start and the run, far below the 60 s.
    assert elapsed_s < 1 + 20


# A whole run in one interpreter, then what it imported.
_IMPORTS = """
import json, sys
from runner.cli import main as cli
code = cli.main(["exec", "--name", "imports", "--", "true"])
otel = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
print(json.dumps({"code": code, "otel": otel}))
"""


def _modules_after_a_run(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_nothing_of_opentelemetry_is_imported_when_off(
    redis_server: RedisServer, receiver: OtlpReceiver
) -> None:
    off = _modules_after_a_run(runner_env(redis_server.url))
    assert off == {"code": 0, "otel": []}
    disabled = _modules_after_a_run(
        _env(redis_server.url, receiver.endpoint, OTEL_SDK_DISABLED="true")
    )
    assert disabled == {"code": 0, "otel": []}
    # The control: the same probe sees the SDK when an endpoint is set.
    on = _modules_after_a_run(_env(redis_server.url, receiver.endpoint))
    assert on["code"] == 0
    assert "opentelemetry.sdk.trace" in on["otel"]  # type: ignore[operator]


def test_only_the_signal_whose_endpoint_is_set_is_exported(
    redis_server: RedisServer, receiver: OtlpReceiver
) -> None:
    env = runner_env(
        redis_server.url, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{receiver.endpoint}/v1/traces"
    )
    assert run(["exec", "--name", "traces-only", "--", "true"], env).returncode == 0
    assert receiver.paths == ["/v1/traces"]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "'http/json' is not supported"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "opentelemetry-exporter-otlp-proto-grpc"),
    ],
)
def test_unusable_telemetry_settings_never_stop_a_run(
    redis_server: RedisServer, receiver: OtlpReceiver, extra: dict[str, str], named: str
) -> None:
    res = run(
        ["exec", "--name", "still-runs", "--", "true"],
        _env(redis_server.url, receiver.endpoint, **extra),
    )
    assert (res.returncode, outcome(res.stderr)) == (0, "ran")
    warnings = [e for e in events(res.stderr) if e.get("event") == "telemetry_unavailable"]
    assert warnings
    assert named in warnings[0]["msg"]
    assert receiver.paths == []


def test_missing_extra_is_a_warning_not_a_failure(
    redis_server: RedisServer, receiver: OtlpReceiver
) -> None:
    probe = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from runner.cli.main import main\n"
        "sys.exit(main(['exec', '--name', 'no-extra', '--', 'true']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=_env(redis_server.url, receiver.endpoint),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert outcome(done.stderr) == "ran"
    warning = next(e for e in events(done.stderr) if e.get("event") == "telemetry_unavailable")
    assert "redis-cron-runner[telemetry]" in warning["msg"]


def test_a_password_in_the_url_never_reaches_a_span(
    redis_server: RedisServer, receiver: OtlpReceiver
) -> None:
    """A run that fails on Redis records the error in its spans: the URL there is masked."""
    secret = "s3cr3t-in-the-query"
    for url in (f"redis://127.0.0.1:1/0?password={secret}",
                f"redis://:{secret}@127.0.0.1:1/0"):  # fmt: skip
        env = _env(url, receiver.endpoint, CRON_RUNNER_CONNECT_TIMEOUT="200ms")
        res = run(["exec", "--name", "masked", "--", "true"], env)
        assert res.returncode == StoreUnavailable.exit_code, res.stderr
    spans = receiver.spans()
    assert spans and any("unreachable" in s.text for s in spans)
    assert not [s.name for s in spans if secret in s.text]
