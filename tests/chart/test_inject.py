"""runner.inject initContainer: a task runs in its own image, with the runner copied in; and
every pod setting a task may set for itself."""

from __future__ import annotations

from typing import Any

import pytest
from helm_python import HelmRenderError, HelmValuesError
from helm_python.chart import Chart

from tests.chart.helpers import ci_values, container, env_of, pod_spec, render, selects
from tests.chart.test_matrix import KUBE_VERSIONS, schema_errors

REDIS = {"host": "redis"}
PHP = {"repository": "registry.example.com/shop/app", "tag": "2026.11.3"}


def one_task(chart: Chart, task: dict[str, Any], **top: Any) -> dict[str, Any]:
    rendered = render(chart, {"redis": REDIS, "tasks": {"report": task}, **top})
    cronjob: dict[str, Any] = rendered.cronjobs()["report"]
    return cronjob


def injected(**task: Any) -> dict[str, Any]:
    return {"schedule": "0 2 * * *", "runner": {"inject": "initContainer"}, "image": PHP, **task}


def test_the_task_runs_in_its_own_image_with_the_runner_copied_in(chart: Chart) -> None:
    cj = one_task(chart, injected(command=["php", "artisan", "report:send"], args=["--days", 7]))
    spec = pod_spec(cj)
    (init,) = spec["initContainers"]
    assert init["name"] == "cron-runner-inject"
    assert init["image"] == "ghcr.io/cron-runner/cron-runner:0.1.0"
    assert init["command"] == ["cp", "-R", "/opt/cron-runner-bin/.", "/cron-runner/"]
    assert init["volumeMounts"] == [{"name": "cron-runner", "mountPath": "/cron-runner"}]
    # Never root, even where the task's pod is: the copy is the runner image's own user.
    assert (init["securityContext"]["runAsUser"], init["securityContext"]["runAsGroup"]) == (
        10001,
        10001,
    )
    c = container(cj)
    assert c["image"] == "registry.example.com/shop/app:2026.11.3"
    assert c["command"] == ["/cron-runner/cron-runner"]
    command = ["php", "artisan", "report:send", "--days", "7"]
    assert c["args"] == ["exec", "--name", "report", "--", *command]
    assert {"name": "cron-runner", "mountPath": "/cron-runner", "readOnly": True} in c[
        "volumeMounts"
    ]
    assert {"name": "cron-runner", "emptyDir": {"sizeLimit": "200Mi"}} in spec["volumes"]
    # The failure policy still names the runner's container: 78 from the launcher fails at once.
    rule = cj["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["onExitCodes"]["containerName"] == c["name"]
    assert {"CRON_RUNNER_REDIS_URL", "CRON_RUNNER_JOB_NAME"} <= set(env_of(c))
    errors = [e for v in KUBE_VERSIONS for e in schema_errors(cj, v)]
    assert errors == []


@pytest.mark.parametrize(
    ("image", "args", "runs"),
    [
        ({"entrypoint": ["docker-php-entrypoint"], "cmd": ["php", "-a"]}, None, ["docker-php-entrypoint", "php", "-a"]),
        ({"entrypoint": ["docker-php-entrypoint"], "cmd": ["php", "-a"]}, ["php", "x.php"], ["docker-php-entrypoint", "php", "x.php"]),
        ({"cmd": ["node", "job.js"]}, None, ["node", "job.js"]),
    ],
    ids=["entrypoint-and-cmd", "args-replace-cmd", "cmd-only"],
)  # fmt: skip
def test_without_a_command_the_images_own_entrypoint_and_cmd_run(
    chart: Chart, image: dict[str, Any], args: list[str] | None, runs: list[str]
) -> None:
    task = injected(image={**PHP, **image}, **({"args": args} if args else {}))
    assert container(one_task(chart, task))["args"][4:] == runs


def test_job_defaults_inject_every_task_and_a_task_may_opt_out(chart: Chart) -> None:
    rendered = render(chart, ci_values("10-inject-app-images-values.yaml"))
    jobs = rendered.cronjobs()
    assert container(jobs["invoices"])["command"] == ["/cron-runner/cron-runner"]
    assert container(jobs["sitemap"])["image"].endswith("@sha256:" + "0123456789abcdef" * 4)
    python = container(jobs["python-report"])
    assert python["command"] == ["cron-runner"]
    assert python["args"] == ["run", "report", "--name", "python-report"]
    assert "initContainers" not in pod_spec(jobs["python-report"])


def test_every_pod_setting_per_task(chart: Chart) -> None:
    sidecar = {"name": "proxy", "image": "proxy:2", "args": ["--port", "5432"]}
    init = {"name": "migrate", "image": "app:1", "command": ["migrate"]}
    cj = one_task(
        chart,
        injected(
            command=["php", "x.php"],
            cronJobName="legacy-report",
            labels={
                "team": "payments",
                "app.kubernetes.io/name": "shop",
                "app.kubernetes.io/instance": "elsewhere",
            },
            annotations={"owner": "ops@example.com"},
            workingDir="/srv/app",
            serviceAccountName="reporter",
            automountServiceAccountToken=True,
            podSecurityContext={"runAsUser": 33, "runAsGroup": 33, "runAsNonRoot": True},
            securityContext={"readOnlyRootFilesystem": False},
            initContainers=[init],
            extraContainers=[sidecar],
            nodeSelector={"pool": "batch"},
            tolerations=[{"key": "batch", "operator": "Exists"}],
            affinity={"nodeAffinity": {}},
            priorityClassName="low",
            podLabels={"app": "shop"},
            podAnnotations={"a": "b"},
            resources={"limits": {"memory": "1Gi"}},
            env={"APP_ENV": "production"},
            envFrom=[{"secretRef": {"name": "shop"}}],
            extraVolumes=[{"name": "storage", "emptyDir": {}}],
            extraVolumeMounts=[{"name": "storage", "mountPath": "/srv/app/storage"}],
        ),
    )
    assert cj["metadata"]["name"] == "legacy-report"
    labels = cj["metadata"]["labels"]
    assert (labels["team"], labels["app.kubernetes.io/name"]) == ("payments", "shop")
    # A task in its own image is the app's: its app.kubernetes.io/* labels are its own. The
    # chart finds its objects by its own labels, which no task label replaces; Helm by managed-by.
    assert labels["app.kubernetes.io/instance"] == "elsewhere"
    assert "app.kubernetes.io/component" not in labels
    assert labels["cron-runner.io/instance"] == "cron-runner"
    assert labels["cron-runner.io/component"] == "report"
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert cj["metadata"]["annotations"] == {"owner": "ops@example.com"}
    template = cj["spec"]["jobTemplate"]["spec"]["template"]
    assert template["metadata"]["labels"]["app"] == "shop"
    assert template["metadata"]["annotations"] == {"a": "b"}
    spec = template["spec"]
    assert spec["serviceAccountName"] == "reporter"
    assert spec["automountServiceAccountToken"] is True
    assert spec["securityContext"] == {"runAsUser": 33, "runAsGroup": 33, "runAsNonRoot": True}
    assert [c["name"] for c in spec["initContainers"]] == ["migrate", "cron-runner-inject"]
    assert spec["initContainers"][0] == init
    assert spec["containers"][1:] == [sidecar]
    assert spec["nodeSelector"] == {"pool": "batch"}
    assert spec["tolerations"] == [{"key": "batch", "operator": "Exists"}]
    assert spec["priorityClassName"] == "low"
    c = container(cj)
    assert c["workingDir"] == "/srv/app"
    assert c["securityContext"] == {"readOnlyRootFilesystem": False}
    assert c["resources"] == {"limits": {"memory": "1Gi"}}
    assert env_of(c)["APP_ENV"] == {"name": "APP_ENV", "value": "production"}
    assert env_of(c)["CRON_RUNNER_CRONJOB_NAME"]["value"] == "legacy-report"
    assert c["envFrom"] == [{"secretRef": {"name": "shop"}}]
    assert {"name": "storage", "mountPath": "/srv/app/storage"} in c["volumeMounts"]
    errors = [e for v in KUBE_VERSIONS for e in schema_errors(cj, v)]
    assert errors == []


def test_a_task_image_without_injection_replaces_the_runner_image(chart: Chart) -> None:
    mine = {"repository": "registry.example.com/tasks", "tag": "7", "pullPolicy": "Always"}
    c = container(one_task(chart, {"schedule": "0 2 * * *", "task": "report", "image": mine}))
    assert (c["image"], c["imagePullPolicy"]) == ("registry.example.com/tasks:7", "Always")
    assert c["command"] == ["cron-runner"]


def test_notes_name_a_task_that_loosens_the_restricted_defaults(chart: Chart) -> None:
    values = {
        "redis": REDIS,
        "tasks": {
            "strict": injected(command=["true"]),
            "laravel": injected(
                command=["true"], securityContext={"readOnlyRootFilesystem": False}
            ),
            "rooted": injected(command=["true"], podSecurityContext={"runAsUser": 0}),
        },
    }
    notes = render(chart, values).notes
    assert "task strict loosens" not in notes
    assert (
        "WARNING: task laravel loosens the chart's restricted security defaults "
        "(securityContext.allowPrivilegeEscalation is not false; "
        "securityContext.readOnlyRootFilesystem is not true; "
        "securityContext.capabilities.drop lacks ALL)"
    ) in notes
    assert "WARNING: task rooted loosens" in notes
    assert "runAsUser: 0" in notes
    assert "loosens" not in render(chart, ci_values("01-defaults-one-task-values.yaml")).notes


def refused(chart: Chart, task: dict[str, Any]) -> str:
    with pytest.raises((HelmRenderError, HelmValuesError)) as info:
        render(chart, {"redis": REDIS, "tasks": {"report": task}})
    return str(info.value)


@pytest.mark.parametrize(
    ("task", "says"),
    [
        (injected(task="report"), 'task "report": runner.inject initContainer runs a command in the task\'s own image'),
        ({"schedule": "0 2 * * *", "runner": {"inject": "initContainer"}, "command": ["x"]}, 'task "report": runner.inject initContainer needs the task\'s own image'),
        (injected(), 'task "report": nothing to run: set command, or the image\'s own image.entrypoint and image.cmd'),
        (injected(runner={"inject": "sidecar"}, command=["x"]), 'task "report": runner.inject "sidecar" is not valid'),
        ({"schedule": "0 2 * * *", "command": ["x"], "image": {**PHP, "cmd": ["x"]}}, 'task "report": image.entrypoint and image.cmd are for runner.inject initContainer'),
        (injected(command=["x"], cronJobName="Not_A_Label"), 'task "report": cronJobName "Not_A_Label" is not a DNS label'),
        (injected(command=["x"], image={"tag": "1"}), 'task "report": image.repository is required'),
    ],
    ids=["python-task", "no-image", "nothing-to-run", "bad-mode", "cmd-without-inject", "bad-cronjob-name", "no-repository"],
)  # fmt: skip
def test_refused_by_the_template(schemaless: Chart, task: dict[str, Any], says: str) -> None:
    assert says in refused(schemaless, task)


def test_the_schema_refuses_an_unknown_inject_mode(chart: Chart) -> None:
    message = refused(chart, injected(runner={"inject": "sidecar"}, command=["x"]))
    assert "/tasks/report/runner/inject" in message


def test_redis_secrets_are_readable_by_a_uid_that_neither_owns_them_nor_has_an_fs_group(
    chart: Chart,
) -> None:
    """A distroless app (uid 65532, no fsGroup): the kubelet writes the secret files owned by
    root, so only the mode lets the app's uid read its password, sentinel password and CA."""
    distroless = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532}
    redis = {
        "sentinel": {
            "enabled": True,
            "masterName": "primary",
            "hosts": ["sentinel:26379"],
            "existingSecret": "redis-sentinel",
        },
        "auth": {"existingSecret": "redis-credentials"},
        "tls": {"enabled": True, "existingSecret": "redis-tls", "certKey": "tls.crt",
                "keyKey": "tls.key"},
    }  # fmt: skip
    rendered = render(
        chart,
        {
            "redis": redis,
            "tasks": {"report": injected(command=["/app"], podSecurityContext=distroless)},
        },
    )
    spec = pod_spec(rendered.cronjobs()["report"])
    assert "fsGroup" not in spec["securityContext"]
    modes = {v["name"]: v["secret"]["defaultMode"] for v in spec["volumes"] if "secret" in v}
    assert set(modes) == {"redis-password", "redis-sentinel-password", "redis-tls"}
    for name, mode in modes.items():
        assert mode & 0o004, f"{name}: mode {mode:o} is not readable by other uids"
        assert not mode & 0o222, f"{name}: mode {mode:o} is writable"


