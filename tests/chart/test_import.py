"""`cron-runner import`: real CronJob manifests in, chart values out, and the chart's render of
those values is the original CronJob, but for what the runner must change."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart

from runner.errors import ConfigError
from tests.chart.helpers import ROOT, Manifest, pod_spec, render, selects
from tests.chart.test_matrix import KUBE_VERSIONS, schema_errors

MANIFESTS = Path(__file__).parent / "cronjobs"
FILES = sorted(MANIFESTS.glob("*.yaml"))
CLI = [sys.executable, "-m", "runner"]
# What Kubernetes fills in when a manifest leaves it out, and the chart writes out.
K8S_DEFAULTS = {
    "concurrencyPolicy": "Allow",
    "successfulJobsHistoryLimit": 3,
    "failedJobsHistoryLimit": 1,
    "suspend": False,
}
SERVER_NOISE = {"status"}


def run_import(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRON_RUNNER_")}
    return subprocess.run(
        [*CLI, "import", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**env, "CRON_RUNNER_LOG_FORMAT": "text"},
        check=False,
    )


def imported(*args: str, stdin: str | None = None) -> dict[str, Any]:
    done = run_import(*args, stdin=stdin)
    assert done.returncode == 0, done.stderr
    values: dict[str, Any] = yaml.safe_load(done.stdout)
    return values


def originals(path: Path) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def expected(original: Manifest) -> Manifest:
    """The original as the API server holds it, without what only the server writes."""
    cj = copy.deepcopy(original)
    for key in SERVER_NOISE:
        cj.pop(key, None)
    meta = cj["metadata"]
    for key in ("uid", "resourceVersion", "generation", "creationTimestamp", "namespace"):
        meta.pop(key, None)
    meta.get("annotations", {}).pop("kubectl.kubernetes.io/last-applied-configuration", None)
    if not meta.get("annotations"):
        meta.pop("annotations", None)
    spec = cj["spec"]
    for key, value in K8S_DEFAULTS.items():
        spec.setdefault(key, value)
    job = spec["jobTemplate"]
    job.setdefault("metadata", {}).pop("creationTimestamp", None)
    if not job["metadata"]:
        del job["metadata"]
    job["spec"].setdefault("backoffLimit", 6)
    template = job["spec"]["template"]
    template.setdefault("metadata", {}).pop("creationTimestamp", None)
    pod = template["spec"]
    for key, value in {"dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler"}.items():
        if pod.get(key) == value:
            del pod[key]
    pod.pop("serviceAccount", None)
    pod.setdefault("serviceAccountName", "default")
    pod.setdefault("automountServiceAccountToken", True)
    pod.setdefault("terminationGracePeriodSeconds", 30)
    pod.setdefault("securityContext", {})
    pod.setdefault("enableServiceLinks", True)
    main = pod["containers"][0]
    for key in ("terminationMessagePath", "terminationMessagePolicy"):
        main.pop(key, None)
    main.setdefault("securityContext", {})
    tag = main["image"].rpartition("/")[2]
    main.setdefault("imagePullPolicy", "IfNotPresent" if ":" in tag or "@" in tag else "Always")
    return cj


def changes_of(printed: str) -> dict[str, str]:
    """The changes the header of `import`'s output lists, as one text per CronJob."""
    header = [line[2:] for line in printed.splitlines() if line.startswith("#")]
    listed: dict[str, str] = {}
    name = ""
    for line in header[
        header.index("What the chart changes in each CronJob, and why; nothing else changes:") + 1 :
    ]:
        if not line:
            break
        if not line.startswith(" "):
            name = line[:-1]
            listed[name] = ""
        else:
            listed[name] += " " + line.strip()
    return listed


def without_chart_labels(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if not k.startswith("cron-runner.io/")}


