"""The chart installed on a real API server, with the real CronJob and Job controllers.

Every object must be admitted, the CronJob controller must name its Jobs as the runner reads
them, and a Job made with `kubectl create job --from=cronjob/...` must get its pod from the Job
controller, under the namespace's Pod Security "restricted" admission. The image here is the
README's example, never imported and never pulled (`pullPolicy: Never`): the task pods stay
Pending on the node, and nothing leaves this machine. test_quickstart.py runs the real image.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import yaml

from tests.e2e.cluster import REPO, Cluster

pytestmark = pytest.mark.e2e

NAMESPACE = "cron-system"
RELEASE = "cron-runner"
SCHEDULED = "batch.kubernetes.io/cronjob-scheduled-timestamp"


@pytest.fixture
def release(cluster: Cluster) -> Iterator[Cluster]:
    cluster.delete_namespace(NAMESPACE)
    # The README's install, plus a task firing every minute for the CronJob controller.
    cluster.helm(
        "install", RELEASE, str(REPO / "charts/cron-runner"), "-n", NAMESPACE,
        "--create-namespace",
        "--set", "redis.bundled.enabled=true",
        "--set", "tasks.report.schedule=0 2 * * *",
        "--set", "tasks.report.command={php,artisan,report:send}",
        "--set", "tasks.minutely.schedule=* * * * *",
        "--set", "tasks.minutely.command={true}",
        "--set", "image.repository=my-registry/my-app-with-cron-runner",
        "--set", "image.tag=2024.06.1",
        "--set", "image.pullPolicy=Never",
    )  # fmt: skip
    cluster.kubectl(
        "label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted", "pod-security.kubernetes.io/audit=restricted",
    )  # fmt: skip
    yield cluster
    cluster.helm("uninstall", RELEASE, "-n", NAMESPACE)
    cluster.delete_namespace(NAMESPACE)


def manifest_objects(cluster: Cluster) -> list[tuple[str, str]]:
    """(kind, name) of every object of the release, as helm sent them."""
    rendered = cluster.helm("get", "manifest", RELEASE, "-n", NAMESPACE)
    return [(doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(rendered) if doc]


def test_every_object_is_admitted(release: Cluster) -> None:
    objects = manifest_objects(release)
    assert ("CronJob", "cron-runner-report") in objects
    for kind, name in objects:
        found = release.get(kind, name, "-n", NAMESPACE)
        assert found["metadata"]["name"] == name
    cronjob = release.get("cronjob", "cron-runner-report", "-n", NAMESPACE)
    assert cronjob["spec"]["schedule"] == "0 2 * * *"


def test_create_job_from_cronjob_gets_a_pod_admitted_as_restricted(release: Cluster) -> None:
    release.kubectl(
        "create", "job", "-n", NAMESPACE, "--from=cronjob/cron-runner-report",
        "cron-runner-report-manual",
    )  # fmt: skip
    # The Job controller creates the pod; Pod Security "restricted" would refuse a pod spec
    # that breaks it (the Job would then show FailedCreate events and no pod).
    pods = release.wait_for(
        "pod of the manual Job",
        60,
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        "job-name=cron-runner-report-manual",
    )
    (pod,) = pods["items"]
    assert pod["metadata"]["ownerReferences"][0]["name"] == "cron-runner-report-manual"
    assert pod["status"]["phase"] == "Pending"  # its image is not on the node


def test_cronjob_controller_names_the_job_by_its_minute(release: Cluster) -> None:
    # The controller fires on the next minute boundary: at most a minute and its sync period.
    jobs = release.wait_for(
        "Job of cron-runner-minutely", 100, "jobs", "-n", NAMESPACE,
        "-l", "app.kubernetes.io/component=minutely",
    )  # fmt: skip
    job = jobs["items"][0]
    name = job["metadata"]["name"]
    minutes = int(name.removeprefix("cron-runner-minutely-"))
    scheduled = datetime.fromtimestamp(minutes * 60, UTC)
    assert abs(time.time() - scheduled.timestamp()) < 180
    # The controller writes the scheduled time on the Job, in the CronJob's zone (UTC here)...
    stamp = job["metadata"]["annotations"][SCHEDULED]
    assert datetime.fromisoformat(stamp) == scheduled
    # ...and not on the pod: the Job controller copies only the Job's pod template.
    pods = release.wait_for("pod of " + name, 60, "pods", "-n", NAMESPACE, "-l", f"job-name={name}")
    assert SCHEDULED not in pods["items"][0]["metadata"].get("annotations", {})
