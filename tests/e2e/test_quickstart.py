"""The README's Kubernetes quickstart, run as written on the node of `make k8s-up`.

The commands come from the README's marked block, so the docs and this test cannot drift. One
thing is substituted: the runner image, `ghcr.io/cron-runner/cron-runner` at the chart's
appVersion, becomes `localhost/cron-runner:test` (scripts/image.sh, imported into the node by
scripts/k8s-images.sh; there is no registry). The bundled Redis keeps the chart's default image
name, under which scripts/k8s-images.sh imports a Redis built from Debian's redis-server, and
its claim binds a volume that `make k8s-up` offers. The runner reaches it by its Service name,
through CoreDNS and kube-proxy.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.e2e.cluster import REPO, Cluster

pytestmark = pytest.mark.e2e

MARK = "<!-- kubernetes-quickstart: tests/e2e runs this block as written -->"
NAMESPACE = "cron-system"
CRONJOB = "cron-runner-hello"
README_IMAGE = "image.repository=ghcr.io/cron-runner/cron-runner"
LOCAL_IMAGE = ["image.repository=localhost/cron-runner", "--set", "image.tag=test"]


def quickstart() -> list[list[str]]:
    """The marked block's commands, continuation lines joined, comments and blanks left out."""
    text = (REPO / "README.md").read_text()
    assert MARK in text, f"README.md lost its marker {MARK}"
    block = text.split(MARK, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(shlex.split(line))
    return commands


def substituted(argv: list[str]) -> list[str]:
    """The command with the runner image swapped for the local one; nothing else changes."""
    out: list[str] = []
    for arg in argv:
        out.extend(LOCAL_IMAGE if arg == README_IMAGE else [arg])
    return out


def command(commands: list[list[str]], *prefix: str) -> list[str]:
    (found,) = [c for c in commands if c[: len(prefix)] == list(prefix)]
    return found


def run(cluster: Cluster, argv: list[str]) -> str:
    tool, *args = argv
    assert tool in ("helm", "kubectl"), f"the quickstart runs {tool}, which the test does not know"
    return cluster.run(tool, *args).stdout


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = []
    for line in text.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def wait_until(what: str, seconds: float, probe: Any) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {seconds:.0f} s")
        time.sleep(2)
    return found


def succeeded_job_pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Pods of the task's Jobs that exited 0, by Job name."""
    pods = cluster.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=hello")
    return {
        pod["metadata"]["labels"]["job-name"]: pod
        for pod in pods["items"]
        if pod["status"].get("phase") == "Succeeded"
    }


def pod_lines(cluster: Cluster, pod: str) -> list[dict[str, Any]]:
    return json_lines(cluster.kubectl("logs", "-n", NAMESPACE, pod))


def slot_of(job: str) -> int:
    """The slot a CronJob's Job stands for: its name ends with the scheduled minute."""
    match = re.fullmatch(rf"{CRONJOB}-(\d+)", job)
    assert match, f"{job} is not named as the CronJob controller names its Jobs"
    return int(match.group(1)) * 60


def ts(line: dict[str, Any]) -> float:
    return datetime.strptime(line["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def redis_keys(cluster: Cluster, pattern: str) -> list[str]:
    """Keys in the bundled Redis, read with its own redis-cli (the pod has the password)."""
    out = cluster.kubectl(
        "exec", "-n", NAMESPACE, "statefulset/cron-runner-redis", "--",
        "redis-cli", "--scan", "--pattern", pattern,
    )  # fmt: skip
    return out.split()


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[tuple[Cluster, list[list[str]]]]:
    commands = quickstart()
    cluster.delete_namespace(NAMESPACE)
    run(cluster, substituted(command(commands, "helm", "install")))
    run(cluster, command(commands, "kubectl", "label", "namespace"))
    yield cluster, commands
    cluster.run("helm", "uninstall", "cron-runner", "-n", NAMESPACE, check=False)
    cluster.delete_namespace(NAMESPACE)


@pytest.mark.timeout(420)
def test_the_readme_quickstart_runs_the_task_once_per_slot(
    installed: tuple[Cluster, list[list[str]]],
) -> None:
    cluster, commands = installed
    assert len(commands) == 4, f"the quickstart changed: {commands}; update this test"

    # Every object helm sent was admitted, under Pod Security "restricted".
    ns = cluster.get("namespace", NAMESPACE)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    manifest = cluster.helm("get", "manifest", "cron-runner", "-n", NAMESPACE)
    kinds = re.findall(r"^kind: (\w+)\n(?:.*\n)*?  name: (\S+)", manifest, re.MULTILINE)
    assert ("CronJob", CRONJOB) in kinds
    for kind, name in kinds:
        cluster.get(kind, name, "-n", NAMESPACE)

    # The CronJob controller makes the Job at the next minute; its pod runs the runner, which
    # reaches the bundled Redis by its Service name and takes the lease for the Job's slot.
    done = wait_until("a scheduled Job's pod succeeded", 200, lambda: succeeded_job_pods(cluster))
    job = sorted(done)[0]
    slot = slot_of(job)

    # The README's `kubectl logs` shows the run, one JSON line per step.
    logs = json_lines(run(cluster, command(commands, "kubectl", "logs")))
    ran = [line for line in logs if line.get("slot") == slot]
    assert ran, f"no line for slot {slot} in the README's kubectl logs:\n{logs}"
    for line in ran:
        assert {"task", "slot", "holder", "outcome"} <= line.keys()
        assert line["task"] == "hello"
    assert "acquired" in [line.get("event") for line in ran], ran
    outcomes = [line["outcome"] for line in ran if line["outcome"]]
    assert "ran" in outcomes, ran
    assert len({line["holder"] for line in ran if line["holder"]}) == 1

    # The slot's completion marker is in Redis.
    assert redis_keys(cluster, f"*:slot:{slot}"), f"no marker for slot {slot} in Redis"

    # The README's `kubectl create job --from=cronjob/...` runs at once (no slot).
    run(cluster, command(commands, "kubectl", "create", "job"))
    manual = "cron-runner-hello-manual"
    pod = wait_until(f"{manual} succeeded", 120, lambda: succeeded_job_pods(cluster).get(manual))
    lines = pod_lines(cluster, pod["metadata"]["name"])
    assert "ran" in [line.get("outcome") for line in lines], lines


# Five real firings of `* * * * *`: five to six minutes.
@pytest.mark.timeout(540)
def test_fire_to_start_over_five_slots(installed: tuple[Cluster, list[list[str]]]) -> None:
    """Slot time to the runner's `acquired` line, for the CronJob's real firings."""
    cluster, _ = installed
    delays: dict[int, float] = {}
    deadline = time.monotonic() + 7 * 60
    while len(delays) < 5:
        assert time.monotonic() < deadline, f"only {len(delays)} slots ran in 7 minutes"
        for job, pod in succeeded_job_pods(cluster).items():
            if job.endswith("-manual") or slot_of(job) in delays:
                continue
            slot = slot_of(job)
            lines = pod_lines(cluster, pod["metadata"]["name"])
            (acquired,) = [x for x in lines if x.get("event") == "acquired"]
            assert acquired["slot"] == slot, lines
            delays[slot] = ts(acquired) - slot
        time.sleep(5)
    figures = sorted(delays.values())
    print(
        f"\nfire-to-start over {len(figures)} slots: median {statistics.median(figures):.1f} s,"
        f" max {max(figures):.1f} s ({', '.join(f'{d:.1f}' for d in figures)})"
    )
    assert max(figures) < 60, figures