def labels_removed(cj: Manifest, original: Manifest, listed: str) -> None:
    """The chart's own labels, and Helm's managed-by, taken off again: both listed."""
    meta = cj["metadata"]
    meta.pop("namespace")
    assert "labels cron-runner.io/name, instance, component on the CronJob, Job template" in listed
    assert "label app.kubernetes.io/managed-by: Helm on the CronJob" in listed
    own = original["metadata"].get("labels", {})
    labels = without_chart_labels(meta["labels"])
    assert labels.pop("app.kubernetes.io/managed-by") == "Helm"
    if "app.kubernetes.io/managed-by" in own:
        labels["app.kubernetes.io/managed-by"] = own["app.kubernetes.io/managed-by"]
    meta["labels"] = labels
    if not labels:
        del meta["labels"]
    job = cj["spec"]["jobTemplate"]
    job["metadata"]["labels"] = without_chart_labels(job["metadata"]["labels"])
    if not job["metadata"]["labels"]:
        del job["metadata"]["labels"]
    if not job["metadata"]:
        del job["metadata"]
    template = job["spec"]["template"]
    pod_labels = without_chart_labels(template["metadata"]["labels"])
    assert template["metadata"]["labels"]["cron-runner.io/inject"] == "initContainer"
    template["metadata"]["labels"] = pod_labels
    if not pod_labels:
        del template["metadata"]["labels"]


def runner_removed(rendered: Manifest, original: Manifest, key: str, listed: str) -> Manifest:
    """The rendered CronJob with exactly the changes `import` listed taken out again, checking
    that each was listed."""
    cj = copy.deepcopy(rendered)
    labels_removed(cj, original, listed)
    job = cj["spec"]["jobTemplate"]
    template = job["spec"]["template"]
    pod = template["spec"]
    assert "init container cron-runner-inject and emptyDir volume cron-runner" in listed
    inject = pod["initContainers"].pop()
    assert inject["name"] == "cron-runner-inject"
    assert inject["command"] == ["cp", "-R", "/opt/cron-runner-bin/.", "/cron-runner/"]
    if not pod["initContainers"]:
        del pod["initContainers"]
    main = pod["containers"][0]
    first = original["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert main["name"] == first["name"], "the container keeps its name"
    tmp = "an emptyDir at /tmp" in listed
    chart_volumes = {"cron-runner", "tmp"} if tmp else {"cron-runner"}
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in chart_volumes]
    if not pod["volumes"]:
        del pod["volumes"]
    assert f"container {first['name']}: its command runs under" in listed
    assert main.pop("command") == ["/cron-runner/cron-runner"]
    args = main.pop("args")
    assert args[:4] == ["exec", "--name", key, "--"]
    assert args[4:] == first.get("command", []) + first.get("args", [])
    for field in ("command", "args"):
        if field in first:
            main[field] = first[field]
    assert f"container {first['name']}: CRON_RUNNER_* environment variables" in listed
    env = [e for e in main["env"] if not e["name"].startswith("CRON_RUNNER_")]
    assert {e["name"] for e in main["env"]} - {e["name"] for e in env} >= {
        "CRON_RUNNER_JOB_NAME",
        "CRON_RUNNER_REDIS_URL",
    }
    by_name = {e["name"]: e for e in env}
    main["env"] = [by_name[e["name"]] for e in first.get("env", [])]
    assert len(main["env"]) == len(env)
    if not main["env"]:
        del main["env"]
    main["volumeMounts"] = [m for m in main["volumeMounts"] if m["name"] not in chart_volumes]
    if not main["volumeMounts"]:
        del main["volumeMounts"]
    policy = job["spec"].get("podFailurePolicy")
    own_policy = original["spec"]["jobTemplate"]["spec"].get("podFailurePolicy")
    if policy != own_policy:
        assert "podFailurePolicy: the runner's rules go before the Job's own" in listed
        runner_rules = policy["rules"][:2]
        assert runner_rules[0]["onExitCodes"] == {
            "containerName": first["name"], "operator": "In", "values": [64, 78, 79, 126, 127],
        }  # fmt: skip
        rest = [r for r in policy["rules"][2:]]
        assert rest == [r for r in (own_policy or {}).get("rules", []) if r not in runner_rules]
        if own_policy:
            job["spec"]["podFailurePolicy"] = own_policy
        else:
            del job["spec"]["podFailurePolicy"]
    return cj


