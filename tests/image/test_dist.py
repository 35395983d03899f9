"""The runner's tarball for servers without Python 3.11 (`make dist`, scripts/image.sh dist):
its checksum holds, and unpacked on a Debian 11 root that has no Python at all, it passes the
CLI's contract tests, as a crontab runs it: `cron-runner exec --name ... -- ...`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image.kube import ROOT, Podman
from tests.image.test_inject import APPS, PYTHON_TASK_TESTS

pytestmark = pytest.mark.image

ARTIFACTS = ROOT / os.environ.get("ARTIFACTS", "dist")
# libfaketime, which the time tests preload into the runner (tests/helpers/proc.py run_at).
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime")


@pytest.fixture(scope="module")
def tarball() -> Path:
    found = sorted(ARTIFACTS.glob("cron-runner-*-linux-*.tar.gz"))
    assert len(found) == 1, f"{found}: scripts/image.sh dist makes exactly one"
    return found[0]


def test_the_tarball_matches_its_checksum(tarball: Path) -> None:
    done = subprocess.run(
        ["sha256sum", "--check", "--strict", f"{tarball.name}.sha256"],
        cwd=tarball.parent, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"{tarball.name}: OK"


@pytest.fixture(scope="module")
def server_root(tmp_path_factory: pytest.TempPathFactory, tarball: Path) -> Iterator[Path]:
    """A Debian 11 root without Python, the tarball unpacked in /opt as the docs say, and the
    host's /dev, temporary directories, libfaketime and this repository bound in."""
    podman = Podman(tmp_path_factory.mktemp("dist-podman"))
    root = tmp_path_factory.mktemp("server")
    created = podman("create", "--pull=never", APPS["bullseye"].image).strip()
    try:
        exported = root.parent / "server.tar"
        podman("export", "-o", str(exported), created)
    finally:
        podman("rm", created)
    subprocess.run(["tar", "-C", str(root), "-xf", str(exported)], check=True)
    exported.unlink()
    subprocess.run(["tar", "-C", str(root / "opt"), "-xzf", str(tarball)], check=True)
    mounted = []
    try:
        # The tests' files (scripts/image.sh sets TMPDIR), and the repository, whose
        # tests.sample_tasks one test runs as a Python task (source only: no interpreter).
        temp = Path(tempfile.gettempdir())
        for path in dict.fromkeys([Path("/dev"), Path("/tmp"), temp, FAKETIME, ROOT]):
            (root / path.relative_to("/")).mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(path), str(root / path.relative_to("/"))],
                           check=True)  # fmt: skip
            mounted.append(root / path.relative_to("/"))
        yield root
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "--lazy", str(path)], check=True)


def test_the_server_root_has_no_python(server_root: Path) -> None:
    found = [p for d in ("usr/bin", "usr/local/bin", "bin") for p in (server_root / d).glob("py*")]
    assert found == []
    assert not (server_root / "usr/lib/python3").exists()


@pytest.mark.timeout(600)  # a pytest run of its own, of about 40 tests
def test_the_tarball_passes_the_cli_contract_tests_without_python(
    server_root: Path, tarball: Path, tmp_path: Path
) -> None:
    (installed,) = (server_root / "opt").glob("cron-runner-*/cron-runner")
    # What a crontab line runs, in that root, from the caller's working directory. Every step
    # execs, so the runner keeps the PID the tests signal; the root's /proc is the caller's,
    # in a mount namespace of its own, so that a test in a PID namespace of its own
    # (unshare --mount-proc) sees only its own processes.
    wrapper = tmp_path / "cron-runner"
    target = f"/{installed.relative_to(server_root)}"
    enter = 'mount --bind /proc "$0/proc" && exec unshare --root="$0" --wd="$PWD" "$@"'
    wrapper.write_text(
        f"#!/bin/sh\nexec unshare --mount sh -c '{enter}' {server_root} {target} \"$@\"\n"
    )
    wrapper.chmod(0o755)
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "tests/integration/test_cli_exit_codes.py", "tests/fault/test_cli_signals.py",
            "tests/integration/test_cli_contract.py",
            *(f"--deselect={t}" for t in PYTHON_TASK_TESTS),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "RUNNER_BINARY": str(wrapper)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout and "deselected" in done.stdout
