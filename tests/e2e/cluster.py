"""The cluster of `make k8s-up`: its kubectl and helm, run against .k8s/kubeconfig."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("CRON_RUNNER_K8S_STATE", REPO / ".k8s"))
KUBECONFIG = STATE / "kubeconfig"


class Cluster:
    """kubectl and helm, the real binaries, pointed at the running cluster."""

    def __init__(self, state: Path = STATE) -> None:
        self.kubeconfig = state / "kubeconfig"
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        self.bin = state / "bin"

    def run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        # From the repository's root, as the README's commands are typed (charts/cron-runner).
        proc = subprocess.run(
            [str(self.bin / tool), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{tool} {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def kubectl(self, *args: str, check: bool = True) -> str:
        return self.run("kubectl", *args, check=check).stdout

    def helm(self, *args: str) -> str:
        return self.run("helm", *args).stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def wait_for(self, what: str, seconds: float, *args: str) -> Any:
        """`kubectl get -o json ARGS` once it names at least one object."""
        deadline = time.monotonic() + seconds
        while True:
            found = self.get(*args)
            if found.get("items", [found]):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {what} after {seconds:.0f} s: kubectl get {' '.join(args)}"
                )
            time.sleep(1)

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace and wait until it is gone, so the next test starts clean."""
        self.kubectl(
            "delete", "namespace", name, "--ignore-not-found", "--wait=true", "--timeout=90s"
        )
        # The bundled Redis's claim went with it: offer its volume again.
        subprocess.run([str(REPO / "scripts/k8s-node.sh"), "volumes"], env=self.env, check=True)