def sort_volume_keys(cj: Manifest) -> Manifest:
    """Lists of named objects compared by content; YAML key order never matters."""
    plain: Manifest = yaml.safe_load(yaml.safe_dump(cj, sort_keys=True))
    return plain


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_render_is_the_original_but_for_what_the_runner_changes(
    chart: Chart, path: Path
) -> None:
    done = run_import(str(path))
    assert done.returncode == 0, done.stderr
    values = yaml.safe_load(done.stdout)
    listed = changes_of(done.stdout)
    rendered = render(chart, {**values, "redis": {"host": "redis"}}, namespace="shop")
    by_name = {d["metadata"]["name"]: d for d in rendered.of_kind("CronJob")}
    docs = [d for d in originals(path) if d["kind"] == "CronJob"]
    assert set(by_name) == {d["metadata"]["name"] for d in docs} == set(listed)
    for original in docs:
        name = original["metadata"]["name"]
        key = next(k for k, t in values["tasks"].items() if t["cronJobName"] == name)
        got = runner_removed(by_name[name], original, key, listed[name])
        assert sort_volume_keys(got) == sort_volume_keys(expected(original))
        errors = [e for v in KUBE_VERSIONS for e in schema_errors(by_name[name], v)]
        assert errors == []


def test_the_app_image_user_and_environment_are_kept(chart: Chart) -> None:
    values = imported(str(MANIFESTS / "laravel-reports.yaml"))
    task = values["tasks"]["laravel-reports"]
    assert task["runner"] == {"inject": "initContainer"}
    assert task["image"] == {
        "repository": "registry.example.com/shop/app",
        "tag": "2026.11.3",
        "pullPolicy": "IfNotPresent",
    }
    cj = render(chart, {**values, "redis": {"host": "redis"}}).one("CronJob", "laravel-reports")
    spec = pod_spec(cj)
    assert spec["securityContext"] == {
        "runAsUser": 33,
        "runAsGroup": 33,
        "runAsNonRoot": True,
        "fsGroup": 33,
    }
    assert spec["containers"][0]["workingDir"] == "/var/www/html"
    # The NOTES say that this task leaves the chart's restricted defaults.
    notes = render(chart, {**values, "redis": {"host": "redis"}}).notes
    assert "WARNING: task laravel-reports loosens the chart's restricted security defaults" in notes


def test_stdin_several_documents_and_a_list(chart: Chart) -> None:
    docs = [d for p in FILES for d in originals(p) if d["kind"] == "CronJob"]
    as_list = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": docs[:2]})
    rest = yaml.safe_dump_all(docs[2:])
    values = imported("-", stdin=as_list + "---\n" + rest)
    assert sorted(t["cronJobName"] for t in values["tasks"].values()) == sorted(
        d["metadata"]["name"] for d in docs
    )
    # Pull secrets are release-wide in the chart: the union of the CronJobs'.
    assert values["imagePullSecrets"] == [{"name": "regcred"}]


