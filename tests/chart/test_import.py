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
from tests.chart.helpers import ROOT, Manifest, pod_spec, render
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
    job.pop("metadata", None)
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
    main = pod["containers"][0]
    for key in ("terminationMessagePath", "terminationMessagePolicy"):
        main.pop(key, None)
    main.setdefault("securityContext", {})
    tag = main["image"].rpartition("/")[2]
    main.setdefault("imagePullPolicy", "IfNotPresent" if ":" in tag or "@" in tag else "Always")
    return cj


def runner_removed(rendered: Manifest, original: Manifest, key: str) -> Manifest:
    """The rendered CronJob with exactly what the runner adds taken out again, checking each."""
    cj = copy.deepcopy(rendered)
    meta = cj["metadata"]
    meta.pop("namespace")
    own = original["metadata"].get("labels", {})
    # The CronJob keeps its own labels, and gains the chart's (which may not replace them).
    assert own.items() <= meta["labels"].items()
    assert set(meta["labels"]) - set(own) <= {
        "helm.sh/chart",
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/component",
    }
    meta["labels"] = own
    if not own:
        del meta["labels"]
    job = cj["spec"]["jobTemplate"]
    job.pop("metadata")
    template = job["spec"]["template"]
    pod_labels = (
        original["spec"]["jobTemplate"]["spec"]["template"].get("metadata", {}).get("labels", {})
    )
    assert pod_labels.items() <= template["metadata"]["labels"].items()
    template["metadata"]["labels"] = pod_labels
    if not template["metadata"]["labels"]:
        del template["metadata"]["labels"]
    pod = template["spec"]
    assert pod.pop("enableServiceLinks") is False
    inject = pod["initContainers"].pop()
    assert inject["name"] == "cron-runner-inject"
    assert inject["command"] == ["cp", "-R", "/opt/cron-runner-bin/.", "/cron-runner/"]
    if not pod["initContainers"]:
        del pod["initContainers"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in ("tmp", "cron-runner")]
    if not pod["volumes"]:
        del pod["volumes"]
    main = pod["containers"][0]
    first = original["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert main["name"] == "cron-runner"
    main["name"] = first["name"]
    assert main.pop("command") == ["/cron-runner/cron-runner"]
    args = main.pop("args")
    assert args[:4] == ["exec", "--name", key, "--"]
    assert args[4:] == first.get("command", []) + first.get("args", [])
    for field in ("command", "args"):
        if field in first:
            main[field] = first[field]
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
    main["volumeMounts"] = [
        m for m in main["volumeMounts"] if m["name"] not in ("tmp", "cron-runner")
    ]
    if not main["volumeMounts"]:
        del main["volumeMounts"]
    policy = job["spec"].get("podFailurePolicy")
    for rule in (policy or {}).get("rules", []):
        if "containerName" in rule.get("onExitCodes", {}):
            assert rule["onExitCodes"]["containerName"] == "cron-runner"
            rule["onExitCodes"]["containerName"] = first["name"]
    return cj


def sort_volume_keys(cj: Manifest) -> Manifest:
    """Lists of named objects compared by content; YAML key order never matters."""
    plain: Manifest = yaml.safe_load(yaml.safe_dump(cj, sort_keys=True))
    return plain


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_render_is_the_original_but_for_what_the_runner_changes(
    chart: Chart, path: Path
) -> None:
    values = imported(str(path))
    rendered = render(chart, {**values, "redis": {"host": "redis"}}, namespace="shop")
    by_name = {d["metadata"]["name"]: d for d in rendered.of_kind("CronJob")}
    docs = originals(path)
    assert set(by_name) == {d["metadata"]["name"] for d in docs}
    for original in docs:
        name = original["metadata"]["name"]
        key = next(k for k, t in values["tasks"].items() if t["cronJobName"] == name)
        got = runner_removed(by_name[name], original, key)
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
    docs = [d for p in FILES for d in originals(p)]
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
        "host network",
        yaml.safe_dump(cronjob(hostNetwork=True)),
        "CronJob broken.spec.jobTemplate.spec.template.spec.hostNetwork: the chart cannot carry",
    ),
    (
        "a probe",
        yaml.safe_dump(cronjob(container={"livenessProbe": {"exec": {"command": ["true"]}}})),
        "template.spec.containers[0].livenessProbe: the chart cannot carry",
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
        "a mount on /tmp",
        yaml.safe_dump(cronjob(container={"volumeMounts": [{"name": "t", "mountPath": "/tmp"}]})),
        "containers[0].volumeMounts[0].mountPath: '/tmp': the chart mounts its own volume there",
    ),
    (
        "a volume named as the chart's",
        yaml.safe_dump(cronjob(volumes=[{"name": "cron-runner", "emptyDir": {}}])),
        "template.spec.volumes[0].name: 'cron-runner' is the chart's own volume; rename it",
    ),
    (
        "a pod label the chart selects on",
        yaml.safe_dump(
            cronjob()
            | {
                "spec": {
                    "schedule": "* * * * *",
                    "jobTemplate": {
                        "spec": {
                            "template": {
                                "metadata": {"labels": {"app.kubernetes.io/name": "shop"}},
                                "spec": cronjob()["spec"]["jobTemplate"]["spec"]["template"][
                                    "spec"
                                ],
                            }
                        }
                    },
                }
            }
        ),
        "template.metadata.labels.app.kubernetes.io/name: the chart's pods carry their own",
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


def test_the_kubernetes_page_shows_what_import_prints_for_its_php_example(chart: Chart) -> None:
    example = "examples/adopt/laravel-invoices.yaml"
    printed = run_import(example).stdout
    assert printed and f"```yaml\n{printed}```" in (ROOT / "docs/kubernetes.md").read_text()
    values = yaml.safe_load(printed)
    original = originals(ROOT / example)[0]
    rendered = render(chart, {**values, "redis": {"host": "redis"}}, namespace="shop")
    got = runner_removed(rendered.one("CronJob", "shop-invoices"), original, "shop-invoices")
    assert sort_volume_keys(got) == sort_volume_keys(expected(original))
