"""The chart and the runner speak one contract (the environment contract, docs/design.md).

A CronJob rendered by the chart is played the way Kubernetes would play it, without a
cluster: the CronJob controller names the Job `<cronjob>-<minutes since epoch>` and labels
its pods with it; the kubelet resolves the downward-API and Secret references and `$(VAR)`
expansions; each "pod" is the installed `cron-runner` started with the container's rendered
command and args against a real Redis. Five pods of one Job: exactly one runs the command,
the others skip and exit 0. The side effect, a line appended to a file, is what is counted.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from croniter import croniter
from helm_python.chart import Chart

from runner.testing import RedisServer
from tests.chart.helpers import NAMESPACE, ROOT, Manifest, container, pod_spec, render

VENV_BIN = Path(sys.executable).parent
SCHEDULE = "*/5 * * * *"
TASK = "contract"
USERNAME = "cron-runner"
PASSWORD_SECRET = ("redis-auth", "password")
REPLICAS = 5
# Not the machine's environment: only what any image has, so that the pods live on the
# chart's variables alone.
BASE_ENV = {"PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass
class RedisWithAcl:
    server: RedisServer
    password: str

    def client(self) -> redis.Redis:
        return self.server.client(username=USERNAME, password=self.password)


@pytest.fixture
def acl_redis(redis_server: RedisServer) -> Iterator[RedisWithAcl]:
    """The fixture's Redis, reachable only as an ACL user with a password: a pod that did
    not get the Secret's password or the username could not even connect."""
    password = secrets.token_hex(16)
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", USERNAME, "on", f">{password}", "~*", "&*", "+@all")
    admin.execute_command("ACL", "SETUSER", "default", "off")
    admin.close()
    yield RedisWithAcl(redis_server, password)


@dataclass
class Pod:
    """What the kubelet would hand the container: its process arguments and environment."""

    name: str
    argv: list[str]
    env: dict[str, str]


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined variables are replaced, `$$` escapes `$`,
    and a reference to an undefined variable stays as written."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REF.sub(sub, text)


def field_value(path: str, pod_meta: Manifest) -> str:
    if path == "metadata.name":
        return str(pod_meta["name"])
    if path == "metadata.namespace":
        return str(pod_meta["namespace"])
    label = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    assert label, f"the chart uses downward-API field {path!r}: teach this test to resolve it"
    # The kubelet gives an empty value for a label or annotation the pod does not carry.
    return str(pod_meta.get(label.group(1), {}).get(label.group(2), ""))