def test_the_images_own_entrypoint_and_cmd_come_from_flags(chart: Chart) -> None:
    manifest = yaml.safe_dump(
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "artisan-schedule"},
            "spec": {
                "schedule": "* * * * *",
                "jobTemplate": {
                    "spec": {
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [{"name": "app", "image": "php:8.3-cli"}],
                            }
                        }
                    }
                },
            },
        }
    )
    done = run_import("-", stdin=manifest)
    assert done.returncode == ConfigError.exit_code
    assert "containers[0].command: not set" in done.stderr
    assert "--entrypoint" in done.stderr
    values = imported(
        "--entrypoint", "docker-php-entrypoint", "--cmd", "php artisan schedule:run", stdin=manifest
    )
    image = values["tasks"]["artisan-schedule"]["image"]
    assert image["entrypoint"] == ["docker-php-entrypoint"]
    assert image["cmd"] == ["php", "artisan", "schedule:run"]
    cj = render(chart, {**values, "redis": {"host": "redis"}}).one("CronJob", "artisan-schedule")
    assert pod_spec(cj)["containers"][0]["args"][4:] == [
        "docker-php-entrypoint",
        "php",
        "artisan",
        "schedule:run",
    ]


def cronjob(**pod: Any) -> dict[str, Any]:
    container = {"name": "job", "image": "busybox:1.36", "command": ["true"]}
    container.update(pod.pop("container", {}))
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "broken", "namespace": "shop"},
        "spec": {
            "schedule": "* * * * *",
            "jobTemplate": {
                "spec": {"template": {"spec": {"containers": [container], **pod}}},
            },
        },
    }


BROKEN = [
    ("not yaml", "kind: CronJob\n  spec: [", "stdin: not valid YAML"),
    (
        "a Deployment",
        yaml.safe_dump({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}),
        "document 1.kind: 'Deployment': only CronJobs",
    ),
    (
        "no schedule",
        yaml.safe_dump({**cronjob(), "spec": {"jobTemplate": cronjob()["spec"]["jobTemplate"]}}),
        "CronJob broken.spec.schedule: required, but missing",
    ),
    (
        "a Windows pod",
        yaml.safe_dump(cronjob(os={"name": "windows"})),
        "CronJob broken.spec.jobTemplate.spec.template.spec.os.name: 'windows': the runner runs",
    ),
    (
        "several completions",
        yaml.safe_dump(
            cronjob()
            | {
                "spec": {
                    "schedule": "* * * * *",
                    "jobTemplate": {
                        "spec": {"completions": 3, **cronjob()["spec"]["jobTemplate"]["spec"]}
                    },
                }
            }
        ),
        "CronJob broken.spec.jobTemplate.spec.completions: the chart cannot carry",
    ),
    (
        "no containers",
        yaml.safe_dump(
            cronjob()
            | {
                "spec": {
                    "schedule": "* * * * *",
                    "jobTemplate": {"spec": {"template": {"spec": {"containers": []}}}},
                }
            }
        ),
        "template.spec.containers: empty",
    ),
    (
        "a mount where the runner goes",
        yaml.safe_dump(
            cronjob(container={"volumeMounts": [{"name": "t", "mountPath": "/cron-runner"}]})
        ),
        "containers[0].volumeMounts[0].mountPath: '/cron-runner': the chart mounts its own",
    ),
    (
        "a volume named as the chart's",
        yaml.safe_dump(cronjob(volumes=[{"name": "cron-runner", "emptyDir": {}}])),
        "template.spec.volumes[0].name: 'cron-runner' is the chart's own volume; rename it",
    ),
    (
        "a label under the chart's own prefix",
        yaml.safe_dump(
            cronjob()
            | {
                "spec": {
                    "schedule": "* * * * *",
                    "jobTemplate": {
                        "spec": {
                            "template": {
                                "metadata": {"labels": {"cron-runner.io/component": "x"}},
                                "spec": cronjob()["spec"]["jobTemplate"]["spec"]["template"][
                                    "spec"
                                ],
                            }
                        }
                    },
                }
            }
        ),
        "template.metadata.labels.cron-runner.io/component: labels under cron-runner.io/ are",
    ),
    (
        "a short grace",
        yaml.safe_dump(cronjob(terminationGracePeriodSeconds=3)),
        "terminationGracePeriodSeconds: 3: the chart needs at least 6",
    ),
    (
        "a container that is not a map",
        yaml.safe_dump(
            cronjob()
            | {
                "spec": {
                    "schedule": "* * * * *",
                    "jobTemplate": {"spec": {"template": {"spec": {"containers": ["busybox"]}}}},
                }
            }
        ),
        "containers[0]: expected a mapping, got str",
    ),
    (
        "a schedule that is a number",
        yaml.safe_dump(cronjob() | {"spec": {**cronjob()["spec"], "schedule": 5}}),
        "CronJob broken.spec.schedule: expected str, got int",
    ),
]


