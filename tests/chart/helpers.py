"""Render charts/cron-runner offline with the real Helm v4 engine (helm-python-sdk)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from helm_python.chart import Chart

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "cron-runner"
CI_DIR = CHART_DIR / "ci"
CI_FILES = sorted(CI_DIR.glob("*.yaml"))
RELEASE = "cron-runner"
NAMESPACE = "cron-system"

Manifest = dict[str, Any]


@dataclass
class Rendered:
    docs: list[Manifest]
    notes: str

    def of_kind(self, kind: str) -> list[Manifest]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Manifest:
        found = [d for d in self.of_kind(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
        return found[0]

    def cronjobs(self) -> dict[str, Manifest]:
        """CronJobs keyed by task name (their cron-runner.io/component label)."""
        return {
            d["metadata"]["labels"]["cron-runner.io/component"]: d for d in self.of_kind("CronJob")
        }


def ci_values(name: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CI_DIR / name).read_text())
    return values


# What Helm's discovery of a cluster lists for the kinds the chart renders (an offline render
# lists groups only). `lookup` still finds nothing: a first `helm install`.
CLUSTER_API_VERSIONS = ["v1/Secret", "v1/Service", "v1/ConfigMap", "v1/ServiceAccount",
                        "apps/v1/StatefulSet", "apps/v1/Deployment", "batch/v1/CronJob"]  # fmt: skip


def render(
    chart: Chart,
    values: dict[str, Any],
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    helm_install: bool = False,
) -> Rendered:
    """Offline, as `helm template` renders; with ``helm_install``, as `helm install` does
    against a cluster that has none of the release's objects yet."""
    if helm_install:
        out = render_with_api_versions(chart, values, name, namespace, CLUSTER_API_VERSIONS)
    else:
        out = chart.render(values, name=name, namespace=namespace)
    docs: list[Manifest] = []
    notes = ""
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return Rendered(docs, notes)


def pod_spec(doc: Manifest) -> Manifest:
    """The pod spec inside a CronJob, StatefulSet or Pod."""
    if doc["kind"] == "CronJob":
        spec: Manifest = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    elif doc["kind"] == "Pod":
        spec = doc["spec"]
    else:
        spec = doc["spec"]["template"]["spec"]
    return spec


def container(cronjob: Manifest) -> Manifest:
    """The chart's own container: the first, before any a task adds (extraContainers)."""
    containers = pod_spec(cronjob)["containers"]
    found: Manifest = containers[0]
    assert found["name"] in ("cron-runner", "watchdog", "worker", "check", "serve"), found["name"]
    return found


def env_of(c: Manifest) -> dict[str, Manifest]:
    """EnvVars keyed by name; fails on a duplicate, which Kubernetes would silently shadow."""
    names = [e["name"] for e in c.get("env", [])]
    assert len(names) == len(set(names)), f"duplicate env names in {names}"
    return {e["name"]: e for e in c.get("env", [])}


def render_with_api_versions(
    chart: Chart, values: dict[str, Any], name: str, namespace: str, api_versions: list[str]
) -> dict[str, str]:
    # helm-python-sdk's render() does not pass api_versions, which its native call takes.
    from helm_python import _native  # noqa: PLC0415

    opts = {"name": name, "namespace": namespace, "api_versions": api_versions}
    raw = chart._raw()
    out: dict[str, str] = json.loads(
        _native.call_string("helm_render", raw, json.dumps(values), json.dumps(opts))
    )
    return out


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels, matchExpressions) matches ``labels``, as the API
    server decides."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op = e["key"], e["operator"]
        if op == "In" and labels.get(key) not in e["values"]:
            return False
        if op == "NotIn" and key in labels and labels[key] in e["values"]:
            return False
        if (op == "Exists") != (key in labels) and op in ("Exists", "DoesNotExist"):
            return False
    return True
