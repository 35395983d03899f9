"""runner.inject initContainer in real containers (make test-image): app images without Python,
built from Debian's php-cli and nodejs alone, run their own job under the runner that the
chart's init container copies in. Each pod runs as the image's own non-root user on a
read-only root, as the rendered pod template says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from runner.errors import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_TERMINATED, ConfigError
from runner.keys import TaskKeys
from runner.testing import RedisServer
from tests.image.kube import (
    IMAGE,
    NAMESPACE,
    ROOT,
    Manifest,
    Podman,
    container_of,
    job_name,
    job_pod,
    render_cronjobs,
)

pytestmark = pytest.mark.image

GRACE_S = 10
# The image, its own user and its own entrypoint and cmd, as a Dockerfile would have set them.
APPS = {
    "php": (os.environ.get("PHP_IMAGE", "localhost/app-php:test"), 33, ["php"], ["/app/job.php"]),
    "node": (
        os.environ.get("NODE_IMAGE", "localhost/app-node:test"),
        65534,
        ["node"],
        ["/app/job.js"],
    ),
}


def app_task(app: str, effects: Path, **task: Any) -> dict[str, Any]:
    image, uid, entrypoint, cmd = APPS[app]
    repository, _, tag = image.rpartition(":")
    return {
        "schedule": "*/5 * * * *",
        "runner": {"inject": "initContainer"},
        "image": {"repository": repository, "tag": tag, "entrypoint": entrypoint, "cmd": cmd},
        # The image's own user, and the chart's restricted settings otherwise.
        "podSecurityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "env": {"SIDE_EFFECTS": "/effects/runs.log", "JOB_SLEEP": "2"},
        # The test's window on the side effects; a real task would write to its database.
        "extraVolumes": [{"name": "effects", "hostPath": {"path": str(effects)}}],
        "extraVolumeMounts": [{"name": "effects", "mountPath": "/effects"}],
        **task,
    }


def cronjob_for(redis_server: RedisServer, name: str, task: dict[str, Any]) -> Manifest:
    return render_cronjobs({"redis": {"url": redis_server.url}, "tasks": {name: task}})[name]


def image_id(podman: Podman, image: str) -> str:
    return podman("image", "inspect", "--format", "{{.Id}} {{.Digest}}", image).strip()


@pytest.fixture
def effects(tmp_path: Path) -> Path:
    path = tmp_path / "effects"
    path.mkdir()
    path.chmod(0o777)  # the app's own user writes here
    return path


def keys(task: str) -> TaskKeys:
    return TaskKeys("cron-runner", NAMESPACE, task)


def final(podman: Podman, container: str) -> dict[str, Any]:
    events = [e for e in podman.log_events(container) if e.get("outcome") is not None]
    assert events, podman("logs", container, with_stderr=True)
    return events[-1]


@pytest.mark.parametrize("app", sorted(APPS))
def test_app_images_have_no_python(podman: Podman, app: str) -> None:
    image = APPS[app][0]
    found = podman(
        "run", "--rm", "--pull=never", "--entrypoint", "sh", image, "-c",
        "command -v python3 python || echo none",
    )  # fmt: skip
    assert found.strip() == "none"


@pytest.mark.parametrize("app", sorted(APPS))
def test_three_pods_of_one_slot_run_the_apps_job_once(
    podman: Podman, redis_server: RedisServer, r: redis.Redis, effects: Path, app: str
) -> None:
    image = APPS[app][0]
    before = image_id(podman, image)
    cronjob = cronjob_for(redis_server, f"{app}-report", app_task(app, effects))
    slot_s = int(time.time()) // 300 * 300
    job = job_name(cronjob, slot_s)
    pods = [job_pod(cronjob, job=job, pod_name=f"{job}-{s}") for s in ("x7k2p", "q9m4z", "b3n8w")]

    podman.play_at_once(pods)
    containers = [container_of(p) for p in pods]
    assert podman.wait_exit_codes(containers) == [0, 0, 0]
    played = podman(
        "inspect", "--format", "{{.HostConfig.ReadonlyRootfs}} {{.Config.User}}", *containers
    )
    uid = APPS[app][1]
    assert played.split("\n")[:3] == [f"true {uid}:{uid}"] * 3
    outcomes = sorted(final(podman, c)["outcome"] for c in containers)
    assert outcomes.count("ran") == 1, outcomes
    assert set(outcomes) - {"ran"} <= {"skipped_done", "skipped_held"}, outcomes
    runs = (effects / "runs.log").read_text().splitlines()
    assert len(runs) == 1 and runs[0].startswith(app), runs
    assert not r.exists(keys(f"{app}-report").lease)
    assert r.exists(keys(f"{app}-report").slot(slot_s))
    assert image_id(podman, image) == before, "the app image must not change"


def test_pod_stop_mid_run_exits_143_and_frees_the_lease(
    podman: Podman, redis_server: RedisServer, r: redis.Redis, effects: Path
) -> None:
    task = app_task("php", effects, terminationGracePeriodSeconds=GRACE_S)
    task["env"]["JOB_SLEEP"] = "300"
    cronjob = cronjob_for(redis_server, "php-long", task)
    slot_s = int(time.time()) // 300 * 300
    job = job_name(cronjob, slot_s)
    pod = job_pod(cronjob, job=job, pod_name=f"{job}-t5v6r")
    container = container_of(pod)

    podman.play_at_once([pod])
    podman.wait_for_event(container, "acquired")
    assert r.exists(keys("php-long").lease)
    # The launcher became the bundle (execv): the runner itself is the container's PID 1.
    pid1 = podman("exec", container, "/usr/bin/readlink", "/proc/1/exe").strip()
    assert pid1 == "/cron-runner/bundle/cron-runner"
    podman("pod", "stop", "--time", str(GRACE_S), pod["metadata"]["name"], timeout_s=GRACE_S + 30)

    assert podman.wait_exit_codes([container]) == [EXIT_TERMINATED]
    assert final(podman, container)["outcome"] == "terminated"
    assert not r.exists(keys("php-long").lease)
    assert not r.exists(keys("php-long").slot(slot_s)), "a stopped run leaves its slot free"


@pytest.mark.parametrize(
    "case",
    [(["/app/no-such-job"], EXIT_NOT_FOUND), (["/app/job.php"], EXIT_CANNOT_EXECUTE)],
    ids=["not-found", "not-executable"],
)
def test_a_command_that_cannot_start_leaves_the_slot_free(
    podman: Podman,
    redis_server: RedisServer,
    r: redis.Redis,
    effects: Path,
    case: tuple[list[str], int],
) -> None:
    command, code = case
    cronjob = cronjob_for(redis_server, "php-broken", app_task("php", effects, command=command))
    slot_s = int(time.time()) // 300 * 300
    job = job_name(cronjob, slot_s)
    pod = job_pod(cronjob, job=job, pod_name=f"{job}-c4n7s")
    container = container_of(pod)

    podman.play_at_once([pod])
    assert podman.wait_exit_codes([container]) == [code]
    assert not r.exists(keys("php-broken").lease)
    assert not r.exists(keys("php-broken").slot(slot_s))
    assert not (effects / "runs.log").exists()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The self-contained runner, copied out of the image as the init container copies it."""
    podman = Podman(tmp_path_factory.mktemp("bundle-podman"))
    out = tmp_path_factory.mktemp("bundle") / "cron-runner"
    created = podman("create", "--pull=never", IMAGE).strip()
    try:
        podman("cp", f"{created}:/opt/cron-runner-bin", str(out))
    finally:
        podman("rm", created)
    return out


