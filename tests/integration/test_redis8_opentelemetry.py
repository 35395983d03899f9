"""redis-py 8 imports OpenTelemetry at ``import redis`` whenever it is installed: a run with
telemetry off must not pay for it, and telemetry, ours or redis-py's own, must still work.

Runs the CLI under .venv-redis8 (redis-py 8.1.0 and the telemetry extra; ``make test`` builds
it with ``make venv-redis8``). It is not optional: plain ``pip install redis-cron-runner``
resolves redis-py 8.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.testing import RedisServer
from tests.helpers.otlp import OtlpReceiver
from tests.helpers.proc import ROOT, events, outcome, runner_env

VENV = ROOT / ".venv-redis8"

_IMPORTS = """
import json, sys
from runner.cli.main import main
code = main(sys.argv[1:])
otel = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
print(json.dumps({"code": code, "otel": otel}))
"""


@pytest.fixture(scope="module")
def python() -> str:
    binary = VENV / "bin" / "python"
    assert binary.exists(), f"{VENV} is missing: `make venv-redis8` builds it (`make test` does)"
    version = subprocess.run(
        [binary, "-c", "import redis; print(redis.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert version.startswith("8."), f"{VENV} has redis-py {version}, not 8.x: rebuild it"
    return str(binary)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


def _probe(python: str, args: list[str], env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [python, "-c", _IMPORTS, *args], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_import_redis_alone_pulls_opentelemetry_in(python: str) -> None:
    """The control: what the runner guards against is there in this environment."""
    done = subprocess.run(
        [python, "-c", "import sys, redis; print(sum(m.startswith('opentelemetry') for m in sys.modules))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert int(done.stdout) > 10


@pytest.mark.parametrize(
    "args", [["exec", "--name", "r8-exec", "--", "true"], ["run", "ok", "--name", "r8-run"]]
)
def test_a_run_with_telemetry_off_imports_no_opentelemetry(
    python: str, redis_server: RedisServer, args: list[str]
) -> None:
    assert _probe(python, args, runner_env(redis_server.url)) == {"code": 0, "otel": []}


def test_telemetry_on_still_exports_its_spans_and_metrics(
    python: str, redis_server: RedisServer, receiver: OtlpReceiver
) -> None:
    env = runner_env(redis_server.url, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
    done = subprocess.run(
        [str(Path(python).parent / "cron-runner"), "exec", "--name", "r8-otel", "--", "true"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, outcome(done.stderr)) == (0, "ran"), done.stderr
    assert not [e for e in events(done.stderr) if e.get("event") == "telemetry_unavailable"]
    assert {"connect", "acquire", "task", "complete"} <= {s.name for s in receiver.spans()}
    assert "cron_runner.runs" in {p.metric for p in receiver.points()}


_REDIS_METRICS = """
import json, sys
from runner.cli.main import _import_redis_without_opentelemetry
_import_redis_without_opentelemetry()
assert not [m for m in sys.modules if m.startswith("opentelemetry")]
import redis
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis.observability.config import MetricGroup, OTelConfig
from redis.observability.providers import get_observability_instance
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
get_observability_instance().init(OTelConfig(metric_groups=[MetricGroup.COMMAND]))
redis.Redis.from_url(sys.argv[1]).ping()
data = reader.get_metrics_data()
print(json.dumps(sorted({m.name for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics})))
"""


def test_a_task_can_still_turn_redis_pys_own_metrics_on(
    python: str, redis_server: RedisServer
) -> None:
    """After the run's import of redis-py, a task that sets up OpenTelemetry and redis-py's
    metrics gets them, as it would without the runner."""
    done = subprocess.run(
        [python, "-c", _REDIS_METRICS, redis_server.url],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "db.client.operation.duration" in json.loads(done.stdout)
