"""The chart as a dependency of an app's own chart (values under its key): each app's
CronJobs live in the app's release, rendered by Helm's engine and validated strictly, and two
apps' releases in one namespace never share a task's lease."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart

from tests.chart.helpers import CHART_DIR, Rendered, env_of, pod_spec, render
from tests.chart.test_matrix import KUBE_VERSIONS, schema_errors

NAMESPACE = "shop"


def parent_chart(root: Path, app: str) -> Path:
    """An app's chart with a Deployment of its own and cron-runner as a dependency."""
    chart = root / app
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": app,
                "version": "1.0.0",
                "appVersion": "2026.11.3",
                "dependencies": [
                    {
                        "name": "cron-runner",
                        "version": "0.1.0",
                        "repository": "file://../cron-runner",
                    }
                ],
            }
        )
    )
    (chart / "templates" / "deployment.yaml").write_text(
        """apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-web
  labels:
    app.kubernetes.io/name: {{ .Chart.Name }}
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: {{ .Chart.Name }}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {{ .Chart.Name }}
    spec:
      containers:
        - name: web
          image: registry.example.com/{{ .Chart.Name }}:{{ .Chart.AppVersion }}
"""
    )
    shutil.copytree(CHART_DIR, chart / "charts" / "cron-runner")
    return chart


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Chart]]:
    root = tmp_path_factory.mktemp("apps")
    with (
        Chart.load(parent_chart(root, "billing")) as billing,
        Chart.load(parent_chart(root, "payments")) as payments,
    ):
        yield {"billing": billing, "payments": payments}


def app_values(app: str) -> dict[str, Any]:
    """The app's own values, and the runner's under its key: a task named as the other app's."""
    return {
        "cron-runner": {
            "redis": {"host": "redis.platform.svc"},
            "tasks": {
                "report": {
                    "schedule": "0 * * * *",
                    "runner": {"inject": "initContainer"},
                    "image": {"repository": f"registry.example.com/{app}", "tag": "2026.11.3"},
                    "command": ["/app/report"],
                    "podLabels": {"app.kubernetes.io/name": app},
                }
            },
        }
    }


def scope(rendered: Rendered) -> str:
    (cj,) = rendered.of_kind("CronJob")
    value: str = env_of(pod_spec(cj)["containers"][0])["CRON_RUNNER_SCOPE"]["value"]
    return value


def test_an_apps_chart_renders_its_cronjobs_with_its_own_objects(apps: dict[str, Chart]) -> None:
    rendered = render(apps["billing"], app_values("billing"), name="billing", namespace=NAMESPACE)
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in rendered.docs)
    assert kinds == [
        "CronJob/billing-cron-runner-report",
        "Deployment/billing-web",
        "Pod/billing-cron-runner-check",
    ]
    (cj,) = rendered.of_kind("CronJob")
    pod_labels = cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/name"] == "billing"
    assert pod_labels["cron-runner.io/instance"] == "billing"
    errors = [e for d in rendered.docs for v in KUBE_VERSIONS for e in schema_errors(d, v)]
    assert errors == []


def test_two_apps_in_one_namespace_never_share_a_tasks_lease(apps: dict[str, Chart]) -> None:
    billing = render(apps["billing"], app_values("billing"), name="billing", namespace=NAMESPACE)
    payments = render(
        apps["payments"], app_values("payments"), name="payments", namespace=NAMESPACE
    )
    # Both have a task "report": each release is its own key scope.
    assert (scope(billing), scope(payments)) == ("shop.billing", "shop.payments")
    # Across clusters, the same release in the same namespace shares it: the guarantee holds.
    again = render(apps["billing"], app_values("billing"), name="billing", namespace=NAMESPACE)
    assert scope(again) == "shop.billing"
    # runner.scope, when set, wins: a fleet that wants one scope says so.
    values = app_values("billing")
    values["cron-runner"]["runner"] = {"scope": "fleet"}
    assert scope(render(apps["billing"], values, name="billing", namespace=NAMESPACE)) == "fleet"


def test_a_release_of_its_own_keeps_the_namespace_as_scope(chart: Chart) -> None:
    rendered = render(chart, app_values("billing")["cron-runner"], namespace=NAMESPACE)
    (cj,) = rendered.of_kind("CronJob")
    env = env_of(pod_spec(cj)["containers"][0])
    assert env["CRON_RUNNER_SCOPE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