@pytest.mark.parametrize(
    ("loader", "says"),
    [
        ("ld-musl-x86_64.so.1", "this image uses musl libc (Alpine?)"),
        (None, "this image has no glibc (/lib64/ld-linux-x86-64.so.2 is missing)"),
    ],
    ids=["musl", "no-libc"],
)
def test_an_image_without_glibc_is_refused_with_the_config_code(
    podman: Podman, bundle: Path, tmp_path: Path, loader: str | None, says: str
) -> None:
    # An Alpine-like root (musl's loader and nothing of glibc), or one with no libc at all.
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    if loader:
        (root / "lib" / loader).write_bytes(b"")
    tarball = tmp_path / "root.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tarball), "."], check=True)
    podman("import", "--quiet", str(tarball), "localhost/no-glibc:test")
    done = subprocess.run(
        [str(podman.binary), "run", "--rm", "--pull=never", "--read-only",
         "-v", f"{bundle}:/cron-runner:ro", "localhost/no-glibc:test",
         "/cron-runner/cron-runner", "exec", "--name", "x", "--", "true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    podman("rmi", "localhost/no-glibc:test")
    assert done.returncode == ConfigError.exit_code, done.stderr
    assert says in done.stderr
    assert "glibc 2.36 or later" in done.stderr


def test_import_runs_from_the_runner_image(podman: Podman) -> None:
    manifest = (ROOT / "examples" / "adopt" / "laravel-invoices.yaml").read_text()
    done = subprocess.run(
        [str(podman.binary), "run", "--rm", "-i", "--pull=never", "--read-only", IMAGE,
         "import", "-"],
        input=manifest, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "cronJobName: shop-invoices" in done.stdout
    assert "inject: initContainer" in done.stdout


# The CLI tests whose subject is a command (exec), not a registered Python task: the bundle
# carries the runner, not the user's Python packages (tests.sample_tasks), so those stay with
# the runner image.
PYTHON_TASK_TESTS = [
    "tests/integration/test_cli_exit_codes.py::test_ran_exit_0",
    "tests/integration/test_cli_exit_codes.py::test_skipped_when_held_exit_0",
    "tests/integration/test_cli_exit_codes.py::test_skipped_when_slot_done_exit_0",
    "tests/integration/test_cli_exit_codes.py::test_task_raised_exit_1_and_slot_stays_open",
    "tests/integration/test_cli_exit_codes.py::test_sigterm_exit_143_and_lease_released",
    "tests/integration/test_cli_exit_codes.py::test_a_schedule_the_runner_cannot_read_does_not_fail_a_run_that_ran",
    "tests/fault/test_cli_signals.py::test_python_task_ignoring_cancel_exits_143_without_release",
    "tests/fault/test_cli_signals.py::test_a_python_task_keeps_its_subprocess_codes_under_a_pid_1_runner",
    "tests/integration/test_cli_contract.py::test_tasks_lists_names_and_origins",
    # The unknown-task refusal lists the registered Python tasks.
    "tests/integration/test_cli_exit_codes.py::test_config_and_usage_errors_exit_78_or_64"
    "[args2-extra_env2-known tasks: boom, child-codes, ok, slow, stubborn]",
]


def test_the_bundle_passes_the_cli_contract_tests(bundle: Path) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "tests/integration/test_cli_exit_codes.py", "tests/fault/test_cli_signals.py",
            "tests/integration/test_cli_contract.py",
            *(f"--deselect={t}" for t in PYTHON_TASK_TESTS),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "RUNNER_BINARY": str(bundle / "cron-runner")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout and "deselected" in done.stdout
