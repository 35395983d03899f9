"""Queue mode in the chart (issue 8): per-task `mode`, and `workers:` groups, each a Deployment
with a PodDisruptionBudget, the restricted security context, the worker's side of the
environment contract and a grace period matched to its shutdown."""

from __future__ import annotations

from typing import Any

import pytest
from helm_python import HelmRenderError, HelmValuesError
from helm_python.chart import Chart

from tests.chart.helpers import (
    NAMESPACE,
    RELEASE,
    Manifest,
    ci_values,
    container,
    env_of,
    pod_spec,
    render,
    selects,
)

QUEUE = "08-queue-mode-workers-values.yaml"
BUNDLED = "09-queue-bundled-redis-values.yaml"


def workers(rendered: Any) -> dict[str, Manifest]:
    return {
        d["metadata"]["labels"]["cron-runner/worker-group"]: d
        for d in rendered.of_kind("Deployment")
    }


def test_one_deployment_and_budget_per_group(chart: Chart) -> None:
    rendered = render(chart, ci_values(QUEUE))
    groups = workers(rendered)
    assert set(groups) == {"default", "reports"}
    for group, deployment in groups.items():
        assert deployment["metadata"]["name"] == f"{RELEASE}-worker-{group}"
        assert deployment["metadata"]["namespace"] == NAMESPACE
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        assert selector["app.kubernetes.io/component"] == "worker"
        assert selector["cron-runner/worker-group"] == group
        budget = rendered.one("PodDisruptionBudget", deployment["metadata"]["name"])
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert budget["spec"]["selector"]["matchLabels"]["cron-runner.io/component"] == "worker"
        c = container(deployment)
        assert (c["command"], c["args"]) == (["cron-runner"], ["worker"])
    assert groups["default"]["spec"]["replicas"] == 3
    assert rendered.one("PodDisruptionBudget", f"{RELEASE}-worker-default")["spec"] == {
        "selector": {
            "matchLabels": {
                "cron-runner.io/name": "cron-runner",
                "cron-runner.io/instance": RELEASE,
                "cron-runner.io/component": "worker",
                "cron-runner/worker-group": "default",
            }
        },
        "maxUnavailable": 1,
    }
    reports_budget = rendered.one("PodDisruptionBudget", f"{RELEASE}-worker-reports")["spec"]
    assert reports_budget["minAvailable"] == 1 and "maxUnavailable" not in reports_budget


