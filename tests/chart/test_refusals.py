"""Values the chart refuses, each with a message that names the task and says what to do.

The schema refuses most mistakes first. The templates refuse them again, because
`helm install --skip-schema-validation` exists and a parent chart may loosen the schema:
those checks are tested on a copy of the chart without its schema.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from helm_python import HelmRenderError, HelmValuesError
from helm_python.chart import Chart

from tests.chart.helpers import CHART_DIR, pod_spec, render

REDIS = {"host": "redis"}


def task_values(task: dict[str, Any], name: str = "report", **top: Any) -> dict[str, Any]:
    return {"redis": REDIS, "tasks": {name: task}, **top}


def refused(chart: Chart, values: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises((HelmRenderError, HelmValuesError)) as info:
        render(chart, values, **kwargs)
    return str(info.value)


def test_over_long_cronjob_name_fails_naming_the_task(chart: Chart) -> None:
    task = "nightly-invoice-reconciliation"
    release = "billing-platform-prod"
    message = refused(
        chart, task_values({"schedule": "0 2 * * *", "task": "x"}, task), name=release
    )
    cronjob = f"{release}-cron-runner-{task}"
    assert f'task "{task}": its CronJob name "{cronjob}" is {len(cronjob)} characters' in message
    assert "at most 52" in message
    # Exactly 52 still renders: the limit is not off by one.
    fits = "x" * (52 - len("cron-runner-"))
    rendered = render(chart, task_values({"schedule": "0 2 * * *", "task": "x"}, fits))
    assert len(rendered.of_kind("CronJob")[0]["metadata"]["name"]) == 52


def test_task_and_command_together_are_refused_by_the_schema(chart: Chart) -> None:
    message = refused(chart, task_values({"schedule": "0 2 * * *", "task": "x", "command": ["y"]}))
    assert "at '/tasks/report': 'allOf' failed" in message
    assert "at '/tasks/report': 'not' failed" in message


def test_task_and_command_together_are_refused_by_the_template(schemaless: Chart) -> None:
    message = refused(
        schemaless, task_values({"schedule": "0 2 * * *", "task": "x", "command": ["y"]})
    )
    assert (
        'task "report": set either task (a registered task name) or command (a list), not both'
        in message
    )


@pytest.mark.parametrize(
    ("task", "name", "schema_says", "template_says"),
    [
        (
            {"task": "x"},
            "report",
            "at '/tasks/report': missing property 'schedule'",
            'task "report": schedule is required',
        ),
        (
            {"schedule": "0 2 * * *"},
            "report",
            "missing property 'task'",
            'task "report": set task (a registered task name) or command (a list)',
        ),
        (
            {"schedule": "0 2 * * *", "task": "x"},
            "Report_1",
            "'Report_1' does not match pattern",
            'task "Report_1": a task name must be a DNS label',
        ),
        (
            {"schedule": "0 2 * * *", "task": "x"},
            "bundled-redis",
            'task "bundled-redis": this name is reserved',
            'task "bundled-redis": this name is reserved',
        ),
        (
            {"schedule": "0 2 * * *", "task": "x", "args": ["--y"]},
            "report",
            "at '/tasks/report'",
            'task "report": args go with command only',
        ),
        (
            {"schedule": "0 2 * * *", "task": "x", "terminationGracePeriodSeconds": 5},
            "report",
            "at '/tasks/report/terminationGracePeriodSeconds': minimum: got 5, want 6",
            'task "report": terminationGracePeriodSeconds must be at least 6',
        ),
        (
            {"schedule": "0 2 * * *", "task": "x", "restartPolicy": "OnFailure"},
            "report",
            None,
            'task "report": podFailurePolicy needs restartPolicy Never',
        ),
    ],
    ids=[
        "no-schedule",
        "no-task",
        "bad-name",
        "reserved-name",
        "args-with-task",
        "grace",
        "restart",
    ],
)
def test_bad_task_refused_by_schema_and_template(
    chart: Chart,
    schemaless: Chart,
    *,
    task: dict[str, Any],
    name: str,
    schema_says: str | None,
    template_says: str,
) -> None:
    if schema_says is not None:
        assert schema_says in refused(chart, task_values(task, name))
    assert template_says in refused(schemaless, task_values(task, name))


@pytest.mark.parametrize(
    ("redis", "says"),
    [
        ({}, "no Redis configured: set redis.host"),
        ({"url": "redis://:pw@redis:6379/0"}, "redis.url must not carry credentials"),
        ({"url": "redis://redis:6379/0?password=pw"}, "redis.url must not carry credentials"),
        ({"url": "redis://redis:6379/0?a=1&Password=pw"}, "redis.url must not carry credentials"),
        ({"host": "r", "tls": {"enabled": True}}, "redis.tls.existingSecret is empty"),
        (
            {"url": "redis://r:6379/0", "tls": {"enabled": True, "existingSecret": "ca"}},
            "use rediss://",
        ),
        ({"sentinel": {"enabled": True}}, "redis.sentinel.hosts is empty"),
        (
            {"bundled": {"enabled": True}, "tls": {"enabled": True, "existingSecret": "ca"}},
            "no TLS",
        ),
    ],
    ids=[
        "none",
        "credentials",
        "query-password",
        "query-password-any-case",
        "tls-no-secret",
        "tls-plain-url",
        "sentinel-no-hosts",
        "bundled-tls",
    ],
)
def test_bad_redis_settings_refused(schemaless: Chart, redis: dict[str, Any], says: str) -> None:
    values = {"redis": redis, "tasks": {"report": {"schedule": "0 2 * * *", "task": "x"}}}
    assert says in refused(schemaless, values)


def test_no_top_level_additional_properties_so_it_works_as_a_subchart(chart: Chart) -> None:
    schema = chart.schema
    assert schema is not None
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema.get("additionalProperties", True) is not False
    values = {"global": {"imageRegistry": "mirror"}, "parentSetting": 1, "redis": REDIS}
    assert render(chart, values).docs


def test_templates_never_gate_objects_on_api_versions() -> None:
    # The offline render (helm-python-sdk) lists no batch/v1/CronJob: such a gate would
    # silently drop every CronJob there (../shared/DESIGN.md, Chart). The one use tells an offline render
    # from a real install, to keep the bundled Redis's password from changing under it.
    for template in (CHART_DIR / "templates").rglob("*"):
        if template.is_file() and template.name != "redis-secret.yaml":
            assert "APIVersions" not in template.read_text(), template
    secret = (CHART_DIR / "templates" / "redis-secret.yaml").read_text()
    assert secret.count("APIVersions") == 1
    assert '.Capabilities.APIVersions.Has "v1/Secret"' in secret


BUNDLED = {"redis": {"bundled": {"enabled": True}}}


def test_an_offline_render_never_generates_the_bundled_password(chart: Chart) -> None:
    # helm template, Argo CD, a CI render: lookup finds nothing, and a password generated here
    # would change on every render while the running Redis keeps the first (issue 14, item 9).
    message = refused(chart, BUNDLED)
    assert "redis.bundled.enabled: this render cannot read the cluster" in message
    assert (
        "kubectl create secret generic cron-runner-redis-auth -n cron-system "
        '--from-literal=password="$(openssl rand -hex 24)"' in message
    )
    assert "set redis.auth.existingSecret=cron-runner-redis-auth" in message


def test_an_offline_render_with_an_existing_secret_is_stable(chart: Chart) -> None:
    values = {"redis": {"bundled": {"enabled": True}, "auth": {"existingSecret": "mine"}}}
    first, second = render(chart, values), render(chart, values)
    assert first.docs == second.docs
    assert not first.of_kind("Secret")
    sts = first.one("StatefulSet")
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in pod_spec(sts)["containers"][0]["env"]}
    assert refs == {"mine"}


def test_helm_install_generates_the_bundled_password_once(chart: Chart) -> None:
    # Against a cluster, Helm's discovery lists v1/Secret: a first install generates one (an
    # upgrade then finds it with lookup and keeps it; helm-python-sdk cannot show that part).
    first = render(chart, BUNDLED, helm_install=True).one("Secret")
    second = render(chart, BUNDLED, helm_install=True).one("Secret")
    assert first["data"]["password"] and first["immutable"] is True
    assert first["data"]["password"] != second["data"]["password"]


@pytest.mark.parametrize(
    ("also", "named"),
    [
        ({"host": "redis.example"}, "redis.host"),
        ({"url": "redis://redis.example:6379/0"}, "redis.url"),
        ({"sentinel": {"enabled": True, "hosts": ["s:26379"]}}, "redis.sentinel.enabled"),
        ({"cluster": {"enabled": True}, "host": "r"}, "redis.host, redis.cluster.enabled"),
    ],
    ids=["host", "url", "sentinel", "cluster"],
)
def test_the_bundled_redis_and_another_redis_are_refused_together(
    chart: Chart, also: dict[str, Any], named: str
) -> None:
    values = {"redis": {"bundled": {"enabled": True}, **also}}
    message = refused(chart, values)
    assert f"redis.bundled.enabled and {named} are both set" in message
    assert f"ignore {named}. Set one" in message


def test_chart_metadata() -> None:
    meta = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["kubeVersion"] == ">=1.27.0-0"
    assert meta["appVersion"] == "0.1.0"
    assert meta["maintainers"] and meta["sources"]
    assert any(k.startswith("artifacthub.io/") for k in meta["annotations"])


@pytest.mark.parametrize("where", ["runner", "task"])
@pytest.mark.parametrize(
    "var",
    [
        "CRON_RUNNER_SHUTDOWN_GRACE",
        "CRON_RUNNER_JOB_NAME",
        "CRON_RUNNER_CRONJOB_NAME",
        "CRON_RUNNER_SCHEDULED_TIMESTAMP",
    ],
)
def test_env_may_not_override_what_the_chart_derives(chart: Chart, where: str, var: str) -> None:
    # A grace apart from terminationGracePeriodSeconds lets the kubelet kill the runner before
    # it releases; a Job name from env would give every pod the same slot forever.
    task: dict[str, Any] = {"schedule": "0 2 * * *", "task": "report"}
    top: dict[str, Any] = {}
    if where == "task":
        task["env"] = {var: "x"}
    else:
        top["runner"] = {"env": {var: "x"}}
    message = refused(chart, task_values(task, **top))
    assert f'task "report": {var} is set by the chart and may not be overridden' in message


@pytest.mark.parametrize("ttl", ["500ms", "0.5s", "0", "999ms"])
def test_a_lease_ttl_below_one_second_is_refused(chart: Chart, ttl: str) -> None:
    # The runner refuses it (exit 2): every Job of the task would fail at once.
    message = refused(
        chart, task_values({"schedule": "0 2 * * *", "task": "r", "lease": {"ttl": ttl}})
    )
    assert "/tasks/report/lease/ttl" in message
    assert render(
        chart, task_values({"schedule": "0 2 * * *", "task": "r", "lease": {"ttl": "1500ms"}})
    )
