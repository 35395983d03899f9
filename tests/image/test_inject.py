"""runner.inject initContainer in real containers (make test-image): app images without Python
run their own job under the runner that the chart's init container copies in. Each pod runs as
the image's own non-root user on a read-only root, as the rendered pod template says.

The images cover every libc the runner must run on (docs/adoption.md): Debian 12's glibc (php-cli
and nodejs), musl with no glibc at all, nothing but one static binary (scratch), and Debian 11's
glibc 2.31. The last three run as the distroless uid 65532, which has no /etc/passwd entry.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis

from runner.errors import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_TERMINATED, ConfigError
from runner.keys import TaskKeys
from runner.testing import RedisServer
from tests.helpers.topologies import TlsRedisServer, make_tls_files
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
    secret,
)

pytestmark = pytest.mark.image

GRACE_S = 10
DISTROLESS_UID = 65532


class App(NamedTuple):
    """An app image, with its own user, entrypoint and cmd as a Dockerfile would set them."""

    image: str
    uid: int
    entrypoint: list[str]
    cmd: list[str]
    shell: list[str]  # how to run `sh -c` in it, for the checks of what it holds


APPS = {
    "php": App(os.environ.get("PHP_IMAGE", "localhost/app-php:test"), 33, ["php"],
               ["/app/job.php"], ["sh"]),
    "node": App(os.environ.get("NODE_IMAGE", "localhost/app-node:test"), 65534, ["node"],
                ["/app/job.js"], ["sh"]),
    "musl": App(os.environ.get("MUSL_IMAGE", "localhost/app-musl:test"), DISTROLESS_UID,
                ["/bin/busybox", "sh"], ["/app/job.sh"], ["/bin/busybox", "sh"]),
    "static": App(os.environ.get("STATIC_IMAGE", "localhost/app-static:test"), DISTROLESS_UID,
                  ["/app/busybox", "sh"], ["/app/job.sh"], ["/app/busybox", "sh"]),
    "bullseye": App(os.environ.get("BULLSEYE_IMAGE", "localhost/app-bullseye:test"),
                    DISTROLESS_UID, ["/bin/sh"], ["/app/job.sh"], ["/bin/sh"]),
}  # fmt: skip
# The jobs in tests/image/apps/job.sh, which report the environment they were given.
SHELL_JOBS = {"musl", "static", "bullseye"}
# What each image must hold, or lack, to stand for its family.
FAMILY_CHECKS = {
    "musl": ("test -e /lib/ld-musl-x86_64.so.1 && ! test -e /lib64 && echo musl", "musl"),
    "static": ("for p in /bin /lib /lib64 /usr /etc/passwd; do test -e $p && echo $p; done;"
               " echo nothing-else", "nothing-else"),
    "bullseye": ("getconf GNU_LIBC_VERSION", "glibc 2.31"),
}  # fmt: skip


def app_task(app: str, effects: Path, **task: Any) -> dict[str, Any]:
    image, uid, entrypoint, cmd, _ = APPS[app]
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
        # A time zone, which the image of one static binary has no database for.
        **({"timeZone": "Europe/Berlin"} if app == "static" else {}),
        "env": {"SIDE_EFFECTS": "/effects/runs.log", "JOB_SLEEP": "2", "JOB_APP": app},
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


def in_image(podman: Podman, app: str, script: str) -> str:
    shell = APPS[app].shell
    # --passwd=false: podman would otherwise add the user to /etc/passwd, which a kubelet does not.
    return podman(
        "run", "--rm", "--pull=never", "--passwd=false", "--entrypoint", shell[0],
        APPS[app].image, *shell[1:], "-c", script,
    ).strip()  # fmt: skip


@pytest.mark.parametrize("app", sorted(APPS))
def test_app_images_have_no_python(podman: Podman, app: str) -> None:
    assert in_image(podman, app, "command -v python3 python || echo none") == "none"


@pytest.mark.parametrize("app", sorted(FAMILY_CHECKS))
def test_each_image_stands_for_its_libc_family(podman: Podman, app: str) -> None:
    script, says = FAMILY_CHECKS[app]
    assert in_image(podman, app, script) == says


@pytest.mark.parametrize("app", sorted(APPS))
def test_three_pods_of_one_slot_run_the_apps_job_once(
    podman: Podman, redis_server: RedisServer, r: redis.Redis, effects: Path, app: str
) -> None:
    image = APPS[app].image
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
    uid = APPS[app].uid
    assert played.split("\n")[:3] == [f"true {uid}:{uid}"] * 3
    outcomes = sorted(final(podman, c)["outcome"] for c in containers)
    assert outcomes.count("ran") == 1, outcomes
    assert set(outcomes) - {"ran"} <= {"skipped_done", "skipped_held"}, outcomes
    runs = (effects / "runs.log").read_text().splitlines()
    assert len(runs) == 1 and runs[0].startswith(app), runs
    if app in SHELL_JOBS:
        # The job got the app image's environment: not the bundle's own library path (its
        # C library, under the image's loader) nor PyInstaller's variables.
        assert runs[0].endswith(" ld=unset pyi=unset"), runs
    assert not r.exists(keys(f"{app}-report").lease)
    assert r.exists(keys(f"{app}-report").slot(slot_s))
    assert image_id(podman, image) == before, "the app image must not change"


PASSWORD = "app-redis-s3cret"
PASSWORD_SECRET = "app-redis"


@pytest.fixture
def locked_redis() -> Iterator[RedisServer]:
    with RedisServer(extra_args=["--requirepass", PASSWORD]) as server:
        yield server


def password_pods(
    locked_redis: RedisServer, effects: Path, volumes: Path, name: str, mode: int | None = None
) -> tuple[list[Manifest], int]:
    """Three pods of one slot of a distroless task (uid 65532, no fsGroup) that reads the Redis
    password from the release's existing Secret; `mode` replaces the rendered defaultMode."""
    task = app_task("static", effects)
    assert APPS["static"].uid == DISTROLESS_UID and "fsGroup" not in task["podSecurityContext"]
    auth = {"existingSecret": PASSWORD_SECRET, "passwordKey": "redis-password"}
    cronjob = render_cronjobs(
        {"redis": {"url": locked_redis.url, "auth": auth}, "tasks": {name: task}}
    )[name]
    if mode is not None:
        spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "redis-password"]
        volume["secret"]["defaultMode"] = mode
    # The Secret holds more than the password, as a shared one does: the volume takes its key.
    secrets = [secret(PASSWORD_SECRET, {"redis-password": PASSWORD, "redis-url": locked_redis.url})]
    slot_s = int(time.time()) // 300 * 300
    job = job_name(cronjob, slot_s)
    pods = [
        job_pod(cronjob, job=job, pod_name=f"{job}-{s}", secrets=secrets, volumes_dir=volumes)
        for s in ("p2w8d", "h6r3k", "m5t9j")
    ]
    return pods, slot_s


