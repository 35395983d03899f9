"""serve in the chart: the Deployment, Service, Ingress and NetworkPolicy by the Helm engine and
the strict Kubernetes schemas; the Prometheus Operator objects as far as offline checks go
(their rules by promtool itself: `promtool check rules` and `promtool test rules`, with
series that fire each alert and series that must not); the dashboard's JSON."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart, lint

from tests.chart.helpers import (
    CHART_DIR,
    NAMESPACE,
    RELEASE,
    Manifest,
    ci_values,
    container,
    env_of,
    pod_spec,
    render,
)
from tests.chart.test_matrix import KUBE_VERSIONS, schema_errors
from tests.chart.test_objects import all_renders, assert_restricted

SERVE = "cron-runner-serve"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "PodMonitor"}
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def serve_values(**serve: Any) -> dict[str, Any]:
    values = ci_values("02-three-tasks-overrides-values.yaml")
    values["serve"] = {"enabled": True, **serve}
    return values


def everything() -> dict[str, Any]:
    values = serve_values(
        ingress={"enabled": True, "host": "cron.example.com", "className": "nginx"},
        serviceMonitor={"enabled": True, "labels": {"release": "prom"}},
        prometheusRule={"enabled": True},
        networkPolicy={"from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
    )
    values["watchdog"] = {"enabled": True}
    values["networkPolicy"] = {"enabled": True}
    return values


def test_off_by_default(chart: Chart) -> None:
    for _, rendered in all_renders(chart):
        assert not [d for d in rendered.docs
                    if d["metadata"]["labels"].get("app.kubernetes.io/component") == "serve"]  # fmt: skip


def test_deployment_service_and_dashboard(chart: Chart) -> None:
    rendered = render(chart, serve_values())
    deployment = rendered.one("Deployment", SERVE)
    assert deployment["spec"]["replicas"] == 1
    assert_restricted(deployment, 10001)
    c = container(deployment)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["args"] == ["serve", "--port", "8080", "--tolerance", "10m"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    env = env_of(c)
    assert env["CRON_RUNNER_SCOPE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "CRON_RUNNER_REDIS_URL" in env
    service = rendered.one("Service", SERVE)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    # The Service selects by the chart's own labels; the Deployment keeps its first selector.
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["selector"]["cron-runner.io/component"] == "serve"
    assert deployment["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "cron-runner",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "serve",
    }
    assert pod_spec(deployment)["containers"][0]["ports"][0]["containerPort"] == 8080
    # The CRD kinds stay off unless asked: without the operator they would fail the install.
    assert not [d for d in rendered.docs if d["kind"] in CRD_KINDS]
    board = rendered.one("ConfigMap", f"{SERVE}-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["cron-runner.json"])["uid"] == "cron-runner"


@pytest.mark.parametrize("values", [serve_values(), everything()], ids=["serve", "everything"])
def test_objects_pass_the_strict_schemas_and_lint(chart: Chart, values: dict[str, Any]) -> None:
    rendered = render(chart, values)
    docs = [d for d in rendered.docs if d["kind"] not in CRD_KINDS]
    errors = [e for doc in docs for v in KUBE_VERSIONS for e in schema_errors(doc, v)]
    assert errors == []
    report = lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []


def test_ingress_network_policy_and_operator_objects(chart: Chart) -> None:
    rendered = render(chart, everything())
    ingress = rendered.one("Ingress", SERVE)
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "cron.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"] == {
        "name": SERVE,
        "port": {"name": "http"},
    }
    policy = rendered.one("NetworkPolicy", SERVE)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (allowed,) = policy["spec"]["ingress"]
    assert allowed["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert allowed["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    # The tasks' egress policy selects serve too (its Redis and DNS).
    tasks = rendered.one("NetworkPolicy", "cron-runner-tasks")
    selector = tasks["spec"]["podSelector"]
    assert selector["matchExpressions"][0]["values"] == ["bundled-redis"]

    monitor = rendered.one("ServiceMonitor", SERVE)
    _structure(monitor, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"]
        == rendered.one("Service", SERVE)["spec"]["selector"]
    )
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s",
                                             "scrapeTimeout": "10s"}]  # fmt: skip
    _structure(rendered.one("PrometheusRule", SERVE), "PrometheusRule")


# Required fields and types of the operator's CRDs (monitoring.coreos.com/v1), for the fields
# the chart sets: their full OpenAPI schemas are not available offline.
_CRD_SHAPES: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {"selector": dict, "endpoints": list, "namespaceSelector": dict},
    "PrometheusRule": {"groups": list},
    "PodMonitor": {"selector": dict, "podMetricsEndpoints": list, "namespaceSelector": dict},
}


def _structure(doc: Manifest, kind: str) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == kind
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(doc["metadata"]) <= {"name", "namespace", "labels", "annotations"}
    assert re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", doc["metadata"]["name"])
    shape = _CRD_SHAPES[kind]
    assert set(doc["spec"]) == set(shape)
    for key, kind_of in shape.items():
        assert isinstance(doc["spec"][key], kind_of), key
    if kind == "PrometheusRule":
        for group in doc["spec"]["groups"]:
            assert set(group) == {"name", "rules"}
            for rule in group["rules"]:
                assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
                assert isinstance(rule["expr"], str)


def test_task_max_runtime_and_ping_url_reach_the_pods_and_the_watchdog(chart: Chart) -> None:
    values = ci_values("01-defaults-one-task-values.yaml")
    (task,) = values["tasks"]
    values["tasks"][task] |= {"maxRuntime": "30m", "pingUrl": "https://hc-ping.com/0c1d"}
    values["watchdog"] = {"enabled": True, "heartbeatTtl": "20m"}
    rendered = render(chart, values)
    env = env_of(container(rendered.cronjobs()[task]))
    assert env["CRON_RUNNER_MAX_RUNTIME"]["value"] == "30m"
    assert env["CRON_RUNNER_PING_URL"]["value"] == "https://hc-ping.com/0c1d"
    args = container(rendered.cronjobs()["watchdog"])["args"]
    assert args[args.index("--heartbeat-ttl") + 1] == "20m"
    assert args[args.index("--max-runtime") + 1] == f"{task}=30m"


# --- the alerts, by promtool ---------------------------------------------------------------


def _rules_file(tmp_path: Path, chart: Chart) -> Path:
    spec = render(chart, everything()).one("PrometheusRule", SERVE)["spec"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_promtool_checks_the_rules(chart: Chart, tmp_path: Path) -> None:
    res = subprocess.run([PROMTOOL, "check", "rules", str(_rules_file(tmp_path, chart))],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 8 rules found" in res.stdout


NS = f'namespace="{NAMESPACE}"'


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    text = ",".join([NS, *(f'{k}="{v}"' for k, v in labels.items())])
    return {"series": f"{name}{{{text}}}", "values": values}


# alert -> (input series, eval time, the labels of each alert expected then, {$value} of each)
SCENARIOS: dict[str, tuple[list[dict[str, str]], str, list[dict[str, str]], list[str]]] = {
    "CronRunnerTaskOverdue": (
        [_series("cron_runner_task_overdue", "0 1 1 1 1 1", task="late"),
         _series("cron_runner_task_overdue", "0x5", task="fine")], "5m", [{"task": "late"}], [""]),
    "CronRunnerTaskFailing": (
        [_series("cron_runner_task_consecutive_failures", "1 2 3 3", task="bad"),
         _series("cron_runner_task_consecutive_failures", "2x3", task="flaky")], "3m",
        [{"task": "bad"}], ["3"]),
    "CronRunnerLeaseLost": (
        [_series("cron_runner_task_runs_total", "0 0 1 1 1", task="lost", outcome="lease_lost"),
         _series("cron_runner_task_runs_total", "1x4", task="old", outcome="lease_lost"),
         _series("cron_runner_task_runs_total", "0 1 2 3 4", task="old", outcome="failed")],
        "4m", [{"task": "lost"}], [""]),
    "CronRunnerRedisUnreachable": (
        [_series("cron_runner_up", "1 1 0 0 0 0 0 0 0 0")], "9m", [{}], [""]),
    "CronRunnerOverMaxRuntime": (
        [_series("cron_runner_task_over_max_runtime", "0 1 1", task="slow"),
         _series("cron_runner_task_over_max_runtime", "0 0 0", task="quick")], "2m",
        [{"task": "slow"}], [""]),
    "CronRunnerWatchdogMissing": (
        [_series("cron_runner_watchdog_heartbeat_present", "1 1 0 0 0 0 0 0 0")], "8m", [{}], [""]),
    "CronRunnerDeadLetters": (
        [_series("cron_runner_queue_dead_letters", "0 2 2", queue="billing"),
         _series("cron_runner_queue_dead_letters", "0 0 0", queue="mail")], "2m",
        [{"queue": "billing"}], ["2"]),
    "CronRunnerQueueLatencyHigh": (
        [_series("cron_runner_queue_latency_seconds_bucket", "0x40", task="slowq", le="300"),
         _series("cron_runner_queue_latency_seconds_bucket", "0+1x40", task="slowq", le="900"),
         _series("cron_runner_queue_latency_seconds_bucket", "0+1x40", task="slowq", le="+Inf"),
         *(_series("cron_runner_queue_latency_seconds_bucket", "0+1x40", task="fastq", le=le)
           for le in ("1", "300", "900", "+Inf"))], "30m", [{"task": "slowq"}], [""]),
}  # fmt: skip


def _annotations(rule: dict[str, Any], labels: dict[str, str], value: str) -> dict[str, str]:
    """The rule's annotations as Prometheus expands them for these labels and value."""
    out = {}
    for key, template in rule.get("annotations", {}).items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), template)
        out[key] = text.replace("{{ $value }}", value)
    return out