@pytest.mark.parametrize("redis", [REDIS, {"bundled": {"enabled": True}}], ids=["own", "bundled"])
def test_the_network_policy_leaves_an_injected_apps_traffic_alone_unless_asked(
    chart: Chart, redis: dict[str, Any]
) -> None:
    """An app in its own image calls its database and APIs: the chart's egress policy, which
    allows only DNS and Redis, must not select its pods unless networkPolicy.injectedTasks."""
    tasks = {
        "app": injected(command=["/app"], podLabels={"app.kubernetes.io/name": "shop"}),
        "native": {"schedule": "0 2 * * *", "task": "report"},
    }
    for tighten in (False, True):
        values = {"redis": redis, "tasks": tasks,
                  "networkPolicy": {"enabled": True, "injectedTasks": tighten}}  # fmt: skip
        rendered = render(chart, values, helm_install=True)
        policy = rendered.one("NetworkPolicy", "cron-runner-tasks")
        pods = {
            name: cj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
            for name, cj in rendered.cronjobs().items()
        }
        assert selects(policy["spec"]["podSelector"], pods["native"])
        assert selects(policy["spec"]["podSelector"], pods["app"]) is tighten
        if "bundled" in redis:
            # Either way, the injected task still reaches the bundled Redis.
            (ingress,) = rendered.one("NetworkPolicy", "cron-runner-redis")["spec"]["ingress"]
            (peer,) = ingress["from"]
            assert selects(peer["podSelector"], pods["app"])
            assert selects(peer["podSelector"], pods["native"])
        errors = [e for d in rendered.docs for v in KUBE_VERSIONS for e in schema_errors(d, v)]
        assert errors == []