def kubelet_env(
    c: Manifest, pod_meta: Manifest, secrets_data: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    env: dict[str, str] = {}
    assert not c.get("envFrom"), "envFrom sources are not resolved here"
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[var["name"]] = field_value(source["fieldRef"]["fieldPath"], pod_meta)
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            # A missing Secret or key keeps the pod from starting (CreateContainerConfigError).
            env[var["name"]] = secrets_data[ref["name"]][ref["key"]]
        else:
            raise AssertionError(f"unexpected env source {source}")
    return env


def mount_secrets(
    cronjob: Manifest,
    c: Manifest,
    secrets_data: Mapping[str, Mapping[str, str]],
    env: dict[str, str],
) -> dict[str, str]:
    """Write each mounted Secret volume's items as the kubelet would, under a temporary root
    standing in for the container's file system, and point the variables that name a file in a
    mount there."""
    import tempfile  # noqa: PLC0415

    root = Path(tempfile.mkdtemp(prefix="kubelet-"))
    volumes = {v["name"]: v for v in pod_spec(cronjob).get("volumes", [])}
    for mount in c.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        where = root / mount["mountPath"].lstrip("/")
        where.mkdir(parents=True, exist_ok=True)
        # A missing Secret or key keeps the pod from starting (ContainerCreating).
        data = secrets_data[secret["secretName"]]
        for item in secret.get("items", []):
            (where / item["path"]).write_text(data[item["key"]])
        env = {k: str(root / v.lstrip("/")) if v.startswith(mount["mountPath"] + "/") else v
               for k, v in env.items()}  # fmt: skip
    return env


def job_pods(
    cronjob: Manifest, job: str, secrets_data: Mapping[str, Mapping[str, str]]
) -> list[Pod]:
    """The pods the Job controller would start for Job `job`, as the kubelet sees them."""
    c = container(cronjob)
    assert c["command"] == ["cron-runner"], "the contract assumes the image's cron-runner"
    pods = []
    for _ in range(REPLICAS):
        meta = {
            "name": f"{job}-{secrets.token_hex(3)[:5]}",
            "namespace": cronjob["metadata"]["namespace"],
            "labels": {"batch.kubernetes.io/job-name": job, "job-name": job},
        }
        env = kubelet_env(c, meta, secrets_data)
        env = mount_secrets(cronjob, c, secrets_data, env)
        argv = [str(VENV_BIN / "cron-runner"), *(expand(a, env) for a in c["args"])]
        pods.append(Pod(meta["name"], argv, env))
    return pods


def run_pods(pods: list[Pod]) -> list[subprocess.CompletedProcess[str]]:
    procs = [
        subprocess.Popen(
            pod.argv,
            env={**BASE_ENV, "HOSTNAME": pod.name, **pod.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pod in pods
    ]
    results = []
    for proc, pod in zip(procs, pods, strict=True):
        out, err = proc.communicate(timeout=60)
        results.append(subprocess.CompletedProcess(pod.argv, proc.returncode, out, err))
    return results


def rendered_cronjob(
    chart: Chart, redis_port: int, effects: Path, kind: str = "command", schedule: str = SCHEDULE
) -> Manifest:
    """A task that appends `ran <holder> ...` to `effects` each time it runs."""
    runner: dict[str, Any] = {"connectTimeout": "5s"}
    task: dict[str, Any] = {"schedule": schedule, "lease": {"ttl": "3s"}}
    if kind == "command":
        # Holds the lease a moment, so that pods starting late find it held too.
        task["command"] = ["sh", "-c", 'echo "ran $CRON_RUNNER_HOLDER" >> "$EFFECTS"; sleep 1']
        task["env"] = {"EFFECTS": str(effects)}
    else:
        task["task"] = "ok"  # tests/sample_tasks.py
        task["env"] = {"SIDE_EFFECTS": str(effects)}
        runner["taskModules"] = ["tests.sample_tasks"]
        runner["env"] = {"PYTHONPATH": str(ROOT)}
    values: dict[str, Any] = {
        "redis": {
            "host": "127.0.0.1",
            "port": redis_port,
            "auth": {
                "username": USERNAME,
                "existingSecret": PASSWORD_SECRET[0],
                "passwordKey": PASSWORD_SECRET[1],
            },
        },
        "runner": runner,
        "tasks": {TASK: task},
    }
    cronjob: Manifest = render(chart, values).cronjobs()[TASK]
    assert pod_spec(cronjob)["restartPolicy"] == "Never"
    return cronjob


def latest_job(cronjob: Manifest) -> str:
    """The CronJob controller's Job for the schedule's latest fire time:
    `<cronjob>-<scheduled time in minutes since the epoch>`."""
    fired = croniter(cronjob["spec"]["schedule"], datetime.now(UTC)).get_prev(datetime)
    return f"{cronjob['metadata']['name']}-{int(fired.timestamp()) // 60}"


def ran_by(effects: Path) -> list[str]:
    """The holder of each run, from the lines the task appended."""
    if not effects.exists():
        return []
    return [line.split()[1] for line in effects.read_text().splitlines()]


@pytest.mark.parametrize(
    ("kind", "schedule"),
    [("command", SCHEDULE), ("registered", SCHEDULE), ("command", "* * * * *")],
)
def test_five_pods_of_one_job_run_the_task_once(
    chart: Chart, acl_redis: RedisWithAcl, tmp_path: Path, kind: str, schedule: str
) -> None:
    effects = tmp_path / "effects.log"
    cronjob = rendered_cronjob(chart, acl_redis.server.port, effects, kind, schedule)
    name = cronjob["metadata"]["name"]
    secrets_data = {PASSWORD_SECRET[0]: {PASSWORD_SECRET[1]: acl_redis.password}}

    job = latest_job(cronjob)
    pods = job_pods(cronjob, job, secrets_data)
    results = run_pods(pods)
    assert [r.returncode for r in results] == [0] * REPLICAS, [r.stderr for r in results]
    runners = ran_by(effects)
    assert len(runners) == 1, runners
    # The holder is the pod name, from the downward API.
    assert runners[0] in {pod.name for pod in pods}

    # A retry pod of the same Job finds the slot done.
    (retry,) = run_pods(job_pods(cronjob, job, secrets_data)[:1])
    assert retry.returncode == 0, retry.stderr
    assert len(ran_by(effects)) == 1

    # `kubectl create job --from=cronjob/<name> <name>-manual`: no slot, so it runs.
    (manual,) = run_pods(job_pods(cronjob, f"{name}-manual", secrets_data)[:1])
    assert manual.returncode == 0, manual.stderr
    assert len(ran_by(effects)) == 2

    # The keys are scoped by the pod's namespace and named by the chart's task key, also for
    # a registered task of another name (`run ok --name <key>`).
    client = acl_redis.client()
    try:
        keys = client.keys(f"*{{{NAMESPACE}:{TASK}}}*")
    finally:
        client.close()
    assert keys, "no keys under the {namespace:task} hash tag"


def test_a_pod_with_the_wrong_password_never_runs_the_task(
    chart: Chart, acl_redis: RedisWithAcl, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    cronjob = rendered_cronjob(chart, acl_redis.server.port, effects)
    wrong = {PASSWORD_SECRET[0]: {PASSWORD_SECRET[1]: "not-the-password"}}
    (result,) = run_pods(job_pods(cronjob, latest_job(cronjob), wrong)[:1])
    # Refused credentials are a configuration error: exit 78, which the podFailurePolicy
    # turns into a failed Job at once, and the command never ran.
    assert result.returncode == 78, result.stderr
    assert ran_by(effects) == []
    assert "not-the-password" not in result.stderr + result.stdout
