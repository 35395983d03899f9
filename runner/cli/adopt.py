"""`cron-runner import`: chart values that reproduce existing CronJobs under the runner.

Each CronJob becomes one task with ``runner.inject: initContainer``: its own image, command,
schedule, time zone, history limits, labels and annotations at every level, container name,
pod settings and name. What the chart then changes is what the runner must, and each change is
listed with its reason (``Imported.changes``): the container's command, the ``CRON_RUNNER_*``
environment, the init container and emptyDir that bring the runner, the chart's own
``cron-runner.io/*`` labels, the runner's podFailurePolicy rules, and the runner's overlap
policy that does what the CronJob's concurrencyPolicy did. A field the chart cannot carry
over is refused (ConfigError, exit 78), naming it; what in the input selects the pods by label
is warned about (``Imported.warnings``).

Only the CLI's `import` loads this module (and PyYAML, the `import` extra): `run` and `exec`
never do.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from runner.errors import ConfigError

Doc = dict[str, Any]

# Kubernetes' own defaults for what a CronJob leaves unset: the values carry them, so that the
# chart's defaults (Forbid, 300 s, ...) never apply to an imported CronJob.
CRONJOB_DEFAULTS: Doc = {
    "concurrencyPolicy": "Allow",
    "startingDeadlineSeconds": None,
    "successfulJobsHistoryLimit": 3,
    "failedJobsHistoryLimit": 1,
    "suspend": False,
}
JOB_DEFAULTS: Doc = {
    "backoffLimit": 6,
    "activeDeadlineSeconds": None,
    "ttlSecondsAfterFinished": None,
}
# What the API server fills in, which a `kubectl get -o yaml` manifest carries: dropped when equal.
SERVER_DEFAULTS: Doc = {
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
    "dnsPolicy": "ClusterFirst",
    "schedulerName": "default-scheduler",
    "parallelism": 1,
    "completions": 1,
    "completionMode": "NonIndexed",
    "manualSelector": False,
    "podReplacementPolicy": "TerminatingOrFailed",
    "suspend": False,
    "stdin": False,
    "tty": False,
}
# The chart's own volumes and mounts, which an imported pod may not take. Its /tmp emptyDir
# ("tmp") goes only where the root is read-only and the CronJob mounts nothing there.
CHART_VOLUMES = {"cron-runner", "redis-password", "redis-sentinel-password", "redis-tls"}
CHART_MOUNT_PATHS = {"/cron-runner", "/etc/cron-runner"}
# A list of the pod spec -> the field that names an item, the chart's own, and why not.
CHARTS_OWN: dict[str, tuple[str, set[str], str]] = {
    "volumes": ("name", CHART_VOLUMES, " is the chart's own volume; rename it (and its mounts)"),
    "volumeMounts": ("mountPath", CHART_MOUNT_PATHS, ": the chart mounts its own volume there"),
}
# The chart finds its objects by labels under this prefix, which no app label may take.
CHART_LABEL_PREFIX = "cron-runner.io/"
# The runner's own podFailurePolicy rules (values.yaml, jobDefaults.podFailurePolicy): what a
# retry cannot fix fails the Job at once; an evicted pod does not count as a failure.
RUNNER_EXIT_CODES = [64, 78, 79, 126, 127]
RUNNER_CODES_REASON = (
    "the runner's usage and configuration errors (64, 78), a slot replaced by a newer one "
    "(79) and a command that cannot run (126, 127) fail the Job at once: a retry cannot help"
)
# concurrencyPolicy -> the runner's overlap that does the same across clusters and servers.
OVERLAP = {"Replace": "replace", "Allow": "allow-other-slots"}
# Kinds that select pods by label: warned about, for the imported pods keep their labels.
SELECTING_KINDS = {
    "NetworkPolicy",
    "PodMonitor",
    "ServiceMonitor",
    "PodDisruptionBudget",
    "Service",
}
CHART_ENV = {"CRON_RUNNER_SHUTDOWN_GRACE", "CRON_RUNNER_JOB_NAME", "CRON_RUNNER_CRONJOB_NAME"}
OBJECT_META_DROPPED = {
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "namespace",
}
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ENV_REFERENCE = re.compile(r"\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
TASK_KEY_MAX = 50


class Refused(ConfigError):
    """A CronJob field the chart cannot reproduce."""


@dataclass
class Imported:
    """Chart values, the CronJobs' namespace if they name one, what the chart will change in
    each CronJob and why, and what in the input selects the pods by label."""

    values: Doc
    namespace: str | None
    changes: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class _Fields:
    """Takes fields off one object, so that whatever is left over at the end is refused."""

    def __init__(self, where: str, obj: Any) -> None:
        if not isinstance(obj, Mapping):
            raise Refused(f"{where}: expected a mapping, got {type(obj).__name__}")
        self.where = where
        self.left = dict(obj)

    def take(
        self, key: str, kind: type | tuple[type, ...] | None = None, default: Any = None
    ) -> Any:
        value = self.left.pop(key, default)
        if kind is not None and value is not None and not isinstance(value, kind):
            names = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            raise Refused(f"{self.where}.{key}: expected {names}, got {type(value).__name__}")
        return value

    def required(self, key: str, kind: type | tuple[type, ...]) -> Any:
        if key not in self.left:
            raise Refused(f"{self.where}.{key}: required, but missing")
        return self.take(key, kind)

    def drop_defaults(self, defaults: Mapping[str, Any]) -> None:
        for key, value in defaults.items():
            if key in self.left and self.left[key] == value:
                del self.left[key]

    def rest(self) -> Doc:
        """What is left, to be carried over as it is (extraPodSpec, extraContainerSpec)."""
        rest = {k: v for k, v in self.left.items() if v not in (None, [], {})}
        self.left = {}
        return rest

    def done(self) -> None:
        for key, value in self.left.items():
            if value in (None, [], {}):
                continue
            raise Refused(
                f"{self.where}.{key}: the chart cannot carry this field over; remove it, or "
                "keep this CronJob outside the chart"
            )


#: Deeper than any manifest nests (a CronJob's deepest field is about 15 levels down), and far
#: from the recursion limit PyYAML's composer and everything after it would hit.
MAX_DEPTH = 100
#: Alias references in one input: a manifest from the API server has none, and a few
#: thousand are enough to make a document of billions of nodes (the "billion laughs").
MAX_ALIASES = 1000


def _check_shape(text: str, source: str) -> None:
    """Refuse input nested too deep, or with too many aliases, before it is composed: PyYAML's
    event parser does not recurse, its composer does (RecursionError, a traceback)."""
    depth = aliases = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else "?"
                raise Refused(
                    f"{source}: nested more than {MAX_DEPTH} levels deep (line {line}): expected "
                    "CronJob manifests"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise Refused(
                    f"{source}: more than {MAX_ALIASES} aliases (*name): expected CronJob "
                    "manifests, which have none"
                )


def load_documents(text: str, source: str) -> list[Doc]:
    try:
        _check_shape(text, source)
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise Refused(f"{source}: not valid YAML: {exc}") from exc
    out: list[Doc] = []
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") == "List":
            out.extend(doc.get("items") or [])
        else:
            out.append(doc)
    return out


def cronjobs_to_values(
    docs: Sequence[Any], *, entrypoint: Sequence[str] = (), cmd: Sequence[str] = ()
) -> Imported:
    """Chart values with one task per CronJob; raises Refused naming the first field it cannot
    carry over."""
    tasks: Doc = {}
    pull_secrets: list[Any] = []
    namespaces: set[str] = set()
    imported = Imported({}, None)
    for number, doc in enumerate(docs, 1):
        where = f"document {number}"
        if not isinstance(doc, Mapping):
            raise Refused(f"{where}: expected a CronJob mapping, got {type(doc).__name__}")
        if doc.get("kind") in SELECTING_KINDS:
            imported.warnings.append(_selector_warning(doc))
            continue
        if doc.get("kind") != "CronJob":
            raise Refused(
                f"{where}.kind: {doc.get('kind')!r}: only CronJobs (batch/v1) can be imported"
            )
        if doc.get("apiVersion") != "batch/v1":
            raise Refused(f"{where}.apiVersion: {doc.get('apiVersion')!r}: expected batch/v1")
        name, task, secrets, namespace = _cronjob(where, doc, entrypoint, cmd)
        imported.changes[name] = task.pop("_changes")
        imported.warnings += task.pop("_warnings")
        key = name[:TASK_KEY_MAX].rstrip("-")
        if key in tasks:
            raise Refused(f"{where}.metadata.name: {name!r}: a second CronJob with this task key")
        tasks[key] = task
        if namespace:
            namespaces.add(namespace)
        # The chart's pull secrets are release-wide: every task gets them all, which costs
        # an image nothing that it does not need.
        pull_secrets += [s for s in secrets if s not in pull_secrets]
    if len(namespaces) > 1:
        raise Refused(
            f"metadata.namespace: the CronJobs are in {', '.join(sorted(namespaces))}: a release "
            "lives in one namespace; import each namespace's CronJobs on their own"
        )
    if not tasks:
        raise Refused("import: no CronJob in the input, only objects that select pods")
    if pull_secrets:
        imported.values["imagePullSecrets"] = pull_secrets
    imported.values["tasks"] = tasks
    imported.namespace = next(iter(namespaces), None)
    return imported


def _selector_warning(doc: Mapping[str, Any]) -> str:
    name = (doc.get("metadata") or {}).get("name", "?")
    return (
        f"{doc.get('kind')} {name} selects pods by label and is not imported: apply it as "
        "before. The imported pods keep their own labels, so it selects them as it did; the "
        f"chart's labels are its own, under {CHART_LABEL_PREFIX}"
    )


def _cronjob(
    where: str, doc: Mapping[str, Any], entrypoint: Sequence[str], cmd: Sequence[str]
) -> tuple[str, Doc, list[Any], str | None]:
    top = _Fields(where, doc)
    top.take("apiVersion")
    top.take("kind")
    top.take("status")
    meta = _Fields(f"{where}.metadata", top.required("metadata", Mapping))
    name = meta.required("name", str)
    if not DNS_LABEL.match(name) or len(name) > 52:
        raise Refused(
            f"{where}.metadata.name: {name!r}: a CronJob name the chart keeps must be a DNS label "
            "of at most 52 characters"
        )
    where = f"CronJob {name}"
    meta.where = f"{where}.metadata"
    namespace = meta.take("namespace", str)
    task: Doc = {"cronJobName": name}
    _object_meta(meta, task)
    spec = _Fields(f"{where}.spec", top.required("spec", Mapping))
    top.done()
    task["schedule"] = spec.required("schedule", str)
    if (zone := spec.take("timeZone", str)) is not None:
        task["timeZone"] = zone
    for key, default in CRONJOB_DEFAULTS.items():
        value = spec.take(key, (str, int, bool), default)
        if key == "suspend":
            if value:
                task["suspend"] = True
        else:
            task[key] = value

    job_template = _Fields(f"{spec.where}.jobTemplate", spec.required("jobTemplate", Mapping))
    spec.done()
    _template_meta(job_template, task, "job")
    job = _Fields(f"{job_template.where}.spec", job_template.required("spec", Mapping))
    job_template.done()
    job.drop_defaults(SERVER_DEFAULTS)
    for key, default in JOB_DEFAULTS.items():
        task[key] = job.take(key, int, default)
    policy = job.take("podFailurePolicy", Mapping)
    template = _Fields(f"{job.where}.template", job.required("template", Mapping))
    _template_meta(template, task, "pod")
    pod = _Fields(f"{template.where}.spec", template.required("spec", Mapping))
    template.done()
    job.done()

    task["_changes"] = changes = []
    task["_warnings"] = []
    secrets = _pod(task, pod, entrypoint, cmd)
    task["podFailurePolicy"] = _failure_policy(policy, task)
    _overlap(task)
    changes += _runner_changes(name[:TASK_KEY_MAX].rstrip("-"), task["containerName"])
    first = (
        "schedule", "timeZone", "suspend", "cronJobName", "containerName", "runner", "image",
        "command", "args", "overlap",
    )  # fmt: skip
    ordered = {key: task[key] for key in first if key in task}
    return name, {**ordered, **task}, secrets, namespace


def _runner_changes(key: str, container: str) -> list[str]:
    """What the chart changes in every imported CronJob: what running under the runner takes."""
    return [
        f"container {container}: its command runs under "
        f"`/cron-runner/cron-runner exec --name {key} --`, which "
        "holds the slot's lease around it",
        f"container {container}: CRON_RUNNER_* environment variables (and the Redis "
        "password and CA files, once you set them): the runner's settings",
        "init container cron-runner-inject and emptyDir volume cron-runner: they copy the "
        "runner into the app's own image",
        f"labels {CHART_LABEL_PREFIX}name, instance, component on the CronJob, Job template and "
        f"pod, and {CHART_LABEL_PREFIX}inject on the pod: the chart finds its objects by them",
        "label app.kubernetes.io/managed-by: Helm on the CronJob: Helm adopts it by this label",
    ]


def _template_meta(template: _Fields, task: Doc, prefix: str) -> None:
    """A Job or pod template's labels and annotations, kept as the task's jobLabels,
    jobAnnotations, podLabels and podAnnotations."""
    meta = _Fields(f"{template.where}.metadata", template.take("metadata", Mapping) or {})
    meta.take("creationTimestamp")
    if labels := meta.take("labels", Mapping):
        task[f"{prefix}Labels"] = _own_labels(f"{meta.where}.labels", labels)
    if annotations := meta.take("annotations", Mapping):
        task[f"{prefix}Annotations"] = _strings(f"{meta.where}.annotations", annotations)
    meta.done()


def _object_meta(meta: _Fields, task: Doc) -> None:
    for key in OBJECT_META_DROPPED:
        meta.take(key)
    if labels := meta.take("labels", Mapping):
        task["labels"] = _own_labels(f"{meta.where}.labels", labels)
    annotations = dict(meta.take("annotations", Mapping) or {})
    annotations.pop(LAST_APPLIED, None)
    if annotations:
        task["annotations"] = _strings(f"{meta.where}.annotations", annotations)
    meta.done()


def _pod(task: Doc, pod: _Fields, entrypoint: Sequence[str], cmd: Sequence[str]) -> list[Any]:
    pod.drop_defaults(SERVER_DEFAULTS)
    # Kubernetes' default, which the chart's (off) must not replace: an app may read them.
    task["enableServiceLinks"] = pod.take("enableServiceLinks", bool, True)
    task["restartPolicy"] = pod.take("restartPolicy", str, "Never")
    if task["restartPolicy"] not in ("Never", "OnFailure"):
        raise Refused(
            f"{pod.where}.restartPolicy: {task['restartPolicy']!r}: expected Never or OnFailure"
        )
    grace = pod.take("terminationGracePeriodSeconds", int, 30)
    if grace < 6:
        raise Refused(
            f"{pod.where}.terminationGracePeriodSeconds: {grace}: the chart needs at least 6 (the "
            "runner gets 5 s less to stop the command and release its lease)"
        )
    task["terminationGracePeriodSeconds"] = grace
    account = pod.take("serviceAccountName", str)
    legacy = pod.take("serviceAccount", str)
    task["serviceAccountName"] = account or legacy or "default"
    task["automountServiceAccountToken"] = pod.take("automountServiceAccountToken", bool, True)
    task["podSecurityContext"] = pod.take("securityContext", Mapping) or {}
    task["nodeSelector"] = dict(pod.take("nodeSelector", Mapping) or {})
    task["tolerations"] = list(pod.take("tolerations", list) or [])
    task["affinity"] = dict(pod.take("affinity", Mapping) or {})
    if task["affinity"].get("podAntiAffinity") or task["affinity"].get("podAffinity"):
        task["_warnings"].append(
            f"{pod.where}.affinity: pod (anti-)affinity selects pods by label; the pods keep "
            "their own labels, so it matches as it did"
        )
    if spread := pod.take("topologySpreadConstraints", list):
        task["topologySpreadConstraints"] = spread
        task["_warnings"].append(
            f"{pod.where}.topologySpreadConstraints: selects pods by label; the pods keep their "
            "own labels, so it matches as it did"
        )
    task["priorityClassName"] = pod.take("priorityClassName", str) or ""
    task["initContainers"] = pod.take("initContainers", list) or []
    secrets = pod.take("imagePullSecrets", list) or []

    task["extraVolumes"] = _none_of_the_charts(pod, "volumes")
    containers = pod.required("containers", list)
    if not containers:
        raise Refused(f"{pod.where}.containers: empty: a CronJob needs a container to run")
    _container(task, f"{pod.where}.containers[0]", containers[0], entrypoint, cmd)
    task["extraContainers"] = list(containers[1:])
    if (os_name := (pod.left.get("os") or {}).get("name")) not in (None, "linux"):
        raise Refused(f"{pod.where}.os.name: {os_name!r}: the runner runs on Linux only")
    # The pod fields the chart writes nothing for (DNS settings, host aliases, a runtime
    # class, ...) go over as they are.
    if rest := pod.rest():
        task["extraPodSpec"] = rest
    _tmp(task)
    return list(secrets)


def _tmp(task: Doc) -> None:
    """The chart's rule for /tmp (cronjobs.yaml): a writable emptyDir where the container's
    root is read-only and it mounts nothing at /tmp; a CronJob that had neither gains one."""
    if not task["securityContext"].get("readOnlyRootFilesystem"):
        return
    if any(m.get("mountPath") == "/tmp" for m in task["extraVolumeMounts"]):  # noqa: S108
        return
    if any(v.get("name") == "tmp" for v in task["extraVolumes"]):
        raise Refused(
            f"CronJob {task['cronJobName']}: a volume named tmp, not mounted at /tmp: the chart "
            "mounts its own tmp there on a read-only root; rename the volume"
        )
    task["_changes"].append(
        f"container {task['containerName']}: an emptyDir at /tmp: the chart gives one to a "
        "read-only root filesystem"
    )


def _container(
    task: Doc, where: str, container: Any, entrypoint: Sequence[str], cmd: Sequence[str]
) -> None:
    c = _Fields(where, container)
    c.drop_defaults(SERVER_DEFAULTS)
    task["containerName"] = c.required("name", str)
    task["image"] = _image(f"{where}.image", c.required("image", str))
    # Unset, Kubernetes pulls :latest (or an untagged, undigested image) always, else if absent.
    latest = task["image"].get("tag", "latest" if "digest" not in task["image"] else "") == "latest"
    task["image"]["pullPolicy"] = c.take("imagePullPolicy", str) or (
        "Always" if latest else "IfNotPresent"
    )
    task["runner"] = {"inject": "initContainer"}
    command = c.take("command", list)
    args = c.take("args", list)
    if command:
        task["command"] = [str(a) for a in command]
    else:
        # Kubernetes cannot read the image's ENTRYPOINT and CMD, and neither can we.
        if not (entrypoint or cmd):
            raise Refused(
                f"{where}.command: not set, so the image's own ENTRYPOINT and CMD run, which a "
                "manifest does not show: give them with --entrypoint and --cmd (from `docker "
                "image inspect`), or set command in the manifest"
            )
        if entrypoint:
            task["image"]["entrypoint"] = list(entrypoint)
        if cmd:
            task["image"]["cmd"] = list(cmd)
    if args:
        task["args"] = [str(a) for a in args]
    if (working_dir := c.take("workingDir", str)) is not None:
        task["workingDir"] = working_dir
    task["env"] = _env(f"{where}.env", c.take("env", list) or [])
    if env_from := c.take("envFrom", list):
        task["envFrom"] = env_from
    if ports := c.take("ports", list):
        task["ports"] = ports
    task["resources"] = c.take("resources", Mapping) or {}
    task["securityContext"] = c.take("securityContext", Mapping) or {}
    task["extraVolumeMounts"] = _none_of_the_charts(c, "volumeMounts")
    if rest := c.rest():
        task["extraContainerSpec"] = rest


def _none_of_the_charts(fields: _Fields, name: str) -> list[Any]:
    """The list ``name`` of ``fields`` (a pod's volumes, a container's mounts), refused if an
    item takes a name or path that the chart gives its own."""
    field, charts, why = CHARTS_OWN[name]
    items = fields.take(name, list) or []
    for i, item in enumerate(items):
        if isinstance(item, Mapping) and item.get(field) in charts:
            raise Refused(f"{fields.where}.{name}[{i}].{field}: {item[field]!r}{why}")
    return items


def _image(where: str, reference: str) -> Doc:
    """repository[:tag][@digest], where a registry's :port is not a tag."""
    rest, _, digest = reference.partition("@")
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    image: Doc = {"repository": rest}
    if colon > slash:
        image = {"repository": rest[:colon], "tag": rest[colon + 1 :]}
    if not image["repository"]:
        raise Refused(f"{where}: {reference!r}: no repository")
    if digest:
        image["digest"] = digest
    return image