def test_promtool_unit_tests_fire_each_alert_and_spare_the_rest(
    chart: Chart, tmp_path: Path
) -> None:
    rules_path = _rules_file(tmp_path, chart)
    rules = {r["alert"]: r for g in yaml.safe_load(rules_path.read_text())["groups"]
             for r in g["rules"]}  # fmt: skip
    assert set(rules) == set(SCENARIOS)
    tests = []
    for alert, (series, at, expected, values) in SCENARIOS.items():
        checks = []
        for other in rules:  # every alert, at the same instant: only this one fires
            exp = []
            if other == alert:
                for labels, value in zip(expected, values, strict=True):
                    full = {"namespace": NAMESPACE, "severity": "warning", **labels}
                    exp.append({"exp_labels": full,
                                "exp_annotations": _annotations(rules[alert], full, value)})  # fmt: skip
            checks.append({"eval_time": at, "alertname": other, "exp_alerts": exp})
        # And a moment before it is due (its `for`, or the data), nothing fires.
        checks.append({"eval_time": "0m", "alertname": alert, "exp_alerts": []})
        tests.append({"interval": "1m", "input_series": series, "alert_rule_test": checks})
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [rules_path.name],
                                         "evaluation_interval": "1m", "tests": tests}))  # fmt: skip
    res = subprocess.run([PROMTOOL, "test", "rules", str(test_file)], capture_output=True,
                         text=True, check=False, cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


def test_the_dashboard_is_valid_grafana_json() -> None:
    board = json.loads((CHART_DIR / "files" / "grafana-dashboard.json").read_text())
    assert board["title"] == "cron-runner"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])


