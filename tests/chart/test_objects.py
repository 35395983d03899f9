"""What the rendered objects must say: the Job semantics, the runner's environment contract,
restricted security, Redis wiring without plaintext passwords, and the NetworkPolicy."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import helm_python
import pytest
import yaml
from helm_python.chart import Chart

from tests.chart.helpers import (
    CI_FILES,
    NAMESPACE,
    RELEASE,
    ROOT,
    Manifest,
    Rendered,
    ci_values,
    container,
    env_of,
    pod_spec,
    render,
    selects,
)
from tests.chart.test_matrix import KUBE_VERSIONS, schema_errors

THREE = "02-three-tasks-overrides-values.yaml"
JOB_NAME_FIELD = "metadata.labels['batch.kubernetes.io/job-name']"
SCHEDULED_FIELD = "metadata.annotations['batch.kubernetes.io/cronjob-scheduled-timestamp']"
CONTRACT = {
    "CRON_RUNNER_JOB_NAME",
    "CRON_RUNNER_SCHEDULED_TIMESTAMP",
    "CRON_RUNNER_CRONJOB_NAME",
    "CRON_RUNNER_HOLDER",
    "CRON_RUNNER_SCOPE",
    "CRON_RUNNER_SCHEDULE",
    "CRON_RUNNER_TIMEZONE",
    "CRON_RUNNER_LEASE_TTL",
    "CRON_RUNNER_SHUTDOWN_GRACE",
    "CRON_RUNNER_LOG_FORMAT",
    "CRON_RUNNER_REDIS_URL",
}


def all_renders(chart: Chart) -> list[tuple[str, Rendered]]:
    return [(f.name, render(chart, ci_values(f.name))) for f in CI_FILES]


def field_ref(env: Manifest) -> str:
    path: str = env["valueFrom"]["fieldRef"]["fieldPath"]
    return path


def mounted_secret(pod: Manifest, c: Manifest, var: str) -> tuple[str, str]:
    """(Secret name, key) of the file the variable ``var`` names: a mounted Secret, read-only,
    and no secretKeyRef variable beside it (a task inherits the environment, not the file)."""
    env = env_of(c)
    assert var.removesuffix("_FILE") not in env, "the password must not be a variable"
    path = env[var]["value"]
    mount = next(m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    assert mount["readOnly"] is True
    volume = next(v for v in pod_spec(pod)["volumes"] if v["name"] == mount["name"])
    (item,) = [i for i in volume["secret"]["items"]
               if f"{mount['mountPath']}/{i['path']}" == path]  # fmt: skip
    return volume["secret"]["secretName"], item["key"]


def secret_ref(env: Manifest) -> tuple[str, str]:
    ref = env["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


# --- CronJobs and Job semantics -------------------------------------------------------------


def test_one_cronjob_per_task_named_after_release_and_task(chart: Chart) -> None:
    for name, rendered in all_renders(chart):
        tasks = set(ci_values(name)["tasks"])
        cronjobs = rendered.cronjobs()
        assert set(cronjobs) == tasks, name
        for task, cj in cronjobs.items():
            kept = ci_values(name)["tasks"][task].get("cronJobName")
            assert cj["metadata"]["name"] == (kept or f"{RELEASE}-{task}")
            assert cj["metadata"]["namespace"] == NAMESPACE
            pod_labels = cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
            assert pod_labels["cron-runner.io/component"] == task
            assert pod_labels["cron-runner.io/instance"] == RELEASE
            # `kubectl logs -l app.kubernetes.io/component=<task>` for a task in the runner's image.
            if "cron-runner.io/inject" not in pod_labels:
                assert pod_labels["app.kubernetes.io/component"] == task


def test_defaults_forbid_overlap_and_fail_fast_on_config_errors(chart: Chart) -> None:
    cj = render(chart, ci_values("01-defaults-one-task-values.yaml")).cronjobs()["report"]
    spec = cj["spec"]
    job = spec["jobTemplate"]["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] == 300
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (3, 3)
    assert spec["suspend"] is False
    assert job["backoffLimit"] == 2
    assert job["ttlSecondsAfterFinished"] == 86400
    assert "activeDeadlineSeconds" not in job
    assert pod_spec(cj)["restartPolicy"] == "Never"
    assert job["podFailurePolicy"] == {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": container(cj)["name"],
                    "operator": "In",
                    "values": [64, 78, 79, 126, 127],
                },
            },
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
        ]
    }


def test_every_cronjob_forbids_overlap_unless_the_task_says_otherwise(chart: Chart) -> None:
    follows = {"skip": "Forbid", "buffer-one": "Allow", "replace": "Replace",
               "allow-other-slots": "Allow"}  # fmt: skip
    for name, rendered in all_renders(chart):
        defaults = ci_values(name).get("jobDefaults", {})
        for task, cj in rendered.cronjobs().items():
            values = {**defaults, **ci_values(name)["tasks"][task]}
            derived = follows[values.get("overlap", "skip")]
            assert cj["spec"]["concurrencyPolicy"] == values.get("concurrencyPolicy", derived)


def test_task_overrides_replace_job_defaults(chart: Chart) -> None:
    cronjobs = render(chart, ci_values(THREE)).cronjobs()
    invoices, cleanup, weekly = cronjobs["invoices"], cronjobs["cleanup"], cronjobs["weekly-report"]

    assert invoices["spec"]["timeZone"] == "Europe/Berlin"
    assert invoices["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 5
    assert invoices["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 3600
    assert pod_spec(invoices)["terminationGracePeriodSeconds"] == 120
    assert pod_spec(invoices)["priorityClassName"] == "batch-high"
    assert pod_spec(invoices)["tolerations"][0]["key"] == "dedicated"
    assert container(invoices)["resources"]["limits"] == {"memory": "1Gi"}
    assert env_of(container(invoices))["CRON_RUNNER_LEASE_TTL"]["value"] == "1m"

    assert cleanup["spec"]["concurrencyPolicy"] == "Replace"
    assert cleanup["spec"]["startingDeadlineSeconds"] == 60
    assert cleanup["spec"]["successfulJobsHistoryLimit"] == 1
    assert cleanup["spec"]["failedJobsHistoryLimit"] == 5
    assert cleanup["spec"]["jobTemplate"]["spec"]["ttlSecondsAfterFinished"] == 600
    labels = cleanup["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert labels["cost-center"] == "ops"
    assert labels["app.kubernetes.io/component"] == "cleanup"
    # The shared defaults still apply where the task says nothing.
    assert pod_spec(cleanup)["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert container(cleanup)["resources"]["limits"] == {"memory": "256Mi"}

    assert weekly["spec"]["suspend"] is True
    assert "nodeAffinity" in pod_spec(weekly)["affinity"]
    assert {"name": "reports", "mountPath": "/reports"} in container(weekly)["volumeMounts"]
    assert any(v["name"] == "reports" for v in pod_spec(weekly)["volumes"])
    annotations = weekly["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}


def test_zero_values_survive(chart: Chart) -> None:
    cronjobs = render(chart, ci_values("07-zero-values.yaml")).cronjobs()
    for cj in cronjobs.values():
        spec = cj["spec"]
        assert spec["startingDeadlineSeconds"] == 0
        assert spec["successfulJobsHistoryLimit"] == 0
        assert spec["failedJobsHistoryLimit"] == 0
        assert spec["jobTemplate"]["spec"]["backoffLimit"] == 0
        assert spec["jobTemplate"]["spec"]["ttlSecondsAfterFinished"] == 0
        assert env_of(container(cj))["CRON_RUNNER_REDIS_URL"]["value"].endswith("/0")
        assert pod_spec(cj)["volumes"][0] == {"name": "tmp", "emptyDir": {}}
    once = cronjobs["once"]
    assert "podFailurePolicy" not in once["spec"]["jobTemplate"]["spec"]
    assert pod_spec(once)["restartPolicy"] == "OnFailure"
    assert "podFailurePolicy" in cronjobs["report"]["spec"]["jobTemplate"]["spec"]


def test_a_task_is_one_set_flag_away(chart: Chart) -> None:
    # `--set tasks.report.schedule='0 2 * * *' --set tasks.report.task=report`
    values: dict[str, Any] = {"redis": {"host": "redis"}}
    for expression in ("tasks.report.schedule=0 2 * * *", "tasks.report.task=report"):
        parsed = helm_python.parse_set_string(expression)
        values.setdefault("tasks", {}).setdefault("report", {}).update(parsed["tasks"]["report"])
    cj = render(chart, values).cronjobs()["report"]
    assert cj["spec"]["schedule"] == "0 2 * * *"
    assert container(cj)["args"] == ["run", "report"]


# --- The container and the environment contract --------------------------------------------


def test_env_contract_is_complete_in_every_cronjob(chart: Chart) -> None:
    for name, rendered in all_renders(chart):
        for task, cj in rendered.cronjobs().items():
            c = container(cj)
            env = env_of(c)
            assert set(env) >= CONTRACT, (name, task, CONTRACT - set(env))
            assert field_ref(env["CRON_RUNNER_JOB_NAME"]) == JOB_NAME_FIELD
            assert field_ref(env["CRON_RUNNER_SCHEDULED_TIMESTAMP"]) == SCHEDULED_FIELD
            assert field_ref(env["CRON_RUNNER_HOLDER"]) == "metadata.name"
            # The namespace, unless runner.scope names one (06: "billing").
            scope = env["CRON_RUNNER_SCOPE"]
            assert scope.get("value") == "billing" or field_ref(scope) == "metadata.namespace"
            assert env["CRON_RUNNER_CRONJOB_NAME"]["value"] == cj["metadata"]["name"]
            assert env["CRON_RUNNER_SCHEDULE"]["value"] == cj["spec"]["schedule"]
            assert env["CRON_RUNNER_TIMEZONE"]["value"] == cj["spec"].get("timeZone", "UTC")
            assert env["CRON_RUNNER_LOG_FORMAT"]["value"] == "json"
            # Injected into the task's own image, the runner runs from the emptyDir.
            assert c["command"] in (["cron-runner"], ["/cron-runner/cron-runner"])


def test_shutdown_grace_is_always_five_seconds_below_the_pod_grace(chart: Chart) -> None:
    seen = set()
    for _, rendered in all_renders(chart):
        for cj in rendered.cronjobs().values():
            grace_s = pod_spec(cj)["terminationGracePeriodSeconds"]
            shutdown = env_of(container(cj))["CRON_RUNNER_SHUTDOWN_GRACE"]["value"]
            assert shutdown == f"{grace_s - 5}s"
            seen.add(grace_s)
    assert seen == {30, 120}


def test_task_and_command_tasks_get_run_and_exec(chart: Chart) -> None:
    cj = render(chart, ci_values("03-command-task-values.yaml")).cronjobs()["send-digest"]
    c = container(cj)
    assert c["image"] == "registry.acme.example/acme/php-app:1.4.0"
    assert c["args"] == [
        "exec", "--name", "send-digest", "--", "php", "artisan", "digest:send", "--queue", "mail",
    ]  # fmt: skip
    assert env_of(c)["APP_ENV"]["value"] == "production"
    assert c["envFrom"] == [{"secretRef": {"name": "php-app-env"}}]

    three = render(chart, ci_values(THREE)).cronjobs()
    # A reference, or a task key that is not the task's name: the lease is the key's.
    assert container(three["invoices"])["args"] == [
        "run", "acme.billing:send_invoices", "--name", "invoices"
    ]  # fmt: skip
    assert container(three["cleanup"])["args"] == [
        "exec", "--name", "cleanup", "--", "/app/bin/cleanup", "--older-than", "7d",
    ]  # fmt: skip


def test_runner_settings_and_user_env(chart: Chart) -> None:
    three = render(chart, ci_values(THREE)).cronjobs()
    env = env_of(container(three["cleanup"]))
    assert env["CRON_RUNNER_LOG_LEVEL"]["value"] == "DEBUG"
    assert env["CRON_RUNNER_KEY_PREFIX"]["value"] == "acme-cron"
    assert env["CRON_RUNNER_CONNECT_TIMEOUT"]["value"] == "20s"
    assert env["CRON_RUNNER_SKEW_TOLERANCE"]["value"] == "10s"
    assert env["CRON_RUNNER_TASK_MODULES"]["value"] == "acme.tasks,acme.billing"
    assert env["CRON_RUNNER_REDIS_URL"]["value"] == "redis://redis-primary.data.svc:6380/2"
    # The task's env wins over runner.env; a map value is a whole EnvVar.
    assert env["TZ"]["value"] == "Europe/Berlin"
    assert env_of(container(three["invoices"]))["TZ"]["value"] == "UTC"
    assert secret_ref(env["DATABASE_URL"]) == ("acme-db", "url")
    assert container(three["cleanup"])["envFrom"] == [{"configMapRef": {"name": "acme-settings"}}]


def test_user_env_replaces_a_contract_variable_instead_of_duplicating_it(chart: Chart) -> None:
    values = ci_values("01-defaults-one-task-values.yaml")
    values["tasks"]["report"]["env"] = {"CRON_RUNNER_LOG_LEVEL": "DEBUG"}
    env = env_of(container(render(chart, values).cronjobs()["report"]))
    assert env["CRON_RUNNER_LOG_LEVEL"]["value"] == "DEBUG"


def test_telemetry_env_only_when_configured(chart: Chart) -> None:
    plain = env_of(
        container(render(chart, ci_values("01-defaults-one-task-values.yaml")).cronjobs()["report"])
    )
    assert not [n for n in plain if n.startswith("OTEL_")]

    c = container(render(chart, ci_values("03-command-task-values.yaml")).cronjobs()["send-digest"])
    env = env_of(c)
    assert (
        env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"]
        == "http://otel-collector.observability.svc:4317"
    )
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"]["value"] == "grpc"
    assert env["OTEL_SERVICE_NAME"]["value"] == "cron-runner"
    attrs = dict(kv.split("=", 1) for kv in env["OTEL_RESOURCE_ATTRIBUTES"]["value"].split(","))
    assert attrs["k8s.cronjob.name"] == f"{RELEASE}-send-digest"
    assert attrs["team"] == "billing"
    # The namespace itself, not the key scope, which runner.scope may set apart from it.
    assert attrs["k8s.namespace.name"] == NAMESPACE
    # $(VAR) expands only to variables defined earlier in the list.
    order = [e["name"] for e in c["env"]]
    for var in ("CRON_RUNNER_HOLDER", "CRON_RUNNER_JOB_NAME"):
        assert f"$({var})" in env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
        assert order.index(var) < order.index("OTEL_RESOURCE_ATTRIBUTES")


# --- Security -------------------------------------------------------------------------------

SAFE_VOLUMES = {
    "configMap",
    "secret",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
}


def assert_restricted(doc: Manifest, uid: int) -> None:
    """Pod Security "restricted", plus the chart's own promises (uid, /tmp, no token)."""
    spec = pod_spec(doc)
    where = f"{doc['kind']}/{doc['metadata']['name']}"
    psc = spec["securityContext"]
    assert psc["runAsNonRoot"] is True, where
    assert (psc["runAsUser"], psc["runAsGroup"], psc["fsGroup"]) == (uid, uid, uid), where
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
    assert spec["automountServiceAccountToken"] is False, where
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key), where
    for volume in spec.get("volumes", []):
        assert set(volume) - {"name"} <= SAFE_VOLUMES, (where, volume)
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, where
        assert sc["readOnlyRootFilesystem"] is True, where
        assert sc["capabilities"] == {"drop": ["ALL"]}, where
        assert not sc.get("privileged"), where
        assert sc.get("runAsUser", uid) != 0, where
        assert all("hostPort" not in p for p in c.get("ports", [])), where
    # The chart's own container gets a writable /tmp; a task's extra containers are its own.
    assert {"name": "tmp", "mountPath": "/tmp"} in spec["containers"][0]["volumeMounts"], where
    tmp = next(v for v in spec["volumes"] if v["name"] == "tmp")
    assert "emptyDir" in tmp, where


