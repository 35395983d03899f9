"""Shared fixtures: a real redis-server per test, and no silent skips in CI."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from runner.devserver import RedisServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A skipped test proves nothing: in CI, where everything is installed, a skip fails.
    if os.environ.get("CI") == "true" and report.skipped and report.when in ("setup", "call"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (CI=true makes skips fail): {report.longrepr}"
