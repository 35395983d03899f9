"""/metrics, parsed with prometheus_client's own parser, against tasks in every state made by
real runs; the routes' status codes; serve with Redis down; serve stays off the runs' path."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from runner.serve.metrics import METRICS
from runner.testing import RedisServer, free_port
from tests.helpers.proc import ROOT, runner_env
from tests.serve.conftest import PAUSED_UNTIL_S, World, serving


def _samples(text: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _by_task(samples: dict[str, list[Any]], name: str) -> dict[str, float]:
    return {s.labels["task"]: s.value for s in samples.get(name, [])}


def test_metrics_of_every_state(world: World, tmp_path: Path) -> None:
    with serving(world.env, tmp_path / "serve.log") as served:
        status, text = served.get("/metrics")
    assert status == 200
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families == {name: kind for name, (kind, _) in METRICS.items()}
    m = _samples(text)
    assert m["cron_runner_up"][0].value == 1
    assert m["cron_runner_tasks"][0].value == 12

    runs = {
        (s.labels["task"], s.labels["outcome"]): s.value for s in m["cron_runner_task_runs_total"]
    }
    assert runs[("healthy", "ran")] == 1  # the second replica skipped: skips are not recorded
    assert runs[("failing", "failed")] == 2
    assert runs[("lost", "lease_lost")] == 1
    assert runs[("stopped", "terminated")] == 1
    assert runs[("alone", "unavailable")] == 1
    assert runs[("q-ok", "enqueued")] == 1 and runs[("q-ok", "ran")] == 1
    assert _by_task(m, "cron_runner_task_consecutive_failures")["failing"] == 2
    assert _by_task(m, "cron_runner_task_consecutive_failures")["healthy"] == 0

    overdue = _by_task(m, "cron_runner_task_overdue")
    assert overdue["nightly"] == 1 and overdue["healthy"] == 0
    assert _by_task(m, "cron_runner_task_missed_slots")["nightly"] >= 1
    held = _by_task(m, "cron_runner_task_lease_held")
    assert held["slow"] == 1 and held["healthy"] == 0
    holders = {s.labels["task"]: s.labels["holder"] for s in m["cron_runner_task_lease_holder"]}
    assert holders == {"slow": "pod-slow"}
    assert _by_task(m, "cron_runner_task_over_max_runtime") == {**dict.fromkeys(held, 0.0),
                                                                 "slow": 1.0}  # fmt: skip
    assert _by_task(m, "cron_runner_task_max_runtime_seconds") == {"slow": 1.0}
    assert _by_task(m, "cron_runner_task_running_seconds")["slow"] >= 1
    assert _by_task(m, "cron_runner_task_paused") == {**dict.fromkeys(held, 0.0),
                                                       "held-back": 1.0}  # fmt: skip
    assert _by_task(m, "cron_runner_task_paused_until_timestamp_seconds") == {
        "held-back": PAUSED_UNTIL_S
    }
    (since,) = _by_task(m, "cron_runner_task_paused_since_timestamp_seconds").items()
    assert since[0] == "held-back" and abs(since[1] - time.time()) < 600
    # The skipped slot is counted once; the pause itself is an operator's act, not a run.
    assert runs[("held-back", "paused")] == 1
    assert ("held-back", "pause") not in runs
    assert overdue["held-back"] == 0
    assert _by_task(m, "cron_runner_task_last_success_timestamp_seconds").keys() >= {
        "healthy",
        "berlin",
    }
    assert "failing" in _by_task(m, "cron_runner_task_last_failure_timestamp_seconds")

    count = {s.labels["task"]: s.value for s in m["cron_runner_task_run_duration_seconds_count"]}
    assert count["failing"] == 2
    latency = {s.labels["task"]: s.value for s in m["cron_runner_queue_latency_seconds_count"]}
    assert latency == {"q-ok": 1}
    depth = {s.labels["queue"]: s.value for s in m["cron_runner_queue_depth"]}
    assert depth["billing"] == 1
    assert m["cron_runner_watchdog_heartbeat_present"][0].value == 1


def test_routes_and_404(world: World, tmp_path: Path) -> None:
    with serving(world.env, tmp_path / "serve.log") as served:
        assert served.get("/healthz") == (200, "ok\n")
        assert served.get("/readyz") == (200, "ready\n")
        for path in ("/tasks/no-such-task", "/tasks/%3Cscript%3E", "/nothing", "/tasks/"):
            code, body = served.get(path)
            assert code == 404, path
            assert "<script>" not in body
        code, body = served.get("/tasks/healthy")
        assert code == 200 and "healthy" in body


def test_redis_down_gives_a_clear_page_and_readyz_fails(tmp_path: Path) -> None:
    env = runner_env(f"redis://127.0.0.1:{free_port()}/0", CRON_RUNNER_CONNECT_TIMEOUT="1s")
    with serving(env, tmp_path / "serve.log") as served:
        assert served.get("/healthz")[0] == 200
        code, text = served.get("/readyz")
        assert code == 503 and "Redis at" in text
        code, page = served.get("/")
        assert code == 503
        assert "Redis unreachable" in page and "Traceback" not in page
        code, metrics = served.get("/metrics")
        assert code == 200
        assert _samples(metrics)["cron_runner_up"][0].value == 0
    assert "Traceback" not in served.log.read_text()


def test_redis_coming_back_serves_again(tmp_path: Path) -> None:
    with RedisServer() as server:
        env = runner_env(server.url)
        with serving(env, tmp_path / "serve.log") as served:
            assert served.get("/readyz")[0] == 200
            server.stop()
            assert served.get("/")[0] == 503
            server.start()
            assert served.get("/")[0] == 200


def test_bad_port_is_a_configuration_error(tmp_path: Path) -> None:
    from runner.errors import ConfigError  # noqa: PLC0415
    from tests.helpers.proc import run  # noqa: PLC0415

    res = run(["serve", "--port", "http"], runner_env("redis://127.0.0.1:1/0"))
    assert res.returncode == ConfigError.exit_code
    assert "--port" in res.stderr and "Traceback" not in res.stderr
    env = runner_env("redis://127.0.0.1:1/0", CRON_RUNNER_SERVE_PORT="70000")
    res = run(["serve"], env)
    assert res.returncode == ConfigError.exit_code
    assert "CRON_RUNNER_SERVE_PORT" in res.stderr


def test_run_and_exec_import_nothing_of_serve() -> None:
    code = (
        "import sys, runner.cli.main as c\n"
        "c.build_parser('exec')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('prometheus_client', 'jinja2', 'markupsafe', 'http') or m.startswith('runner.serve'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + code], capture_output=True, text=True,
        cwd=ROOT, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout) == []


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bcron_runner_[a-z0-9_]+", expr))


def test_dashboard_and_alerts_name_only_metrics_serve_exposes(world: World, tmp_path: Path) -> None:
    from helm_python.chart import Chart  # noqa: PLC0415

    from tests.chart.helpers import CHART_DIR, render  # noqa: PLC0415
    from tests.chart.test_serve import everything  # noqa: PLC0415

    with serving(world.env, tmp_path / "serve.log") as served:
        _, text = served.get("/metrics")
    exposed = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    with Chart.load(CHART_DIR) as chart:
        rendered = render(chart, everything())
    board = json.loads(
        rendered.one("ConfigMap", "cron-runner-serve-dashboard")["data"]["cron-runner.json"]
    )
    queries = [t["expr"] for p in board["panels"] for t in p["targets"]]
    queries.append(board["templating"]["list"][1]["query"]["query"])
    rules = [r["expr"] for g in rendered.one("PrometheusRule", "cron-runner-serve")["spec"]["groups"]
             for r in g["rules"]]  # fmt: skip
    for where, exprs in (("dashboard", queries), ("alerts", rules)):
        named = set().union(*(_metric_names(e) for e in exprs))
        assert named, where
        assert named <= exposed, f"{where} names metrics serve does not expose: {named - exposed}"