def password_file(volumes: Path, pod: Manifest) -> os.stat_result:
    """What the pod's container sees at /etc/cron-runner/redis-password/password."""
    name: str = pod["metadata"]["name"]
    return (volumes / name / "redis-password" / "password").stat()


def test_the_injected_runner_as_uid_65532_without_fs_group_reads_the_redis_password(
    podman: Podman, locked_redis: RedisServer, effects: Path, tmp_path: Path
) -> None:
    # The distroless pattern: the app's uid is neither the owner of the kubelet's root-owned
    # files nor in their group, and no fsGroup changes that; only the chart's mode can.
    volumes = tmp_path / "volumes"
    pods, slot_s = password_pods(locked_redis, effects, volumes, "static-locked")
    containers = [container_of(p) for p in pods]

    podman.play_at_once(pods)
    assert podman.wait_exit_codes(containers) == [0, 0, 0], [
        podman("logs", c, with_stderr=True) for c in containers
    ]
    played = podman("inspect", "--format", "{{.Config.User}}", *containers)
    assert played.split() == [f"{DISTROLESS_UID}:{DISTROLESS_UID}"] * 3
    assert all("fsGroup" not in p["spec"]["securityContext"] for p in pods)
    for pod in pods:
        mounted = password_file(volumes, pod)
        assert (mounted.st_uid, mounted.st_gid) == (0, 0)
        assert stat.S_IMODE(mounted.st_mode) & 0o004, "readable by a uid of no group: others"
    outcomes = sorted(final(podman, c)["outcome"] for c in containers)
    assert outcomes.count("ran") == 1, outcomes
    assert set(outcomes) - {"ran"} <= {"skipped_done", "skipped_held"}, outcomes
    runs = (effects / "runs.log").read_text().splitlines()
    assert len(runs) == 1 and runs[0].startswith("static"), runs
    with pytest.raises(redis.AuthenticationError):
        locked_redis.client().ping()  # the Redis does ask for the password
    client = locked_redis.client(password=PASSWORD)
    assert client.exists(keys("static-locked").slot(slot_s))
    assert not client.exists(keys("static-locked").lease)