def test_every_pod_is_restricted(chart: Chart) -> None:
    checked = set()
    for _, rendered in all_renders(chart):
        for doc in (
            rendered.of_kind("CronJob") + rendered.of_kind("Pod") + rendered.of_kind("Deployment")
        ):
            assert_restricted(doc, 10001)
            checked.add(doc["kind"])
        for doc in rendered.of_kind("StatefulSet"):
            # The official redis image's own user.
            assert_restricted(doc, 999)
            checked.add(doc["kind"])
    assert checked == {"CronJob", "Pod", "StatefulSet", "Deployment"}


def test_the_release_namespace_is_never_templated(chart: Chart) -> None:
    # Helm rejects it with and without --create-namespace (helm/helm#5153): the chart refuses
    # namespace.create and says how to label the namespace; manifests/ carries a labelled one.
    for values_file in CI_FILES:
        assert not render(chart, ci_values(values_file.name)).of_kind("Namespace")
    with pytest.raises(helm_python.HelmRenderError) as info:
        render(chart, {"redis": {"host": "r"}, "namespace": {"create": True}})
    message = str(info.value)
    assert "namespace.create is not supported: Helm cannot template the release's own" in message
    assert (
        f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=restricted"
        in message
    )
    manifests = list(yaml.safe_load_all((ROOT / "manifests" / "cron-runner.yaml").read_text()))
    (ns,) = [d for d in manifests if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == NAMESPACE
    for mode in ("enforce", "audit", "warn"):
        assert ns["metadata"]["labels"][f"pod-security.kubernetes.io/{mode}"] == "restricted"
    assert manifests.index(ns) == 0, "kubectl apply creates the namespace before its objects"


def test_dedicated_service_account(chart: Chart) -> None:
    rendered = render(chart, ci_values("06-bundled-redis-networkpolicy-values.yaml"))
    sa = rendered.one("ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    for doc in rendered.of_kind("CronJob") + rendered.of_kind("Pod"):
        assert pod_spec(doc)["serviceAccountName"] == sa["metadata"]["name"]


# --- Redis ----------------------------------------------------------------------------------


def test_tls_acl_and_password_from_existing_secrets(chart: Chart) -> None:
    rendered = render(chart, ci_values("04-tls-secret-acl-values.yaml"))
    for doc in rendered.of_kind("CronJob") + rendered.of_kind("Pod"):
        c = pod_spec(doc)["containers"][0]
        env = env_of(c)
        assert env["CRON_RUNNER_REDIS_URL"]["value"] == "rediss://redis.prod.example.com:6380/3"
        assert env["CRON_RUNNER_REDIS_USERNAME"]["value"] == "cron-runner"
        assert mounted_secret(doc, c, "CRON_RUNNER_REDIS_PASSWORD_FILE") == (
            "redis-credentials",
            "redis-password",
        )
        ca = env["CRON_RUNNER_REDIS_TLS_CA_FILE"]["value"]
        cert = env["CRON_RUNNER_REDIS_TLS_CERT_FILE"]["value"]
        key = env["CRON_RUNNER_REDIS_TLS_KEY_FILE"]["value"]
        mount = next(m for m in c["volumeMounts"] if m["name"] == "redis-tls")
        assert mount["readOnly"] is True
        assert {ca, cert, key} == {
            f"{mount['mountPath']}/{p}" for p in ("ca.crt", "tls.crt", "tls.key")
        }
        volume = next(v for v in pod_spec(doc)["volumes"] if v["name"] == "redis-tls")
        assert volume["secret"]["secretName"] == "redis-tls"
        assert {i["key"]: i["path"] for i in volume["secret"]["items"]} == {
            "ca.crt": "ca.crt", "tls.crt": "tls.crt", "tls.key": "tls.key",
        }  # fmt: skip
    env = env_of(container(rendered.cronjobs()["report"]))
    assert env["CRON_RUNNER_REDIS_MIN_REPLICAS"]["value"] == "1"


def test_sentinel(chart: Chart) -> None:
    rendered = render(chart, ci_values("05-sentinel-values.yaml"))
    for cj in rendered.cronjobs().values():
        env = env_of(container(cj))
        assert env["CRON_RUNNER_REDIS_SENTINELS"]["value"] == ",".join(
            f"redis-sentinel-{i}.redis-sentinel.data.svc:26379" for i in range(3)
        )
        assert env["CRON_RUNNER_REDIS_SENTINEL_MASTER"]["value"] == "cron-primary"
        assert env["CRON_RUNNER_REDIS_URL"]["value"] == "redis://cron-primary/1"
        c = container(cj)
        assert mounted_secret(cj, c, "CRON_RUNNER_REDIS_SENTINEL_PASSWORD_FILE") == (
            "redis-sentinel",
            "sentinel-password",
        )
        assert mounted_secret(cj, c, "CRON_RUNNER_REDIS_PASSWORD_FILE") == (
            "redis-sentinel",
            "redis-password",
        )


def test_cluster_flag(chart: Chart) -> None:
    values = ci_values("01-defaults-one-task-values.yaml")
    values["redis"]["cluster"] = {"enabled": True}
    env = env_of(container(render(chart, values).cronjobs()["report"]))
    assert env["CRON_RUNNER_REDIS_CLUSTER"]["value"] == "true"


def _secret_values(rendered: Rendered) -> set[str]:
    return {
        base64.b64decode(v).decode()
        for s in rendered.of_kind("Secret")
        for v in s.get("data", {}).values()
    } | {v for s in rendered.of_kind("Secret") for v in s.get("stringData", {}).values()}


def test_no_plaintext_password_anywhere(chart: Chart) -> None:
    for name, rendered in all_renders(chart):
        for doc in rendered.docs:
            if doc["kind"] == "Secret":
                continue
            kinds = ("CronJob", "Pod", "StatefulSet", "Deployment")
            spec = pod_spec(doc) if doc["kind"] in kinds else None
            for c in spec["containers"] if spec else []:
                for env in c.get("env", []):
                    if env["name"].endswith("_PASSWORD_FILE"):  # a path: the Secret's mount
                        assert env["value"].startswith("/etc/cron-runner/"), (name, env)
                    elif "PASSWORD" in env["name"] or env["name"] == "REDISCLI_AUTH":
                        assert "value" not in env, (name, env)
                        assert "secretKeyRef" in env["valueFrom"], (name, env)
                    if env["name"] == "CRON_RUNNER_REDIS_URL":
                        assert "@" not in env["value"], (name, env)
                        assert "password=" not in env["value"].lower(), (name, env)
        # A generated password lives in its Secret and nowhere else, NOTES included.
        text = repr([d for d in rendered.docs if d["kind"] != "Secret"]) + rendered.notes
        for secret in _secret_values(rendered):
            assert secret not in text, name


def test_schema_refuses_a_password_in_values(chart: Chart) -> None:
    values = ci_values("01-defaults-one-task-values.yaml")
    values["redis"]["auth"] = {"password": "hunter2"}
    with pytest.raises(helm_python.HelmValuesError, match="additional properties 'password'"):
        render(chart, values)
    values = ci_values("01-defaults-one-task-values.yaml")
    values["redis"]["url"] = "redis://:hunter2@redis:6379/0"
    with pytest.raises(helm_python.HelmValuesError, match="/redis/url"):
        render(chart, values)


def bundled_generated() -> dict[str, Any]:
    """06 without its own Secret: the password the chart generates on a `helm install`."""
    values = ci_values("06-bundled-redis-networkpolicy-values.yaml")
    del values["redis"]["auth"]
    return values


def test_bundled_redis(chart: Chart) -> None:
    rendered = render(chart, bundled_generated(), helm_install=True)
    name = f"{RELEASE}-redis"
    sts = rendered.one("StatefulSet", name)
    assert sts["spec"]["replicas"] == 1
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert claim["spec"]["storageClassName"] == "standard"
    c = pod_spec(sts)["containers"][0]
    assert c["image"].startswith("docker.io/library/redis:")
    assert "bitnami" not in c["image"]
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]

    conf = rendered.one("ConfigMap", name)["data"]["redis.conf"]
    lines = set(conf.splitlines())
    assert {
        "appendonly yes",
        "appendfsync everysec",
        "maxmemory-policy noeviction",
        "maxmemory 200mb",
    } <= lines
    checksum = sts["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert checksum == hashlib.sha256(conf.rstrip("\n").encode()).hexdigest()

    # A first install: `lookup` finds no Secret, so a password is generated, once; the API
    # server refuses to change it later (immutable), under a Redis that keeps the first.
    secret = rendered.one("Secret", name)
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert len(password) >= 32
    assert secret["immutable"] is True
    assert secret_ref(env_of(c)["REDIS_PASSWORD"]) == (name, "password")

    svc = rendered.one("Service", name)
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    # The Service selects by the chart's own labels; the StatefulSet keeps its first selector.
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["selector"]["cron-runner.io/component"] == "bundled-redis"
    assert sts["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "cron-runner",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "bundled-redis",
    }
    assert svc["spec"]["type"] == "ClusterIP"
    # The StatefulSet's governing Service is headless, as the StatefulSet API expects.
    headless = rendered.one("Service", sts["spec"]["serviceName"])
    assert sts["spec"]["serviceName"] == f"{name}-headless"
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == svc["spec"]["selector"]
    errors = [e for doc in rendered.docs for v in KUBE_VERSIONS for e in schema_errors(doc, v)]
    assert errors == []
    for cj in rendered.of_kind("CronJob"):
        env = env_of(container(cj))
        assert env["CRON_RUNNER_REDIS_URL"]["value"] == f"redis://{name}.{NAMESPACE}.svc:6379/0"
        assert mounted_secret(cj, container(cj), "CRON_RUNNER_REDIS_PASSWORD_FILE") == (
            name,
            "password",
        )


def test_bundled_redis_checksum_follows_its_config(chart: Chart) -> None:
    values = ci_values("06-bundled-redis-networkpolicy-values.yaml")

    def checksum() -> str:
        sts = render(chart, values).one("StatefulSet")
        value: str = sts["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    before = checksum()
    assert checksum() == before, "the generated password must not restart Redis on every upgrade"
    values["redis"]["bundled"]["maxmemory"] = "100mb"
    assert checksum() != before


def test_bundled_redis_uses_an_existing_secret_when_given(chart: Chart) -> None:
    values = ci_values("06-bundled-redis-networkpolicy-values.yaml")
    values["redis"]["auth"] = {"existingSecret": "mine", "passwordKey": "pw"}
    rendered = render(chart, values)
    assert not rendered.of_kind("Secret")
    sts = rendered.one("StatefulSet")
    assert secret_ref(env_of(pod_spec(sts)["containers"][0])["REDIS_PASSWORD"]) == ("mine", "pw")


# --- NetworkPolicy --------------------------------------------------------------------------


def _dns_rule(policy: Manifest) -> Manifest:
    return next(
        r for r in policy["spec"]["egress"] if {"port": 53, "protocol": "UDP"} in r["ports"]
    )


def test_network_policy_for_bundled_redis(chart: Chart) -> None:
    rendered = render(chart, ci_values("06-bundled-redis-networkpolicy-values.yaml"))
    tasks = rendered.one("NetworkPolicy", f"{RELEASE}-tasks")
    redis = rendered.one("NetworkPolicy", f"{RELEASE}-redis")
    sts = rendered.one("StatefulSet")

    assert tasks["spec"]["policyTypes"] == ["Egress"]
    dns = _dns_rule(tasks)
    assert {"port": 53, "protocol": "TCP"} in dns["ports"]
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "kube-system"
    }
    to_redis = [
        r for r in tasks["spec"]["egress"] if r["ports"] == [{"port": 6379, "protocol": "TCP"}]
    ]
    (peer,) = to_redis[0]["to"]
    assert selects(peer["podSelector"], sts["spec"]["template"]["metadata"]["labels"])
    assert {"port": 5432, "protocol": "TCP"} in tasks["spec"]["egress"][-1]["ports"]

    assert selects(redis["spec"]["podSelector"], sts["spec"]["template"]["metadata"]["labels"])
    (ingress,) = redis["spec"]["ingress"]
    (peer,) = ingress["from"]
    assert ingress["ports"] == [{"port": 6379, "protocol": "TCP"}]
    assert peer["podSelector"]["matchExpressions"] == [
        {"key": "cron-runner.io/component", "operator": "NotIn", "values": ["bundled-redis"]}
    ]

    # The policies select what they mean to: every task and the test Pod, never Redis.
    def selected(policy: Manifest, labels: dict[str, str]) -> bool:
        return selects(policy["spec"]["podSelector"], labels)

    for cj in rendered.of_kind("CronJob"):
        labels = cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
        assert selected(tasks, labels)
        assert not selected(redis, labels)
    assert selected(tasks, rendered.one("Pod")["metadata"]["labels"])
    assert not selected(tasks, sts["spec"]["template"]["metadata"]["labels"])
    assert selected(redis, sts["spec"]["template"]["metadata"]["labels"])


def test_network_policy_for_external_redis_and_sentinel(chart: Chart) -> None:
    tls = render(chart, ci_values("04-tls-secret-acl-values.yaml")).one("NetworkPolicy")
    assert "to" not in _dns_rule(tls)
    (to_redis,) = [r for r in tls["spec"]["egress"] if r is not _dns_rule(tls)]
    assert to_redis == {
        "ports": [{"port": 6380, "protocol": "TCP"}],
        "to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
    }

    sentinel = render(chart, ci_values("05-sentinel-values.yaml")).one("NetworkPolicy")
    ports = [p["port"] for r in sentinel["spec"]["egress"] for p in r["ports"] if p["port"] != 53]
    assert sorted(ports) == [6379, 26379]


# --- helm test and NOTES --------------------------------------------------------------------


def test_helm_test_hook_runs_cron_runner_check(chart: Chart) -> None:
    rendered = render(chart, ci_values("04-tls-secret-acl-values.yaml"))
    pod = rendered.one("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    assert (c["command"], c["args"]) == (["cron-runner"], ["check"])
    assert pod["spec"]["restartPolicy"] == "Never"
    cj_env = env_of(container(rendered.cronjobs()["report"]))
    redis_vars = {n for n in cj_env if n.startswith("CRON_RUNNER_REDIS_")}
    assert redis_vars <= set(env_of(c)), "the check must test the connection the tasks use"


def test_notes_show_the_logs_and_manual_run_commands(chart: Chart) -> None:
    rendered = render(chart, ci_values(THREE))
    for task, cj in rendered.cronjobs().items():
        name = cj["metadata"]["name"]
        assert (
            f"kubectl logs -n {NAMESPACE} -l app.kubernetes.io/component={task} --tail=100"
            in rendered.notes
        )
        assert f"kubectl create job --from=cronjob/{name} {name}-manual" in rendered.notes
        assert f'{task}: "{cj["spec"]["schedule"]}"' in rendered.notes
    assert "WARNING" not in rendered.notes


def test_notes_warn_about_bundled_redis_and_eviction(chart: Chart) -> None:
    values = ci_values("06-bundled-redis-networkpolicy-values.yaml")
    notes = render(chart, values).notes
    assert "WARNING: the bundled Redis" in notes
    assert "maxmemoryPolicy" not in notes
    values["redis"]["bundled"]["maxmemoryPolicy"] = "allkeys-lru"
    notes = render(chart, values).notes
    assert 'WARNING: redis.bundled.maxmemoryPolicy is "allkeys-lru"' in notes


def test_no_tasks_renders_nothing_but_a_hint(chart: Chart) -> None:
    rendered = render(chart, {})
    assert rendered.docs == []
    assert (
        "--set tasks.report.schedule='0 2 * * *' --set tasks.report.task=report" in rendered.notes
    )


def test_notes_print_the_per_scope_acl_rule_that_is_tested(chart: Chart) -> None:
    """The line is the rule tests/integration/test_secrets_and_tenants.py proves on a real
    Redis with two teams, for this release's user, prefix and scope."""
    from tests.integration.test_secrets_and_tenants import SCOPE_RULE  # noqa: PLC0415

    values = ci_values("01-defaults-one-task-values.yaml")
    assert "ACL SETUSER" not in render(chart, values).notes
    values["redis"]["auth"] = {"username": "team-a", "perScopeAcl": True}
    notes = render(chart, values).notes
    assert f"ACL SETUSER team-a on >PASSWORD {SCOPE_RULE.replace('SCOPE', NAMESPACE)}\n" in notes
    values["runner"] = {"keyPrefix": "jobs", "env": {"CRON_RUNNER_SCOPE": "billing"}}
    assert "~jobs:{billing:* " in render(chart, values).notes
    values["runner"] = {"scope": "shared"}
    assert "~cron-runner:{shared:* " in render(chart, values).notes


def test_selectors_that_cannot_change_stay_as_the_first_release_wrote_them(chart: Chart) -> None:
    """The API server refuses a new Deployment or StatefulSet selector, or volumeClaimTemplate,
    on `helm upgrade`: the chart's own cron-runner.io/* labels are on the pods, never in them."""
    values = ci_values("09-queue-bundled-redis-values.yaml")
    values["serve"] = {"enabled": True}
    rendered = render(chart, values, helm_install=True)
    base = {"app.kubernetes.io/name": "cron-runner", "app.kubernetes.io/instance": RELEASE}
    selectors = {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["selector"]["matchLabels"]
        for d in rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet")
    }
    assert selectors == {
        f"Deployment/{RELEASE}-serve": {**base, "app.kubernetes.io/component": "serve"},
        **{
            f"Deployment/{RELEASE}-worker-{group}": {
                **base, "app.kubernetes.io/component": "worker", "cron-runner/worker-group": group,
            }
            for group in ("default", "standby")
        },
        f"StatefulSet/{RELEASE}-redis": {**base, "app.kubernetes.io/component": "bundled-redis"},
    }  # fmt: skip
    (claim,) = rendered.one("StatefulSet")["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["labels"] == {**base, "app.kubernetes.io/component": "bundled-redis"}
