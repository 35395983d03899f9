"""The built image (scripts/image.sh): no pip at run time, and its SBOM lists what it runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.image.kube import IMAGE, Podman

pytestmark = pytest.mark.image
ROOT = Path(__file__).resolve().parents[2]


def test_no_pip_in_the_image(podman: Podman) -> None:
    listing = podman("run", "--rm", "--entrypoint", "ls", IMAGE, "/opt/cron-runner/bin")
    assert "cron-runner" in listing.split()
    assert not [name for name in listing.split() if name.startswith("pip")], listing
    probe = podman("run", "--rm", "--entrypoint", "python", IMAGE, "-c",
                   "import importlib.util as u; print(u.find_spec('pip'), "
                   "u.find_spec('setuptools'))")  # fmt: skip
    assert probe.split() == ["None", "None"]


def test_the_sbom_lists_every_python_package_of_the_image(podman: Podman) -> None:
    sbom = json.loads(podman("run", "--rm", "--entrypoint", "cat", IMAGE,
                             "/opt/cron-runner/share/sbom.cdx.json"))  # fmt: skip
    assert sbom["bomFormat"] == "CycloneDX"
    listed = {c["name"].lower().replace("_", "-"): c["version"] for c in sbom["components"]}
    frozen = podman("run", "--rm", "--entrypoint", "python", IMAGE, "-c",
                    "import importlib.metadata as m; print('\\n'.join(f'{d.name}=={d.version}' "
                    "for d in m.distributions()))")  # fmt: skip
    for line in frozen.split():
        name, version = line.split("==")
        name = name.lower().replace("_", "-")
        if name in ("cron-runner", "redis-cron-runner"):
            continue  # the SBOM's root component
        assert listed.get(name) == version, (name, version)
    assert (ROOT / "dist" / "cron-runner-image.cdx.json").is_file()