BROKEN += [
    ("nothing at all", "", "import: no CronJob in -"),
    ("an empty list", "apiVersion: v1\nkind: List\nitems: []\n", "import: no CronJob in -"),
]


@pytest.mark.parametrize(("manifest", "says"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_a_malformed_or_unsupported_manifest_exits_with_the_config_code_naming_the_field(
    manifest: str, says: str
) -> None:
    done = run_import("-", stdin=manifest)
    assert done.returncode == ConfigError.exit_code, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("flag", ["--entrypoint", "--cmd"])
def test_an_unbalanced_quote_in_entrypoint_or_cmd_is_named(flag: str) -> None:
    done = run_import("-", flag, "'php artisan", stdin=yaml.safe_dump(cronjob()))
    assert done.returncode == ConfigError.exit_code, done.stderr
    assert flag in done.stderr and "Traceback" not in done.stderr


def test_an_unreadable_file_is_named() -> None:
    done = run_import("/nonexistent/cronjob.yaml")
    assert done.returncode == ConfigError.exit_code
    assert "cannot read /nonexistent/cronjob.yaml" in done.stderr


def test_the_adoption_page_shows_what_import_prints_for_its_example(chart: Chart) -> None:
    example = "examples/adopt/usage-report.yaml"
    printed = run_import(example).stdout
    assert printed and f"```yaml\n{printed}```" in (ROOT / "docs/adoption.md").read_text()
    values = yaml.safe_load(printed)
    original = originals(ROOT / example)[0]
    rendered = render(chart, {**values, "redis": {"host": "redis"}}, namespace="billing")
    listed = changes_of(printed)["usage-report"]
    got = runner_removed(rendered.one("CronJob", "usage-report"), original, "usage-report", listed)
    assert sort_volume_keys(got) == sort_volume_keys(expected(original))


def test_values_an_earlier_import_printed_still_render(chart: Chart) -> None:
    values = yaml.safe_load(
        (Path(__file__).parent / "previous/laravel-invoices-values.yaml").read_text()
    )
    rendered = render(chart, {**values, "redis": {"host": "redis"}}, namespace="shop")
    cj = rendered.one("CronJob", "shop-invoices")
    # The container the runner runs in is still named as then, and so is the one the failure
    # policy names; the pod's labels are the chart's own and the app's.
    main = pod_spec(cj)["containers"][0]
    assert main["name"] == "cron-runner"
    labels = cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert labels["cron-runner.io/component"] == "shop-invoices"
    errors = [e for v in KUBE_VERSIONS for e in schema_errors(cj, v)]
    assert errors == []


# What a line of `--diff` may add or remove: the changes `import` lists, and nothing else.
LISTED_IN_A_DIFF = (
    "cron-runner.io/", "app.kubernetes.io/managed-by: Helm", "CRON_RUNNER_", "podFailurePolicy",
    "cron-runner", "exec", "--name", "--", "fieldRef", "fieldPath", "valueFrom", "value:",
    "- name:", "rules:", "action:", "onExitCodes", "containerName", "operator: In", "values:",
    "onPodConditions", "status: 'True'", "type: DisruptionTarget", "- 64", "- 78", "- 79",
    "- 126", "- 127", "args:", "command:", "env:", "initContainers:", "volumeMounts:",
    "volumes:", "mountPath", "readOnly", "emptyDir", "sizeLimit", "image: ghcr.io/cron-runner",
    "imagePullPolicy: IfNotPresent", "resources: {}", "securityContext:", "runAsUser: 10001",
    "runAsGroup: 10001", "allowPrivilegeEscalation", "capabilities", "drop", "- ALL",
    "readOnlyRootFilesystem: true", "runAsNonRoot: true", "seccompProfile", "type: RuntimeDefault",
    "- cp", "- -R", "/opt/cron-runner-bin",
)  # fmt: skip


def test_diff_shows_the_original_next_to_the_render_with_only_the_listed_changes() -> None:
    path = MANIFESTS / "shop-labels.yaml"
    done = run_import("--diff", str(path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        "--- CronJob shop-feed (original)",
        "+++ CronJob shop-feed (rendered by the chart from the printed values)",
    ]
    changed = [line[1:].strip() for line in lines[2:] if line[:1] in "+-" and line[1:].strip()]
    assert changed
    for line in changed:
        assert any(token in line for token in (*LISTED_IN_A_DIFF, "- shop-feed")), line
    # The original command is still there, after the runner's `exec --name shop-feed --`.
    assert "-          - command:" in lines
    # What the app had stays: its labels, its container's name, its ports.
    assert not [line for line in lines if line.startswith("-") and "app.kubernetes.io/name" in line]


def test_diff_without_helms_engine_says_how_to_get_it() -> None:
    blocked = (
        "import sys; sys.modules['helm_python'] = None; from runner.cli.main import main; "
        f"sys.exit(main(['import', '--diff', {str(MANIFESTS / 'shop-labels.yaml')!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "CRON_RUNNER_LOG_FORMAT": "text"}, check=False,
    )  # fmt: skip
    assert done.returncode == ConfigError.exit_code, done.stderr
    assert "pip install 'redis-cron-runner[import-diff]'" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_what_selects_the_pods_by_label_is_named_and_still_selects_them(chart: Chart) -> None:
    path = MANIFESTS / "shop-labels.yaml"
    done = run_import(str(path))
    assert done.returncode == 0, done.stderr
    for says in (
        "NetworkPolicy shop-feed-egress selects pods by label and is not imported",
        "PodMonitor shop-feed selects pods by label and is not imported",
        "spec.affinity: pod (anti-)affinity selects pods by label",
        "spec.topologySpreadConstraints: selects pods by label",
    ):
        assert says in done.stderr
        assert says.split()[0] in done.stdout.split("\n# Check:\n")[1]
    values = yaml.safe_load(done.stdout)
    cj = render(chart, {**values, "redis": {"host": "redis"}}, namespace="shop").one("CronJob")
    pod_labels = cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    for doc in originals(path)[1:]:
        selector = doc["spec"].get("podSelector") or doc["spec"]["selector"]
        assert selects(selector, pod_labels), doc["kind"]


@pytest.mark.parametrize(
    ("policy", "overlap"), [("Replace", "replace"), ("Allow", "allow-other-slots")]
)
def test_concurrency_policy_keeps_its_meaning_as_the_runners_overlap(
    chart: Chart, policy: str, overlap: str
) -> None:
    manifest = cronjob()
    manifest["spec"]["concurrencyPolicy"] = policy
    done = run_import("-", stdin=yaml.safe_dump(manifest))
    assert done.returncode == 0, done.stderr
    assert f"overlap: {overlap}: what concurrencyPolicy {policy} does" in " ".join(
        line.strip("# ") for line in done.stdout.splitlines()
    )
    values = yaml.safe_load(done.stdout)
    assert values["tasks"]["broken"]["overlap"] == overlap
    cj = render(chart, {**values, "redis": {"host": "redis"}}).one("CronJob")
    assert cj["spec"]["concurrencyPolicy"] == policy
    env = {e["name"]: e.get("value") for e in pod_spec(cj)["containers"][0]["env"]}
    assert env["CRON_RUNNER_OVERLAP"] == overlap