def _env(where: str, entries: Iterable[Any]) -> Doc:
    """An EnvVar list as the chart's env map, which the chart writes sorted by name, after its
    own: a $(VAR) reference must still point at a variable defined before it."""
    env: Doc = {}
    for i, entry in enumerate(entries):
        e = _Fields(f"{where}[{i}]", entry)
        name = e.required("name", str)
        if name in CHART_ENV:
            raise Refused(f"{where}[{i}].name: {name} is set by the chart and may not be given")
        value_from = e.take("valueFrom", Mapping)
        value = e.take("value", (str, int, float, bool))
        e.done()
        if name in env:
            raise Refused(f"{where}[{i}].name: {name} a second time")
        if value_from is not None:
            env[name] = {"valueFrom": dict(value_from)}
        else:
            env[name] = "" if value is None else str(value)
    for name, value in env.items():
        if not isinstance(value, str):
            continue
        for ref in ENV_REFERENCE.findall(value):
            if ref in env and ref >= name:
                raise Refused(
                    f"{where}: {name} refers to $({ref}), which the chart's env map would define "
                    f"after it (the map is sorted by name): rename one of them"
                )
    return env


def _failure_policy(policy: Mapping[str, Any] | None, task: Doc) -> Any:
    """The runner's rules first, for the container that runs it, then the CronJob's own. A
    Job that restarts its pods (OnFailure) can have none: it keeps its own (none)."""
    if task["restartPolicy"] != "Never":
        return dict(policy) if policy else None
    runner = [
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": task["containerName"],
                "operator": "In",
                "values": list(RUNNER_EXIT_CODES),
            },
        },
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    own = [dict(rule) for rule in (policy or {}).get("rules") or []]
    task["_changes"].append(
        f"podFailurePolicy: the runner's rules go before the Job's own: {RUNNER_CODES_REASON}; "
        "a pod evicted or preempted does not count against backoffLimit"
    )
    return {**(policy or {}), "rules": runner + [r for r in own if r not in runner]}


