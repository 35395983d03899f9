"""`cron-runner import --diff`: each original CronJob next to the one the chart renders from
the printed values, as a unified diff, so that a reviewer sees every change `import` lists and
nothing else.

Helm's own engine renders the chart (helm-python-sdk, the `import-diff` extra): the CronJob is
the one `helm upgrade --install` would apply.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from runner.cli.adopt import LAST_APPLIED, OBJECT_META_DROPPED, Doc, Imported
from runner.errors import ConfigError

# The chart next to the package, in a checkout or an editable install.
BUNDLED_CHART = Path(__file__).resolve().parents[2] / "charts" / "cron-runner"
# Where the leases live does not show in a CronJob's diff but for CRON_RUNNER_REDIS_URL.
PLACEHOLDER_REDIS = {"host": "redis"}
# What Kubernetes fills in when a manifest leaves it out, which the chart writes out: filled
# into the original, so that a default written out is not shown as a change.
CRONJOB_DEFAULTS = {
    "concurrencyPolicy": "Allow",
    "successfulJobsHistoryLimit": 3,
    "failedJobsHistoryLimit": 1,
    "suspend": False,
}
POD_DEFAULTS: dict[str, object] = {
    "serviceAccountName": "default",
    "automountServiceAccountToken": True,
    "terminationGracePeriodSeconds": 30,
    "securityContext": {},
    "enableServiceLinks": True,
}
POD_SERVER_FIELDS = {"dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler"}
CONTAINER_SERVER_FIELDS = {
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
}


def render_cronjobs(imported: Imported, chart: Path | None) -> dict[str, Doc]:
    """The chart's CronJobs for the imported values, by name."""
    try:
        from helm_python.chart import Chart  # noqa: PLC0415 - the engine, for --diff only
    except ImportError as exc:
        raise ConfigError(
            "import --diff renders the chart with Helm's engine: pip install "
            f"'redis-cron-runner[import-diff]' ({exc})"
        ) from exc
    path = chart or BUNDLED_CHART
    if not (path / "Chart.yaml").is_file():
        raise ConfigError(
            f"import --diff: no chart at {path}: give the chart's directory with --chart"
        )
    values = {**imported.values, "redis": PLACEHOLDER_REDIS}
    with Chart.load(path) as loaded:
        out = loaded.render(values, name="cron-runner", namespace=imported.namespace or "default")
    found: dict[str, Doc] = {}
    for name, text in out.items():
        if not name.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, Mapping) and doc.get("kind") == "CronJob":
                found[doc["metadata"]["name"]] = dict(doc)
    return found


def as_the_server_holds(original: Mapping[str, Any]) -> Doc:
    """The original without what only the API server writes, with the defaults it fills in."""
    cj = copy.deepcopy(dict(original))
    cj.pop("status", None)
    meta = cj.setdefault("metadata", {})
    for key in OBJECT_META_DROPPED:
        meta.pop(key, None)
    annotations = meta.get("annotations") or {}
    annotations.pop(LAST_APPLIED, None)
    if not annotations:
        meta.pop("annotations", None)
    spec = cj.get("spec") or {}
    for key, value in CRONJOB_DEFAULTS.items():
        spec.setdefault(key, value)
    job = spec.get("jobTemplate") or {}
    for level in (job, (job.get("spec") or {}).get("template") or {}):
        (level.get("metadata") or {}).pop("creationTimestamp", None)
        if level.get("metadata") == {}:
            del level["metadata"]
    job.get("spec", {}).setdefault("backoffLimit", 6)
    _pod_as_the_server_holds(job.get("spec", {}).get("template", {}).get("spec", {}))
    return cj


def _pod_as_the_server_holds(pod: Doc) -> None:
    for key, value in POD_SERVER_FIELDS.items():
        if pod.get(key) == value:
            del pod[key]
    if "serviceAccount" in pod:
        pod.setdefault("serviceAccountName", pod.pop("serviceAccount"))
    for field, default in POD_DEFAULTS.items():
        pod.setdefault(field, copy.deepcopy(default))
    for c in pod.get("containers") or []:
        for key, value in CONTAINER_SERVER_FIELDS.items():
            if c.get(key) == value:
                del c[key]
    if pod.get("containers"):
        main = pod["containers"][0]
        main.setdefault("securityContext", {})
        tag = str(main.get("image", "")).rpartition("/")[2]
        latest = not (":" in tag or "@" in tag) or tag.endswith(":latest")
        main.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")


def diff(originals: Sequence[Mapping[str, Any]], rendered: Mapping[str, Doc]) -> str:
    out: list[str] = []
    for original in originals:
        name = original["metadata"]["name"]
        after = dict(rendered[name])
        after["metadata"] = {k: v for k, v in after["metadata"].items() if k != "namespace"}
        before_text = yaml.safe_dump(as_the_server_holds(original), sort_keys=True, width=100)
        after_text = yaml.safe_dump(after, sort_keys=True, width=100)
        out += difflib.unified_diff(
            before_text.splitlines(keepends=True),
            after_text.splitlines(keepends=True),
            f"CronJob {name} (original)",
            f"CronJob {name} (rendered by the chart from the printed values)",
            n=3,
        )
    return "".join(out)
