"""Every values file under charts/cron-runner/ci renders, lints clean and passes the official
Kubernetes schemas in strict mode (unknown fields rejected), for several Kubernetes versions."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from helm_python.chart import Chart, lint

from tests.chart.helpers import CHART_DIR, CI_FILES, NAMESPACE, Manifest, render

# 1.29 to 1.33 as the issue asks, and 1.36: what the offline render reports as the cluster.
# Not 1.27/1.28, the chart's floor: their OpenAPI marks onPodConditions required on every
# podFailurePolicy rule (an exit-code rule has none); the API server never enforced that,
# and the schema stopped saying it in 1.29.
KUBE_VERSIONS = ["1.29", "1.31", "1.33", "1.36"]

EXPECTED_CI_FILES = {
    "01-defaults-one-task-values.yaml",
    "02-three-tasks-overrides-values.yaml",
    "03-command-task-values.yaml",
    "04-tls-secret-acl-values.yaml",
    "05-sentinel-values.yaml",
    "06-bundled-redis-networkpolicy-values.yaml",
    "07-zero-values.yaml",
    "08-queue-mode-workers-values.yaml",
    "09-queue-bundled-redis-values.yaml",
    "10-inject-app-images-values.yaml",
    "11-scheduling-policies-values.yaml",
}


def schema_errors(doc: Manifest, version: str) -> list[str]:
    where = f"{doc['kind']}/{doc['metadata']['name']} on {version}"
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return [f"{where}: {path}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{where}: {exc.message}"]
    return []


def test_the_matrix_is_complete() -> None:
    assert {f.name for f in CI_FILES} == EXPECTED_CI_FILES


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_renders_and_validates_strictly(chart: Chart, values_file: Path) -> None:
    rendered = render(chart, yaml.safe_load(values_file.read_text()))
    assert rendered.of_kind("CronJob"), "every matrix entry has at least one task"
    errors = [e for doc in rendered.docs for v in KUBE_VERSIONS for e in schema_errors(doc, v)]
    assert errors == []


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_lint_strict_is_clean(values_file: Path) -> None:
    report = lint(
        CHART_DIR, yaml.safe_load(values_file.read_text()), strict=True, namespace=NAMESPACE
    )
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); 2 is a warning, 3 an error.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_strict_validation_rejects_unknown_fields(chart: Chart) -> None:
    # Proves the schema check above has teeth: a field at the wrong nesting level is refused.
    rendered = render(chart, yaml.safe_load(CI_FILES[0].read_text()))
    cronjob = copy.deepcopy(rendered.of_kind("CronJob")[0])
    cronjob["spec"]["backoffLimit"] = 2  # belongs in spec.jobTemplate.spec
    assert schema_errors(cronjob, "1.33")
    assert any("backoffLimit" in e for e in schema_errors(cronjob, "1.33"))


def test_lint_reports_schema_violations() -> None:
    report = lint(CHART_DIR, {"tasks": {"Report": {"task": "report"}}}, strict=True)
    text = "\n".join(report["errors"])
    assert "missing property 'schedule'" in text
    assert "'Report' does not match pattern" in text
