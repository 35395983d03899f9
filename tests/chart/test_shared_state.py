"""What clusters sharing one Redis must agree on, as chart values: the scope, first-class and
shown in NOTES, and the cluster's name in every holder (issue 14, items 8 and 11)."""

from __future__ import annotations

from typing import Any

import pytest
from helm_python.chart import Chart

from tests.chart.helpers import (
    NAMESPACE,
    Manifest,
    Rendered,
    ci_values,
    env_of,
    pod_spec,
    render,
)
from tests.chart.test_matrix import KUBE_VERSIONS, schema_errors
from tests.chart.test_refusals import refused


def everything(**runner: Any) -> dict[str, Any]:
    """Tasks, workers, the watchdog and the helm test: every pod the chart runs."""
    values = ci_values("08-queue-mode-workers-values.yaml")
    values["watchdog"] = {"enabled": True}
    values["runner"] = {**values.get("runner", {}), **runner}
    return values


def pods(rendered: Rendered) -> list[tuple[str, Manifest]]:
    out = []
    for doc in rendered.docs:
        if doc["kind"] in ("CronJob", "Deployment", "Pod"):
            for c in pod_spec(doc)["containers"]:
                out.append((f"{doc['kind']}/{doc['metadata']['name']}", c))
    return out


def test_by_default_the_scope_is_the_namespace_and_notes_say_so(chart: Chart) -> None:
    rendered = render(chart, everything())
    assert len(pods(rendered)) >= 4
    for where, c in pods(rendered):
        env = env_of(c)
        assert env["CRON_RUNNER_SCOPE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.namespace"
        ), where
        assert "CRON_RUNNER_CLUSTER_NAME" not in env, where
    assert f"  scope:      {NAMESPACE} (the namespace: set runner.scope" in rendered.notes
    assert "  key prefix: cron-runner\n" in rendered.notes
    assert "Set runner.clusterName to see which cluster ran a slot" in rendered.notes


def test_runner_scope_and_cluster_name_reach_every_pod(chart: Chart) -> None:
    rendered = render(chart, everything(scope="billing", clusterName="eu-west", keyPrefix="acme"))
    for where, c in pods(rendered):
        env = env_of(c)
        assert env["CRON_RUNNER_SCOPE"] == {"name": "CRON_RUNNER_SCOPE", "value": "billing"}, where
        assert env["CRON_RUNNER_CLUSTER_NAME"]["value"] == "eu-west", where
        # The holder stays the pod's name: the runner puts the cluster's in front.
        assert env["CRON_RUNNER_HOLDER"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    notes = rendered.notes
    assert "  scope:      billing\n" in notes
    assert "  key prefix: acme\n" in notes
    assert "Holders show this cluster as eu-west/<pod> in logs, status and history." in notes
    assert "Redis:      redis://" in notes
    errors = [e for doc in rendered.docs for v in KUBE_VERSIONS for e in schema_errors(doc, v)]
    assert errors == []


def test_notes_show_a_scope_set_through_runner_env(chart: Chart) -> None:
    rendered = render(chart, everything(env={"CRON_RUNNER_SCOPE": "shared"}))
    assert "  scope:      shared\n" in rendered.notes


@pytest.mark.parametrize("key", ["scope", "clusterName"])
@pytest.mark.parametrize("bad", ["eu west", "a/b", "-x", "x" * 64])
def test_a_bad_scope_or_cluster_name_is_refused_by_the_schema(
    chart: Chart, key: str, bad: str
) -> None:
    message = refused(chart, everything(**{key: bad}))
    assert f"/runner/{key}" in message