def test_a_password_file_the_apps_uid_cannot_read_fails_every_run_with_78(
    podman: Podman, locked_redis: RedisServer, effects: Path, tmp_path: Path
) -> None:
    # The control: 0440 on root-owned files, which the chart mounted before, shuts uid 65532
    # out. A clear refusal (78, which the Job does not retry), nothing run, the slot free.
    volumes = tmp_path / "volumes"
    pods, slot_s = password_pods(locked_redis, effects, volumes, "static-shut", mode=0o440)
    containers = [container_of(p) for p in pods]

    podman.play_at_once(pods)
    assert podman.wait_exit_codes(containers) == [ConfigError.exit_code] * 3
    for pod, container in zip(pods, containers, strict=True):
        assert stat.S_IMODE(password_file(volumes, pod).st_mode) == 0o440
        says = podman("logs", container, with_stderr=True)
        assert "CRON_RUNNER_REDIS_PASSWORD_FILE" in says and "PermissionError" in says, says
    assert not (effects / "runs.log").exists()
    client = locked_redis.client(password=PASSWORD)
    assert not client.exists(keys("static-shut").slot(slot_s))
    assert not client.exists(keys("static-shut").lease)


def pid_1_of(podman: Podman, container: str) -> tuple[str, list[str], str]:
    """The container's first process, seen from the host: its program, its argv, and its PID
    in the container's own PID namespace (the last NSpid)."""
    pid = podman("inspect", "--format", "{{.State.Pid}}", container).strip()
    proc = Path("/proc") / pid
    status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines())
    argv = (proc / "cmdline").read_bytes().decode().split("\0")
    return os.readlink(proc / "exe"), argv, status["NSpid"].split()[-1]


@pytest.mark.parametrize("app", sorted(APPS))
def test_pod_stop_mid_run_exits_143_and_frees_the_lease(
    podman: Podman, redis_server: RedisServer, r: redis.Redis, effects: Path, app: str
) -> None:
    task = app_task(app, effects, terminationGracePeriodSeconds=GRACE_S)
    task["env"]["JOB_SLEEP"] = "300"
    cronjob = cronjob_for(redis_server, f"{app}-long", task)
    slot_s = int(time.time()) // 300 * 300
    job = job_name(cronjob, slot_s)
    pod = job_pod(cronjob, job=job, pod_name=f"{job}-t5v6r")
    container = container_of(pod)

    podman.play_at_once([pod])
    podman.wait_for_event(container, "acquired")
    assert r.exists(keys(f"{app}-long").lease)
    # The launcher became the bundle's own loader running the bundle (execv, never a fork):
    # the runner itself is the container's PID 1, whatever the image's libc.
    exe, argv, pid = pid_1_of(podman, container)
    assert pid == "1"
    assert exe == "/cron-runner/bundle/_internal/ld-linux-x86-64.so.2"
    assert "/cron-runner/bundle/cron-runner" in argv, argv
    podman("pod", "stop", "--time", str(GRACE_S), pod["metadata"]["name"], timeout_s=GRACE_S + 30)

    assert podman.wait_exit_codes([container]) == [EXIT_TERMINATED]
    assert final(podman, container)["outcome"] == "terminated"
    assert not r.exists(keys(f"{app}-long").lease)
    assert not r.exists(keys(f"{app}-long").slot(slot_s)), "a stopped run leaves its slot free"


CANNOT_START = [(app, kind) for app in sorted(APPS) for kind in ("not-found", "not-executable")]


@pytest.mark.parametrize("case", CANNOT_START, ids=[f"{a}-{k}" for a, k in CANNOT_START])
def test_a_command_that_cannot_start_leaves_the_slot_free(
    podman: Podman, redis_server: RedisServer, r: redis.Redis, effects: Path, case: tuple[str, str]
) -> None:
    app, kind = case
    # The job's script itself, which is not executable: 126; a path that is not there: 127.
    command, code = (
        (["/app/no-such-job"], EXIT_NOT_FOUND)
        if kind == "not-found"
        else (APPS[app].cmd[:1], EXIT_CANNOT_EXECUTE)
    )
    cronjob = cronjob_for(redis_server, f"{app}-broken", app_task(app, effects, command=command))
    slot_s = int(time.time()) // 300 * 300
    job = job_name(cronjob, slot_s)
    pod = job_pod(cronjob, job=job, pod_name=f"{job}-c4n7s")
    container = container_of(pod)

    podman.play_at_once([pod])
    assert podman.wait_exit_codes([container]) == [code]
    assert not r.exists(keys(f"{app}-broken").lease)
    assert not r.exists(keys(f"{app}-broken").slot(slot_s))
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


