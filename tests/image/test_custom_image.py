"""A user's image: `FROM cron-runner` + `pip install` of examples/tasks-package."""

from __future__ import annotations

import os

import pytest

from runner.testing import RedisServer
from tests.image.kube import Podman

pytestmark = pytest.mark.image

EXAMPLE_IMAGE = os.environ.get("EXAMPLE_IMAGE", "localhost/cron-runner-example:test")


def test_installed_tasks_register_and_run(podman: Podman, redis_server: RedisServer) -> None:
    listed = podman("run", "--rm", "--pull=never", "--read-only", EXAMPLE_IMAGE, "tasks")
    assert "invoices" in listed

    out = podman(
        "run", "--rm", "--pull=never", "--read-only",
        "--env", f"CRON_RUNNER_REDIS_URL={redis_server.url}",
        "--env", "CRON_RUNNER_LOG_FORMAT=json",
        EXAMPLE_IMAGE, "run", "invoices",
        with_stderr=True,
    )  # fmt: skip
    assert "sending invoice batch 9" in out
    assert '"outcome": "ran"' in out
