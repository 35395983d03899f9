"""`cron-runner import`: chart values that reproduce existing CronJobs under the runner.

Each CronJob becomes one task with ``runner.inject: initContainer``: its own image, command,
schedule, time zone, history limits, pod settings and name. What the chart then changes is
what the runner must: the container's name and command, the ``CRON_RUNNER_*`` environment,
the init container and emptyDir that bring the runner, a writable /tmp, no service links.
A field the chart cannot carry over is refused (ConfigError, exit 78), naming it.

Only the CLI's `import` loads this module (and PyYAML, the `import` extra): `run` and `exec`
never do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
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
CHART_VOLUMES = {"tmp", "cron-runner", "redis-tls"}
CHART_MOUNT_PATHS = {"/tmp", "/cron-runner"}  # noqa: S108 - the chart's mounts, not files
# A list of the pod spec -> the field that names an item, the chart's own, and why not.
CHARTS_OWN: dict[str, tuple[str, set[str], str]] = {
    "volumes": ("name", CHART_VOLUMES, " is the chart's own volume; rename it (and its mounts)"),
    "volumeMounts": ("mountPath", CHART_MOUNT_PATHS, ": the chart mounts its own volume there"),
}
# The labels the chart gives every task pod, which select them; a pod label may not replace them.
CHART_POD_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
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
) -> tuple[Doc, str | None]:
    """Chart values with one task per CronJob, and the CronJobs' namespace if they name one;
    raises Refused naming the first field it cannot carry over."""
    tasks: Doc = {}
    pull_secrets: list[Any] = []
    namespaces: set[str] = set()
    for number, doc in enumerate(docs, 1):
        where = f"document {number}"
        if not isinstance(doc, Mapping):
            raise Refused(f"{where}: expected a CronJob mapping, got {type(doc).__name__}")
        if doc.get("kind") != "CronJob":
            raise Refused(
                f"{where}.kind: {doc.get('kind')!r}: only CronJobs (batch/v1) can be imported"
            )
        if doc.get("apiVersion") != "batch/v1":
            raise Refused(f"{where}.apiVersion: {doc.get('apiVersion')!r}: expected batch/v1")
        name, task, secrets, namespace = _cronjob(where, doc, entrypoint, cmd)
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
    values: Doc = {}
    if pull_secrets:
        values["imagePullSecrets"] = pull_secrets
    values["tasks"] = tasks
    return values, next(iter(namespaces), None)


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
    job_meta = _Fields(
        f"{job_template.where}.metadata", job_template.take("metadata", Mapping) or {}
    )
    job_meta.take("creationTimestamp")
    job_meta.done()
    job = _Fields(f"{job_template.where}.spec", job_template.required("spec", Mapping))
    job_template.done()
    job.drop_defaults(SERVER_DEFAULTS)
    for key, default in JOB_DEFAULTS.items():
        task[key] = job.take(key, int, default)
    policy = job.take("podFailurePolicy", Mapping)
    template = _Fields(f"{job.where}.template", job.required("template", Mapping))
    pod_meta = _Fields(f"{template.where}.metadata", template.take("metadata", Mapping) or {})
    pod_meta.take("creationTimestamp")
    if labels := pod_meta.take("labels", Mapping):
        task["podLabels"] = _strings(f"{pod_meta.where}.labels", labels)
        for key in CHART_POD_LABELS & set(labels):
            raise Refused(
                f"{pod_meta.where}.labels.{key}: the chart's pods carry their own {key} (the "
                "NetworkPolicy and `kubectl logs -l` select on it); rename this label"
            )
    if annotations := pod_meta.take("annotations", Mapping):
        task["podAnnotations"] = _strings(f"{pod_meta.where}.annotations", annotations)
    pod_meta.done()
    pod = _Fields(f"{template.where}.spec", template.required("spec", Mapping))
    template.done()
    job.done()

    secrets = _pod(task, pod, entrypoint, cmd)
    task["podFailurePolicy"] = _failure_policy(f"{job.where}.podFailurePolicy", policy, task)
    first = ("schedule", "timeZone", "suspend", "cronJobName", "runner", "image", "command", "args")
    ordered = {key: task[key] for key in first if key in task}
    return name, {**ordered, **task}, secrets, namespace


def _object_meta(meta: _Fields, task: Doc) -> None:
    for key in OBJECT_META_DROPPED:
        meta.take(key)
    if labels := meta.take("labels", Mapping):
        task["labels"] = _strings(f"{meta.where}.labels", labels)
    annotations = dict(meta.take("annotations", Mapping) or {})
    annotations.pop(LAST_APPLIED, None)
    if annotations:
        task["annotations"] = _strings(f"{meta.where}.annotations", annotations)
    meta.done()


def _pod(task: Doc, pod: _Fields, entrypoint: Sequence[str], cmd: Sequence[str]) -> list[Any]:
    pod.drop_defaults(SERVER_DEFAULTS)
    # The chart turns service links off in every pod: Services are found through DNS.
    pod.take("enableServiceLinks", bool)
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
    task["priorityClassName"] = pod.take("priorityClassName", str) or ""
    task["initContainers"] = pod.take("initContainers", list) or []
    secrets = pod.take("imagePullSecrets", list) or []

    task["extraVolumes"] = _none_of_the_charts(pod, "volumes")
    containers = pod.required("containers", list)
    if not containers:
        raise Refused(f"{pod.where}.containers: empty: a CronJob needs a container to run")
    _container(task, f"{pod.where}.containers[0]", containers[0], entrypoint, cmd)
    task["extraContainers"] = list(containers[1:])
    pod.done()
    return list(secrets)


def _container(
    task: Doc, where: str, container: Any, entrypoint: Sequence[str], cmd: Sequence[str]
) -> None:
    c = _Fields(where, container)
    c.drop_defaults(SERVER_DEFAULTS)
    task["_container"] = c.required("name", str)
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
    task["resources"] = c.take("resources", Mapping) or {}
    task["securityContext"] = c.take("securityContext", Mapping) or {}
    task["extraVolumeMounts"] = _none_of_the_charts(c, "volumeMounts")
    c.done()


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


def _failure_policy(where: str, policy: Mapping[str, Any] | None, task: Doc) -> Any:
    """The CronJob's own policy, with its container's new name; none if it had none."""
    container = task.pop("_container")
    if policy is None:
        return None
    rules = []
    for given in policy.get("rules") or []:
        rule = dict(given)
        codes = rule.get("onExitCodes")
        if isinstance(codes, Mapping) and codes.get("containerName") not in (None, container):
            raise Refused(
                f"{where}: a rule for container {codes['containerName']!r}: only the CronJob's "
                "first container is carried over with its policy"
            )
        if isinstance(codes, Mapping) and "containerName" in codes:
            rule["onExitCodes"] = {**codes, "containerName": "cron-runner"}
        rules.append(rule)
    return {**policy, "rules": rules}


def _strings(where: str, mapping: Mapping[str, Any]) -> dict[str, str]:
    for key, value in mapping.items():
        if not isinstance(value, str):
            raise Refused(f"{where}.{key}: expected a string, got {type(value).__name__}")
    return dict(mapping)


def render_values(values: Doc, sources: Sequence[str], namespace: str | None) -> str:
    header = (
        f"# Chart values from `cron-runner import {' '.join(sources)}`: each CronJob runs\n"
        "# in its own image, with the runner injected (runner.inject: initContainer).\n"
        "# Add where the leases live (redis.host, or redis.url), then:\n"
        f"#   helm upgrade --install cron-runner charts/cron-runner -n {namespace or 'NAMESPACE'} -f FILE\n"
        "# Their names are kept (cronJobName): annotate and label each CronJob for the release\n"
        "# first (docs/kubernetes.md), and Helm takes it over in place.\n"
    )
    return header + yaml.safe_dump(values, sort_keys=False, width=100)
