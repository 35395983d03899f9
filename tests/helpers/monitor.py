"""Count the commands clients send, with Redis's own MONITOR (script-internal calls excluded)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from runner.devserver import RedisServer


@contextmanager
def client_commands(server: RedisServer) -> Iterator[Callable[[], list[str]]]:
    """Yields a function returning the client commands seen so far (as MONITOR lines)."""
    proc = subprocess.Popen(
        ["redis-cli", "-p", str(server.port), "monitor"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "OK"
    seen: list[str] = []

    def commands() -> list[str]:
        time.sleep(0.2)  # MONITOR output is asynchronous
        return [line for line in seen if " lua]" not in line]

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line.rstrip("\n"))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield commands
    finally:
        proc.terminate()
        proc.wait()
        thread.join(timeout=2)
        proc.stdout.close()