def test_the_runner_needs_nothing_from_an_image_of_one_static_binary(
    podman: Podman, redis_server: RedisServer, bundle: Path
) -> None:
    # As a kubelet runs it: no /etc/passwd entry for the uid (podman adds one unless told not
    # to), no time zone database, no CA store, no shell, a read-only root. The command checks
    # what it was given, and fails the run if anything is there.
    app = APPS["static"]
    check = "test ! -e /etc/passwd && test ! -e /usr/share/zoneinfo && test ! -e /etc/ssl"
    done = subprocess.run(
        [str(podman.binary), "run", "--rm", "--pull=never", "--read-only", "--passwd=false",
         "--user", f"{DISTROLESS_UID}:{DISTROLESS_UID}", "-v", f"{bundle}:/cron-runner:ro",
         "-e", f"CRON_RUNNER_REDIS_URL={redis_server.url}",
         "-e", "CRON_RUNNER_TIMEZONE=Europe/Berlin",
         "--entrypoint", "/cron-runner/cron-runner", app.image,
         "exec", "--name", "scratch-check", "--", app.entrypoint[0], "sh", "-c", check],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"outcome":"ran"' in done.stderr.replace(" ", "") + done.stdout.replace(" ", "")


@pytest.mark.parametrize(
    "case",
    [
        ("/etc/pki/tls/certs/ca-bundle.crt", 0, '"outcome": "ran"'),  # where UBI keeps them
        ("/etc/ssl/cert.pem", 0, '"outcome": "ran"'),  # where Alpine keeps them
        # None there: the runner's own (Mozilla's) CAs, which do not know the test's CA: a
        # clear refusal, not a crash for want of a CA store.
        (None, ConfigError.exit_code, "CRON_RUNNER_REDIS_TLS_CA_FILE"),
    ],
    ids=["ubi-path", "alpine-path", "none"],
)
def test_tls_without_a_ca_file_trusts_the_images_own_cas(
    podman: Podman, bundle: Path, tmp_path: Path, case: tuple[str | None, int, str]
) -> None:
    ca_path, code, says = case
    # rediss:// with no CRON_RUNNER_REDIS_TLS_CA_FILE, in the image of one static binary: the
    # bundle's OpenSSL looks where Debian keeps CAs, so the runner finds the image's own.
    tls = make_tls_files(tmp_path)
    mount = ["-v", f"{tls.ca_cert}:{ca_path}:ro"] if ca_path else []
    with TlsRedisServer(tls, require_client_cert=False) as server:
        done = subprocess.run(
            [str(podman.binary), "run", "--rm", "--pull=never", "--read-only",
             "--user", f"{DISTROLESS_UID}:{DISTROLESS_UID}", "-v", f"{bundle}:/cron-runner:ro",
             *mount, "-e", f"CRON_RUNNER_REDIS_URL={server.url}",
             "--entrypoint", "/cron-runner/cron-runner", APPS["static"].image,
             "exec", "--name", "tls-check", "--", "/app/busybox", "true"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == code, done.stderr
    assert says in done.stderr


def test_the_command_gets_the_environment_the_runner_was_given(
    redis_server: RedisServer, bundle: Path, tmp_path: Path
) -> None:
    # The bundle's loader and PyInstaller set variables for the runner itself; the command
    # must not inherit them (with the bundle's C library on its library path, an app's
    # program would load it through the image's own loader). The caller's own stay.
    out = tmp_path / "env"
    done = subprocess.run(
        [str(bundle / "cron-runner"), "exec", "--name", "env-check", "--",
         "sh", "-c", f"env > {out}"],
        env={"PATH": os.environ["PATH"], "CRON_RUNNER_REDIS_URL": redis_server.url,
             "LD_LIBRARY_PATH": "/opt/app/lib", "APP_SETTING": "kept"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert env["LD_LIBRARY_PATH"] == "/opt/app/lib"
    assert env["APP_SETTING"] == "kept"
    assert [k for k in env if k.startswith(("_PYI", "LD_LIBRARY_PATH_ORIG"))] == []


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
