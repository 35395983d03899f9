"""Shared fixtures: a real redis-server per test, and no silent skips in CI."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from hypothesis import settings

from runner.testing import RedisServer

# CI explores the same examples every run (a fixed seed): a property test that finds a new
# failing input on a developer's machine reports it there, with the example, instead of
# failing a submission at random. Developers' runs stay random.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")


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