def test_the_runners_failure_rules_name_the_container_that_runs_it(chart: Chart) -> None:
    """An injected task keeps the app's container name: the chart's rules for 64, 78, 79,
    126 and 127 must name that container, or Kubernetes would never apply them."""
    cj = one_task(chart, injected(command=["/app"], containerName="report"))
    assert container_name(cj) == "report"
    (rule,) = [r for r in cj["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
               if "onExitCodes" in r]  # fmt: skip
    assert rule["onExitCodes"] == {
        "containerName": "report", "operator": "In", "values": [64, 78, 79, 126, 127],
    }  # fmt: skip
    errors = [e for v in KUBE_VERSIONS for e in schema_errors(cj, v)]
    assert errors == []


def container_name(cj: dict[str, Any]) -> str:
    name: str = pod_spec(cj)["containers"][0]["name"]
    return name


@pytest.mark.parametrize(
    ("field", "extra"),
    [("extraPodSpec", {"volumes": []}), ("extraContainerSpec", {"env": []})],
)
def test_an_extra_field_the_chart_writes_itself_is_refused(
    chart: Chart, field: str, extra: dict[str, Any]
) -> None:
    with pytest.raises(HelmRenderError) as refused:
        one_task(chart, injected(command=["/app"], **{field: extra}))
    key = next(iter(extra))
    assert f'task "report": {field}.{key}: the chart writes this field itself' in str(refused.value)


def test_notes_name_a_host_namespace_carried_over_as_an_extra(chart: Chart) -> None:
    values = {
        "redis": REDIS,
        "tasks": {"report": injected(command=["/app"], extraPodSpec={"hostNetwork": True})},
    }
    notes = render(chart, values).notes
    assert "WARNING: task report loosens the chart's restricted security defaults" in notes
    assert "extraPodSpec.hostNetwork: true" in notes