def test_worker_metrics_and_their_pod_monitor(chart: Chart) -> None:
    values = ci_values("08-queue-mode-workers-values.yaml")
    plain = render(chart, values)
    assert not plain.of_kind("PodMonitor")
    assert all("CRON_RUNNER_WORKER_METRICS_PORT" not in env_of(container(d))
               for d in plain.of_kind("Deployment"))  # fmt: skip
    values["workerMetrics"] = {"enabled": True, "podMonitor": {"enabled": True}}
    values["networkPolicy"] = {"enabled": True}
    rendered = render(chart, values)
    workers = rendered.of_kind("Deployment")
    assert workers
    for deployment in workers:
        c = container(deployment)
        assert env_of(c)["CRON_RUNNER_WORKER_METRICS_PORT"]["value"] == "9191"
        assert c["ports"] == [{"name": "metrics", "containerPort": 9191, "protocol": "TCP"}]
    monitor = rendered.one("PodMonitor")
    _structure(monitor, "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics",
                                                       "interval": "30s"}]  # fmt: skip
    labels = workers[0]["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    policy = rendered.one("NetworkPolicy", "cron-runner-worker-metrics")
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": 9191, "protocol": "TCP"}]
    docs = [d for d in rendered.docs if d["kind"] not in CRD_KINDS]
    assert [e for doc in docs for v in KUBE_VERSIONS for e in schema_errors(doc, v)] == []
    assert lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)["errors"] == []
