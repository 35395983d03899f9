"""The optional missed-run watchdog CronJob: off by default; when on, it runs `cron-runner
watchdog` in the tasks' scope with their Redis wiring, restricted, valid on every version."""

from __future__ import annotations

from typing import Any

import pytest
from helm_python import HelmRenderError, HelmValuesError
from helm_python.chart import Chart, lint

from tests.chart.helpers import (
    CHART_DIR,
    CI_FILES,
    NAMESPACE,
    ci_values,
    container,
    env_of,
    pod_spec,
    render,
)
from tests.chart.test_matrix import KUBE_VERSIONS, schema_errors
from tests.chart.test_objects import all_renders, assert_restricted

WATCHDOG = "cron-runner-watchdog"


def with_watchdog(values_file: str, **watchdog: Any) -> dict[str, Any]:
    values = ci_values(values_file)
    values["watchdog"] = {"enabled": True, **watchdog}
    return values


def test_off_by_default(chart: Chart) -> None:
    for _, rendered in all_renders(chart):
        assert all(
            d["metadata"]["labels"].get("app.kubernetes.io/component") != "watchdog"
            for d in rendered.docs
        )


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_renders_valid_and_restricted_with_every_redis_shape(
    chart: Chart, values_file: Any
) -> None:
    values = with_watchdog(values_file.name)
    rendered = render(chart, values)
    cronjob = rendered.one("CronJob", WATCHDOG)
    errors = [e for v in KUBE_VERSIONS for e in schema_errors(cronjob, v)]
    assert errors == []
    assert_restricted(cronjob, 10001)
    # Same Redis wiring as the task pods: URL, credentials, TLS, Sentinel, Cluster.
    task_env = env_of(container(rendered.cronjobs()[next(iter(values["tasks"]))]))
    env = env_of(container(cronjob))
    for name, var in task_env.items():
        if name.startswith("CRON_RUNNER_REDIS_") or name == "CRON_RUNNER_KEY_PREFIX":
            assert env[name] == var, name
    # The tasks' scope: the namespace, or runner.scope where set (06).
    assert env["CRON_RUNNER_SCOPE"] == task_env["CRON_RUNNER_SCOPE"]
    report = lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []


def test_job_semantics_and_arguments(chart: Chart) -> None:
    values = with_watchdog(
        "01-defaults-one-task-values.yaml",
        schedule="*/10 * * * *",
        tolerance="30m",
        args=["--output", "json"],
    )
    rendered = render(chart, values)
    cronjob = rendered.one("CronJob", WATCHDOG)
    spec = cronjob["spec"]
    assert spec["schedule"] == "*/10 * * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0  # the next schedule checks again
    assert pod_spec(cronjob)["restartPolicy"] == "Never"
    c = container(cronjob)
    assert c["command"] == ["cron-runner"]
    task = next(iter(values["tasks"]))
    schedule = values["tasks"][task]["schedule"]
    timezone = values["tasks"][task].get("timeZone", "UTC")
    assert c["args"] == [
        "watchdog", "--tolerance", "30m", "--heartbeat-ttl", "15m",
        "--expect", f"{task}={schedule};{timezone}",
        "--output", "json",
    ]  # fmt: skip
    labels = job["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "watchdog"
    assert labels["app.kubernetes.io/instance"] == "cron-runner"
    assert "kubectl logs -n cron-system -l app.kubernetes.io/component=watchdog" in rendered.notes


def test_resources_default_to_the_jobs_and_can_be_set(chart: Chart) -> None:
    default = render(chart, with_watchdog("01-defaults-one-task-values.yaml"))
    assert container(default.one("CronJob", WATCHDOG))["resources"]["requests"]["cpu"] == "50m"
    small = {"requests": {"cpu": "10m", "memory": "32Mi"}}
    own = render(chart, with_watchdog("01-defaults-one-task-values.yaml", resources=small))
    assert container(own.one("CronJob", WATCHDOG))["resources"] == small


@pytest.mark.parametrize(
    ("watchdog", "message"),
    [
        ({"tolerance": "soon"}, "does not match pattern"),
        ({"schedul": "*/5 * * * *"}, "additional properties"),
    ],
)
def test_schema_refuses_bad_values(watchdog: dict[str, Any], message: str) -> None:
    values = with_watchdog("01-defaults-one-task-values.yaml", **watchdog)
    report = lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)
    assert any(message in e.lower() for e in report["errors"]), report["errors"]


def test_no_task_may_be_called_watchdog(chart: Chart) -> None:
    values = ci_values("01-defaults-one-task-values.yaml")
    values["tasks"]["watchdog"] = {"schedule": "0 1 * * *", "task": "x"}
    with pytest.raises((HelmRenderError, HelmValuesError)) as info:
        render(chart, values)
    # Not the schema's "invalid propertyName 'watchdog'": the chart says why (issue 14).
    assert 'task "watchdog": this name is reserved: the chart\'s own pods use it' in str(info.value)
    assert "e.g. tasks.watchdog-job with task: watchdog" in str(info.value)


def test_runner_env_and_env_from_reach_every_pod_the_chart_runs(chart: Chart) -> None:
    # A scope or a credential set once in runner.env/envFrom must reach the watchdog and the
    # test pod too: a watchdog in another scope than its tasks checks nothing and stays green.
    values = with_watchdog("08-queue-mode-workers-values.yaml")
    secret_ref = {"secretRef": {"name": "redis-creds"}}
    values["runner"] = {
        **values.get("runner", {}),
        "env": {"CRON_RUNNER_SCOPE": "shared", "TEAM": "billing"},
        "envFrom": [secret_ref],
    }
    values["test"] = {"enabled": True}
    rendered = render(chart, values)
    pods = [d for d in rendered.docs if d["kind"] in ("CronJob", "Deployment", "Pod")]
    kinds = {d["kind"] for d in pods}
    assert kinds == {"CronJob", "Deployment", "Pod"}, kinds
    assert any(d["metadata"]["name"] == WATCHDOG for d in pods)
    for doc in pods:
        c = container(doc)
        env = env_of(c)
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        assert env["CRON_RUNNER_SCOPE"] == {"name": "CRON_RUNNER_SCOPE", "value": "shared"}, name
        assert env["TEAM"]["value"] == "billing", name
        assert c["envFrom"][0] == secret_ref, name
        errors = [e for v in KUBE_VERSIONS for e in schema_errors(doc, v)]
        assert errors == [], name


def test_every_task_is_expected_and_a_suspended_one_ignored(chart: Chart) -> None:
    """The watchdog knows every chart task before it first runs, so a CronJob that never fires
    is overdue too; one suspended on purpose is not checked."""
    values = with_watchdog("01-defaults-one-task-values.yaml")
    values["tasks"] = {
        "report": {"schedule": "0 2 * * *", "timeZone": "Europe/Berlin", "task": "report"},
        "cleanup": {"schedule": "*/15 * * * *", "command": ["true"]},
        "paused": {"schedule": "0 0 * * *", "command": ["true"], "suspend": True},
    }
    args = container(render(chart, values).one("CronJob", WATCHDOG))["args"]
    assert args == [
        "watchdog", "--tolerance", "10m", "--heartbeat-ttl", "15m",
        "--expect", "cleanup=*/15 * * * *;UTC",
        "--ignore", "paused",
        "--expect", "report=0 2 * * *;Europe/Berlin",
    ]  # fmt: skip
