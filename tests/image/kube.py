"""The chart's CronJobs as the Pods Kubernetes would run, played with podman.

podman 4.3's `kube play` knows Pods but not Jobs or CronJobs, so this does the Job
controller's and the kubelet's part: it names the Job `<cronjob>-<minutes since epoch>`,
labels the Pod with it, and fills the downward-API variables the chart asks for.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from helm_python.chart import Chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "cron-runner"
IMAGE = os.environ.get("IMAGE", "localhost/cron-runner:test")
RELEASE = "cr"
NAMESPACE = "cron-system"
CONTAINER = "cron-runner"
# Measurements the tests print at the end of the run (tests/image/conftest.py).
FIGURES: list[str] = []

Manifest = dict[str, Any]


def render_cronjobs(values: Mapping[str, Any]) -> dict[str, Manifest]:
    """The chart's CronJobs keyed by task name (the `cron-runner.io/component` label)."""
    repository, _, tag = IMAGE.rpartition(":")
    rendered = Chart.load(CHART).render(
        {"image": {"repository": repository, "tag": tag}, **values},
        name=RELEASE,
        namespace=NAMESPACE,
    )
    cronjobs = {}
    for path, text in rendered.items():
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc and doc.get("kind") == "CronJob":
                cronjobs[doc["metadata"]["labels"]["cron-runner.io/component"]] = doc
    return cronjobs


def job_name(cronjob: Manifest, slot_epoch_s: int) -> str:
    """The Job name the CronJob controller gives the run scheduled at `slot_epoch_s`."""
    return f"{cronjob['metadata']['name']}-{slot_epoch_s // 60}"


def _field(pod: Manifest, path: str) -> str:
    meta = pod["metadata"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": socket.gethostname(),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.hostIP": "127.0.0.1",
        "status.podIP": "127.0.0.1",
    }
    if path in simple:
        return str(simple[path])
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    assert keyed, f"the chart uses downward-API field {path!r}: teach tests/image/kube.py it"
    # As the kubelet does, a label or annotation the pod lacks reads as empty.
    return str(meta.get(keyed[1], {}).get(keyed[2], ""))


def job_pod(cronjob: Manifest, *, job: str, pod_name: str) -> Manifest:
    """The Pod of Job `job`, from the CronJob's own template, ready for `podman kube play`."""
    template = copy.deepcopy(cronjob["spec"]["jobTemplate"]["spec"]["template"])
    labels = {
        **template["metadata"].get("labels", {}),
        "batch.kubernetes.io/job-name": job,
        "job-name": job,
    }
    pod: Manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": pod_name,
            "namespace": cronjob["metadata"]["namespace"],
            "uid": f"uid-{pod_name}",
            "labels": labels,
        },
        "spec": template["spec"],
    }
    # podman 4.3 plays an emptyDir as a named volume, shared by every pod that names it; the
    # kubelet gives each pod its own. Three pods copying the runner into one volume at once
    # would collide, so each pod's emptyDirs get names of their own.
    own = {
        v["name"]: f"{pod_name}-{v['name']}"
        for v in pod["spec"].get("volumes", [])
        if "emptyDir" in v
    }
    for volume in pod["spec"].get("volumes", []):
        volume["name"] = own.get(volume["name"], volume["name"])
    for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        for mount in container.get("volumeMounts", []):
            mount["name"] = own.get(mount["name"], mount["name"])
    # The test Redis listens on 127.0.0.1, and the image exists only in local storage.
    pod["spec"]["hostNetwork"] = True
    for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        container["imagePullPolicy"] = "Never"
        for env in container.get("env", []):
            source = env.pop("valueFrom", None)
            if source is None:
                continue
            assert set(source) == {"fieldRef"}, f"{env['name']}: {source} is not a fieldRef"
            env["value"] = _field(pod, source["fieldRef"]["fieldPath"])
    del pod["metadata"]["uid"]
    return pod


class Podman:
    """`podman` with the private configuration scripts/image.sh exports."""

    def __init__(self, workdir: Path) -> None:
        self.binary = shutil.which("podman")
        assert self.binary, "podman is not installed: apt-get install podman buildah runc catatonit"
        assert os.environ.get("CONTAINERS_CONF"), (
            "CONTAINERS_CONF is not set: run the image tests through `make test-image` "
            "(scripts/image.sh), which keeps podman's state in .work/podman"
        )
        self.workdir = workdir
        self.pods: list[str] = []

    def __call__(self, *args: str, timeout_s: float = 60, with_stderr: bool = False) -> str:
        assert self.binary
        done = subprocess.run(
            [self.binary, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr}"
        return done.stdout + done.stderr if with_stderr else done.stdout

    def play(self, *pods: Manifest) -> subprocess.Popen[str]:
        """Start `podman kube play` for these pods; the caller waits for it."""
        assert self.binary
        path = self.workdir / f"{pods[0]['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump_all(pods, sort_keys=False))
        self.pods += [p["metadata"]["name"] for p in pods]
        return subprocess.Popen(
            [self.binary, "kube", "play", "--quiet", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def play_at_once(self, pods: list[Manifest], timeout_s: float = 60) -> None:
        procs = [self.play(pod) for pod in pods]
        for proc in procs:
            _, err = proc.communicate(timeout=timeout_s)
            assert proc.returncode == 0, f"podman kube play: {err}"

    def wait_exit_codes(self, containers: list[str], timeout_s: float = 90) -> list[int]:
        out = self("wait", *containers, timeout_s=timeout_s)
        return [int(line) for line in out.split()]

    def log_events(self, container: str) -> list[dict[str, Any]]:
        out = self("logs", container, with_stderr=True)
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def wait_for_event(
        self, container: str, event: str, timeout_s: float = 30
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            events = self.log_events(container)
            if any(e.get("event") == event for e in events):
                return events
            assert time.monotonic() < deadline, f"{container} never logged {event!r}: {events}"
            time.sleep(0.2)

    def remove_pods(self) -> None:
        for pod in self.pods:
            subprocess.run(
                [self.binary or "podman", "pod", "rm", "--force", "--time", "0", pod],
                capture_output=True,
                timeout=60,
                check=False,
            )
            # The pod's emptyDirs, which podman keeps as named volumes (job_pod).
            volumes = self("volume", "ls", "--quiet", "--filter", f"name=^{pod}-").split()
            if volumes:
                self("volume", "rm", "--force", *volumes)
        self.pods.clear()


def container_of(pod: Manifest) -> str:
    """podman names a kube-played container `<pod>-<container>`."""
    return f"{pod['metadata']['name']}-{CONTAINER}"