def _overlap(task: Doc) -> None:
    """The runner's overlap policy that does what the CronJob's concurrencyPolicy did, across
    every cluster and server that shares the lease (without it, the runner skips a slot while
    another runs)."""
    policy = task["concurrencyPolicy"]
    if policy in OVERLAP:
        task["overlap"] = OVERLAP[policy]
        task["_changes"].append(
            f"overlap: {OVERLAP[policy]}: what concurrencyPolicy {policy} does, kept: the "
            "runner applies it across clusters and servers (its default, skip, would not)"
        )


def _own_labels(where: str, labels: Mapping[str, Any]) -> dict[str, str]:
    for key in labels:
        if str(key).startswith(CHART_LABEL_PREFIX):
            raise Refused(
                f"{where}.{key}: labels under {CHART_LABEL_PREFIX} are the chart's own, by which "
                "it finds its objects; rename this label"
            )
    return _strings(where, labels)


def _strings(where: str, mapping: Mapping[str, Any]) -> dict[str, str]:
    for key, value in mapping.items():
        if not isinstance(value, str):
            raise Refused(f"{where}.{key}: expected a string, got {type(value).__name__}")
    return dict(mapping)


def _item(text: str) -> list[str]:
    return textwrap.wrap(
        text, 94, initial_indent="  - ", subsequent_indent="    ", break_on_hyphens=False
    )


def render_values(imported: Imported, sources: Sequence[str]) -> str:
    namespace = imported.namespace or "NAMESPACE"
    lines = [
        f"Chart values from `cron-runner import {' '.join(sources)}`: each CronJob runs",
        "in its own image, with the runner injected (runner.inject: initContainer).",
        "Add where the leases live (redis.host, or redis.url), then:",
        f"  helm upgrade --install cron-runner charts/cron-runner -n {namespace} -f FILE",
        "Their names are kept (cronJobName): annotate and label each CronJob for the release",
        "first (docs/adoption.md), and Helm takes it over in place.",
        "",
        "What the chart changes in each CronJob, and why; nothing else changes:",
    ]
    for name, changes in imported.changes.items():
        lines.append(f"{name}:")
        lines += [line for change in changes for line in _item(change)]
    if imported.warnings:
        lines += ["", "Check:"]
        lines += [line for warning in imported.warnings for line in _item(warning)]
    header = "".join(f"# {line}".rstrip() + "\n" for line in lines)
    return header + yaml.safe_dump(imported.values, sort_keys=False, width=100)
