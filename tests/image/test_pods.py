"""The image runs the chart's own pod spec in real containers (make test-image).

Three pods of one CronJob slot, as three clusters or a duplicate Job would start them: one
runs the task, the others skip and exit 0. A pod stopped mid-run stops its task, exits 143
and leaves no lease behind.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import pytest
import redis

from runner.keys import TaskKeys
from runner.testing import RedisServer
from tests.image.kube import (
    FIGURES,
    IMAGE,
    NAMESPACE,
    Manifest,
    Podman,
    container_of,
    job_name,
    job_pod,
    render_cronjobs,
)

pytestmark = pytest.mark.image

GRACE_S = 10
TASKS = {
    "report": {"schedule": "*/5 * * * *", "command": ["sh", "-c", "echo report body ran; sleep 2"]},
    "invoice": {
        "schedule": "0 * * * *",
        "command": ["sleep", "300"],
        "terminationGracePeriodSeconds": GRACE_S,
    },
    "digest": {"schedule": "0 2 * * *", "task": "digest"},
}


def cronjobs(redis_server: RedisServer) -> dict[str, Manifest]:
    rendered = render_cronjobs({"redis": {"url": redis_server.url}, "tasks": TASKS})
    assert sorted(rendered) == sorted(TASKS)
    return rendered


def keys(task: str) -> TaskKeys:
    return TaskKeys("cron-runner", NAMESPACE, task)


def last_outcome(events: list[dict[str, Any]]) -> dict[str, Any]:
    finals = [e for e in events if e.get("outcome") is not None]
    assert finals, f"no outcome logged: {events}"
    return finals[-1]


def test_three_pods_of_one_slot_run_the_task_once(
    podman: Podman, redis_server: RedisServer, r: redis.Redis
) -> None:
    cronjob = cronjobs(redis_server)["report"]
    slot_s = int(time.time()) // 300 * 300
    job = job_name(cronjob, slot_s)
    pods = [
        job_pod(cronjob, job=job, pod_name=f"{job}-{suffix}")
        for suffix in ("x7k2p", "q9m4z", "b3n8w")
    ]

    podman.play_at_once(pods)
    containers = [container_of(p) for p in pods]
    assert podman.wait_exit_codes(containers) == [0, 0, 0]
    # The chart's security context reached the containers: what the runner did, it did
    # as uid 10001 on a read-only root filesystem.
    played = podman(
        "inspect", "--format", "{{.HostConfig.ReadonlyRootfs}} {{.Config.User}}", *containers
    )
    assert played.split("\n")[:3] == ["true 10001:10001"] * 3

    finals = {}
    bodies_ran = 0
    for pod, container in zip(pods, containers, strict=True):
        events = podman.log_events(container)
        final = last_outcome(events)
        assert final["task"] == "report"
        assert final["slot"] == slot_s
        assert final["holder"] == pod["metadata"]["name"]
        finals[final["holder"]] = final["outcome"]
        bodies_ran += podman("logs", container).count("report body ran")

    outcomes = sorted(finals.values())
    assert outcomes.count("ran") == 1, finals
    assert set(outcomes) - {"ran"} <= {"skipped_done", "skipped_held"}, finals
    assert bodies_ran == 1
    winner = next(holder for holder, outcome in finals.items() if outcome == "ran")
    assert winner in str(r.hget(keys("report").slot(slot_s), "holder"))
    assert not r.exists(keys("report").lease)


def test_sigterm_stops_the_task_exits_143_and_frees_the_lease(
    podman: Podman, redis_server: RedisServer, r: redis.Redis
) -> None:
    cronjob = cronjobs(redis_server)["invoice"]
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == GRACE_S
    slot_s = int(time.time()) // 3600 * 3600
    job = job_name(cronjob, slot_s)
    pod = job_pod(cronjob, job=job, pod_name=f"{job}-t5v6r")
    container = container_of(pod)

    podman.play_at_once([pod])
    podman.wait_for_event(container, "acquired")
    assert r.exists(keys("invoice").lease)

    # `kube down` in podman 4.3 kills at once; `pod stop -t` is the kubelet's SIGTERM + grace.
    podman("pod", "stop", "--time", str(GRACE_S), pod["metadata"]["name"], timeout_s=GRACE_S + 30)

    assert podman.wait_exit_codes([container]) == [143]
    events = podman.log_events(container)
    final = last_outcome(events)
    assert (final["event"], final["outcome"], final["exit_code"]) == (
        "terminated",
        "terminated",
        143,
    ), events
    assert not r.exists(keys("invoice").lease)
    assert not r.exists(keys("invoice").slot(slot_s)), "a terminated run must leave its slot free"


# Runs inside the container: the cost of a cold start, as a CronJob pod pays it every time.
STARTUP_PROBE = """
import json, os, subprocess, time
def timed(argv):
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000
print(json.dumps({
    "version_ms": [timed(["cron-runner", "--version"]) for _ in range(5)],
    "exec_ms": [timed(["cron-runner", "exec", "--name", "startup-probe", "--", "true"])
                for _ in range(5)],
}))
"""


def test_start_up_inside_the_container(podman: Podman, redis_server: RedisServer) -> None:
    out = podman(
        "run", "--rm", "--pull=never", "--read-only", "--user", "10001:10001",
        "--env", f"CRON_RUNNER_REDIS_URL={redis_server.url}",
        "--env", "CRON_RUNNER_LOG_FORMAT=json",
        "--entrypoint", "python3", IMAGE, "-c", STARTUP_PROBE,
    )  # fmt: skip
    timings = json.loads(out.strip().splitlines()[-1])
    FIGURES.append(
        "start-up inside the container, median of 5 "
        f"(process start to exit): `cron-runner --version` "
        f"{statistics.median(timings['version_ms']):.0f} ms; "
        f"`cron-runner exec --name x -- true` against Redis "
        f"{statistics.median(timings['exec_ms']):.0f} ms"
    )
    assert len(timings["exec_ms"]) == 5
