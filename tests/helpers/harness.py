"""An in-process harness for ``Execution``: the real ``Lease`` on the real Redis of the
``redis_server`` fixture, wall time through the clock seam (runner/clock.py), and a task that is
a Python function, so that a run's decisions are tested without a subprocess per case.

Signals, PID 1 and the CLI's exit codes stay with the subprocess tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NoReturn, cast

import pytest
import redis

from runner import clock
from runner.config.settings import Settings, load_settings
from runner.keys import TaskKeys
from runner.lease import store
from runner.run.execution import Execution, RunResult
from runner.run.targets import PythonTarget
from runner.signals import Shutdown
from runner.tasks import TaskFn
from runner.testing import RedisServer
from tests.helpers.lease_tools import stream_entries

TASK = "job"


class Abandoned(BaseException):
    """Raised where a run would leave the process (os._exit): a task ignored its cancellation."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _abandon(code: int) -> NoReturn:
    raise Abandoned(code)


class Wall:
    """Wall time that starts where a test says and runs on with the monotonic clock."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.mono_at_start = time.monotonic()

    def __call__(self) -> float:
        return self.start_s + (time.monotonic() - self.mono_at_start)


@dataclass
class Harness:
    server: RedisServer
    monkeypatch: pytest.MonkeyPatch
    task: str = TASK
    _clients: list[redis.Redis] = field(default_factory=list)

    @property
    def keys(self) -> TaskKeys:
        return TaskKeys("cron-runner", "default", self.task)

    def settings(self, **env: str) -> Settings:
        """Settings as a run loads them; ``env`` is CRON_RUNNER_* without the prefix."""
        variables = {"CRON_RUNNER_REDIS_URL": self.server.url, "CRON_RUNNER_LEASE_TTL": "3s"}
        variables.update({f"CRON_RUNNER_{k}": v for k, v in env.items()})
        return load_settings(variables)

    def wall_at(self, start_s: float) -> None:
        """From now on, the runner's wall clock reads ``start_s`` and runs on from there."""
        self.monkeypatch.setattr(clock, "wall", Wall(start_s))

    def execution(
        self, task: TaskFn, settings: Settings, *, shutdown: Shutdown | None = None
    ) -> Execution:
        """A run of the Python function ``task``, connected as the CLI connects."""
        client = store.connect(settings.redis, settings.lease.ttl_s)
        self._clients.append(client)
        return Execution(
            settings, client, self.task, PythonTarget(task), shutdown or Shutdown(),
            what="run test", exit_process=_abandon,
        )  # fmt: skip

    def run(
        self, task: TaskFn, settings: Settings, *, shutdown: Shutdown | None = None
    ) -> RunResult:
        return self.execution(task, settings, shutdown=shutdown).run()

    # -- what Redis holds -------------------------------------------------------------------

    def redis(self) -> redis.Redis:
        client = self.server.client()
        self._clients.append(client)
        return client

    def records(self) -> list[dict[str, str]]:
        return stream_entries(self.redis(), self.keys.runs)

    def state(self) -> dict[str, str]:
        return cast(dict[str, str], self.redis().hgetall(self.keys.state))

    def marker(self, slot: int) -> dict[str, str]:
        return cast(dict[str, str], self.redis().hgetall(self.keys.slot(slot)))

    def lease_token(self) -> str | None:
        return cast(str | None, self.redis().get(self.keys.lease))

    def close(self) -> None:
        for client in self._clients:
            client.close()


@contextmanager
def harness(server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    h = Harness(server, monkeypatch)
    try:
        yield h
    finally:
        h.close()
