"""The chart's CronJobs as the Pods Kubernetes would run, played with podman.

podman 4.3's `kube play` knows Pods but not Jobs or CronJobs, so this does the Job
controller's and the kubelet's part: it names the Job `<cronjob>-<minutes since epoch>`,
labels the Pod with it, fills the downward-API variables the chart asks for, and writes the
Secret volumes as a kubelet does.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
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
# A Secret volume's files when neither the volume nor the item gives a mode (the API's default).
SECRET_DEFAULT_MODE = 0o644


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


def secret(name: str, data: Mapping[str, str], namespace: str = NAMESPACE) -> Manifest:
    """A Secret as the API server stores it: each value base64-encoded under `data`."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def _secret_files(
    volume: Manifest, secrets: Sequence[Manifest], namespace: str
) -> dict[str, tuple[bytes, int]]:
    """The files a kubelet writes for a `secret` volume: path -> (content, mode)."""
    source = volume["secret"]
    found = [
        s
        for s in secrets
        if s["metadata"]["name"] == source["secretName"]
        and s["metadata"].get("namespace", namespace) == namespace
    ]
    optional = source.get("optional", False)
    # A kubelet leaves such a pod in ContainerCreating; a test that forgot the Secret says so.
    assert found or optional, (
        f"volume {volume['name']!r} mounts Secret {source['secretName']!r}, which the test did "
        "not give to job_pod"
    )
    data: dict[str, bytes] = {}
    if found:
        data = {k: base64.b64decode(v) for k, v in (found[0].get("data") or {}).items()}
        # stringData, as the API server merges it into data on write.
        data |= {k: v.encode() for k, v in (found[0].get("stringData") or {}).items()}
    default_mode = source.get("defaultMode", SECRET_DEFAULT_MODE)
    items = source.get("items")
    if items is None:
        return {key: (value, default_mode) for key, value in data.items()}
    files = {}
    for item in items:
        assert item["key"] in data or optional, (
            f"Secret {source['secretName']!r} has no key {item['key']!r} (volume {volume['name']!r})"
        )
        if item["key"] in data:
            files[item["path"]] = (data[item["key"]], item.get("mode", default_mode))
    return files


def _write_secret_volume(directory: Path, files: Mapping[str, tuple[bytes, int]]) -> None:
    """The kubelet's layout (its atomic writer): the files in a timestamped directory, `..data`
    linking to it, and a link per top-level name into `..data`. Everything is owned by root:
    without fsGroup the kubelet changes no group, so only the mode lets another uid read."""
    stamp = directory / time.strftime("..%Y_%m_%d_%H_%M_%S.0000000001", time.gmtime())
    stamp.mkdir(parents=True)
    for relative, (content, mode) in files.items():
        path = stamp / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.chown(path, 0, 0)
        path.chmod(mode)  # exactly the volume's or the item's mode, not masked by our umask
    for sub in [stamp, *(p for p in stamp.rglob("*") if p.is_dir())]:
        os.chown(sub, 0, 0)
        sub.chmod(0o755)
    (directory / "..data").symlink_to(stamp.name)
    for top in sorted({relative.split("/")[0] for relative in files}):
        (directory / top).symlink_to(f"..data/{top}")
    # The volume's own directory, as a kubelet makes it (a tmpfs, drwxrwxrwt).
    os.chown(directory, 0, 0)
    directory.chmod(0o1777)


def _mount_secrets(pod: Manifest, secrets: Sequence[Manifest], volumes_dir: Path | None) -> None:
    """Each `secret` volume becomes a read-only bind mount of the files a kubelet would write:
    podman 4.3 has no Secret volumes of the Kubernetes kind."""
    spec = pod["spec"]
    mounted = set()
    for volume in spec.get("volumes", []):
        if "secret" not in volume:
            continue
        assert volumes_dir is not None, (
            f"volume {volume['name']!r} is a Secret: give job_pod a volumes_dir to write it in"
        )
        # Per pod, as the kubelet writes each pod's own copy.
        directory = volumes_dir / pod["metadata"]["name"] / volume["name"]
        files = _secret_files(volume, secrets, pod["metadata"]["namespace"])
        _write_secret_volume(directory, files)
        volume.pop("secret")
        volume["hostPath"] = {"path": str(directory), "type": "Directory"}
        mounted.add(volume["name"])
    for container in spec["containers"] + spec.get("initContainers", []):
        for mount in container.get("volumeMounts", []):
            if mount["name"] in mounted:
                # A kubelet mounts Secret volumes read-only whatever the mount says.
                mount["readOnly"] = True


def job_pod(
    cronjob: Manifest,
    *,
    job: str,
    pod_name: str,
    secrets: Sequence[Manifest] = (),
    volumes_dir: Path | None = None,
) -> Manifest:
    """The Pod of Job `job`, from the CronJob's own template, ready for `podman kube play`.

    Its Secret volumes are written from `secrets` (Secret objects) into `volumes_dir`.
    """
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
    _mount_secrets(pod, secrets, volumes_dir)
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