def test_worker_env_contract_and_grace(chart: Chart) -> None:
    rendered = render(chart, ci_values(QUEUE))
    groups = workers(rendered)
    report_env = env_of(container(rendered.cronjobs()["reports"]))
    for group, deployment in groups.items():
        env = env_of(container(deployment))
        assert env["CRON_RUNNER_HOLDER"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert (
            env["CRON_RUNNER_SCOPE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        )
        grace_s = pod_spec(deployment)["terminationGracePeriodSeconds"]
        assert env["CRON_RUNNER_SHUTDOWN_GRACE"]["value"] == f"{grace_s - 5}s", group
        assert env["CRON_RUNNER_TASK_MODULES"]["value"] == "acme.tasks"
        assert env["CRON_RUNNER_MAX_MESSAGE_SIZE"]["value"] == "32KiB"
        assert env["CRON_RUNNER_QUEUE_HEARTBEAT_TIMEOUT"]["value"] == "30s"
        assert "DATABASE_URL" in env
        # The same Redis as the CronJobs that enqueue, and the same namespace for the keys.
        for name in (n for n in report_env if n.startswith("CRON_RUNNER_REDIS_")):
            assert env[name] == report_env[name], (group, name)
        assert "CRON_RUNNER_MODE" not in env
        assert "CRON_RUNNER_JOB_NAME" not in env
    default = env_of(container(groups["default"]))
    assert (default["CRON_RUNNER_WORKER_PROCESSES"]["value"],
            default["CRON_RUNNER_WORKER_THREADS"]["value"]) == ("1", "4")  # fmt: skip
    assert "CRON_RUNNER_WORKER_QUEUES" not in default, "empty: every registered task's queue"
    assert pod_spec(groups["default"])["terminationGracePeriodSeconds"] == 60
    reports = env_of(container(groups["reports"]))
    assert reports["CRON_RUNNER_WORKER_QUEUES"]["value"] == "reports"
    assert reports["CRON_RUNNER_WORKER_PROCESSES"]["value"] == "2"
    assert reports["REPORTS_BUCKET"]["value"] == "s3://acme-reports"
    assert "REPORTS_BUCKET" not in default
    assert pod_spec(groups["reports"])["terminationGracePeriodSeconds"] == 300
    assert container(groups["reports"])["resources"]["limits"] == {"memory": "1Gi"}
    assert pod_spec(groups["reports"])["topologySpreadConstraints"][0]["maxSkew"] == 1


def test_per_task_mode(chart: Chart) -> None:
    cronjobs = render(chart, ci_values(QUEUE)).cronjobs()
    modes = {t: env_of(container(cj))["CRON_RUNNER_MODE"]["value"] for t, cj in cronjobs.items()}
    assert modes == {"invoices": "enqueue", "reports": "enqueue", "cleanup": "run"}
    bundled = render(chart, ci_values(BUNDLED)).cronjobs()["report"]
    assert env_of(container(bundled))["CRON_RUNNER_MODE"]["value"] == "enqueue"
    assert container(bundled)["args"] == ["run", "report"]


QUEUE_OPTIONS = ("CRON_RUNNER_QUEUE", "CRON_RUNNER_RETRIES_MAX", "CRON_RUNNER_RETRIES_MIN_BACKOFF",
                 "CRON_RUNNER_RETRIES_MAX_BACKOFF", "CRON_RUNNER_TIME_LIMIT")  # fmt: skip


def test_per_task_queue_retries_and_time_limit(chart: Chart) -> None:
    values = ci_values(QUEUE)
    values["tasks"]["invoices"].update(
        queue="billing", retries={"max": 0, "minBackoff": "30s", "maxBackoff": "30m"},
        timeLimit="15m",
    )  # fmt: skip
    values["tasks"]["reports"].update(retries={"max": 5}, timeLimit=90)  # as --set gives them
    cronjobs = render(chart, values).cronjobs()  # the chart fixture validates the schema
    invoices = env_of(container(cronjobs["invoices"]))
    set_here = [invoices[name]["value"] for name in QUEUE_OPTIONS]
    assert set_here == ["billing", "0", "30s", "30m", "15m"], "retries.max 0 is a value: no retry"
    reports = env_of(container(cronjobs["reports"]))
    assert {n: reports[n]["value"] for n in QUEUE_OPTIONS if n in reports} == {
        "CRON_RUNNER_RETRIES_MAX": "5", "CRON_RUNNER_TIME_LIMIT": "90",
    }  # fmt: skip
    cleanup = env_of(container(cronjobs["cleanup"]))
    assert not set(QUEUE_OPTIONS) & set(cleanup), "unset: the task's @task options apply"
    # A task's own env still wins over what the chart derives.
    values["tasks"]["invoices"]["env"] = {"CRON_RUNNER_QUEUE": "urgent"}
    invoices = env_of(container(render(chart, values).cronjobs()["invoices"]))
    assert invoices["CRON_RUNNER_QUEUE"]["value"] == "urgent"


def test_zero_replicas_and_no_budget(chart: Chart) -> None:
    rendered = render(chart, ci_values(BUNDLED))
    groups = workers(rendered)
    assert groups["standby"]["spec"]["replicas"] == 0
    assert groups["default"]["spec"]["replicas"] == 2
    assert not rendered.of_kind("PodDisruptionBudget")


def _selected(policy: Manifest, labels: dict[str, str]) -> bool:
    return selects(policy["spec"]["podSelector"], labels)


def test_network_policy_covers_the_workers(chart: Chart) -> None:
    for values in (QUEUE, BUNDLED):
        rendered = render(chart, ci_values(values))
        egress = rendered.one("NetworkPolicy", f"{RELEASE}-tasks")
        for deployment in rendered.of_kind("Deployment"):
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert _selected(egress, labels), values
    rendered = render(chart, ci_values(BUNDLED))
    (ingress,) = rendered.one("NetworkPolicy", f"{RELEASE}-redis")["spec"]["ingress"]
    (peer,) = ingress["from"]
    for deployment in rendered.of_kind("Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert _selected({"spec": {"podSelector": peer["podSelector"]}}, labels)


def test_notes(chart: Chart) -> None:
    notes = render(chart, ci_values(QUEUE)).notes
    assert 'invoices: "0 1 * * *" (UTC) enqueued for the workers' in notes
    assert f"kubectl logs -n {NAMESPACE} -l cron-runner/worker-group=reports" in notes
    assert f"deploy/{RELEASE}-worker-default -- cron-runner dlq list TASK" in notes
    assert "WARNING" not in notes
    values = ci_values(QUEUE)
    del values["workers"]
    notes = render(chart, values).notes
    assert "WARNING: invoices, reports in enqueue mode, but no workers are configured" in notes


def _refused(chart: Chart, values: dict[str, Any]) -> str:
    with pytest.raises((HelmRenderError, HelmValuesError)) as info:
        render(chart, values)
    return str(info.value)


TASK = {"schedule": "0 2 * * *", "task": "report"}


@pytest.mark.parametrize(
    ("values", "schema_says", "template_says"),
    [
        (
            {"tasks": {"sync": {"schedule": "0 2 * * *", "command": ["x"], "mode": "enqueue"}}},
            "at '/tasks/sync'",
            'task "sync": mode enqueue needs task',
        ),
        (
            {"runner": {"mode": "enqueue"},
             "tasks": {"sync": {"schedule": "0 2 * * *", "command": ["x"]}}},
            None,
            'task "sync": mode enqueue needs task',
        ),
        (
            {"tasks": {"sync": {**TASK, "mode": "run", "queue": "billing", "timeLimit": "1m"}}},
            "at '/tasks/sync'",
            'task "sync": queue, timeLimit: for queue mode only',
        ),
        (
            {"tasks": {"sync": {**TASK, "retries": {"max": 3}}}},
            None,
            'task "sync": retries: for queue mode only',
        ),
        (
            {"tasks": {"sync": {**TASK, "mode": "enqueue", "queue": "9lives"}}},
            "at '/tasks/sync/queue'",
            'task "sync": queue "9lives" is not valid',
        ),
        (
            {"tasks": {"sync": {**TASK, "mode": "enqueue", "retries": 3}}},
            "at '/tasks/sync/retries': got number, want object",
            'task "sync": retries must be a map',
        ),
        (
            {"tasks": {"worker": TASK}},
            'task "worker": this name is reserved',
            'task "worker": this name is reserved',
        ),
        (
            {"tasks": {"report": TASK}, "workers": {"Big_Group": {}}},
            "'Big_Group' does not match pattern",
            'worker group "Big_Group": a group name must be a DNS label',
        ),
        (
            {"tasks": {"report": TASK}, "workers": {"default": {"threads": 0}}},
            "at '/workers/default'",
            'worker group "default": threads must be at least 1',
        ),
        (
            {"tasks": {"report": TASK},
             "workers": {"default": {"terminationGracePeriodSeconds": 5}}},
            "at '/workers/default'",
            'worker group "default": terminationGracePeriodSeconds must be at least 6',
        ),
        (
            {"tasks": {"report": TASK}, "workers": {"default": {"queues": ["9lives"]}}},
            "at '/workers/default'",
            'worker group "default": queue "9lives" is not valid',
        ),
        (
            {"tasks": {"report": TASK},
             "workers": {"default": {"podDisruptionBudget": {
                 "enabled": True, "maxUnavailable": 1, "minAvailable": 1}}}},
            None,
            "podDisruptionBudget takes maxUnavailable or minAvailable, not both",
        ),
        (
            {"tasks": {"report": TASK},
             "workers": {"a-group-name-far-too-long-for-a-deployment-x": {}}},
            None,
            "at most 52 fit",
        ),
    ],
    ids=["enqueue-command", "runner-enqueue-command", "queue-options-run-mode",
         "queue-options-default-mode", "task-queue-name", "retries-not-a-map", "reserved",
         "group-name", "threads", "grace", "queue-name", "budget-both", "long-name"],
)  # fmt: skip
def test_refusals(
    chart: Chart,
    schemaless: Chart,
    values: dict[str, Any],
    schema_says: str | None,
    template_says: str,
) -> None:
    values = {"redis": {"host": "redis"}, **values}
    if schema_says is not None:
        assert schema_says in _refused(chart, values)
    assert template_says in _refused(schemaless, values)
