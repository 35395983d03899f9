"""Count the commands clients send, with Redis's own MONITOR (script-internal calls excluded)."""

from __future__ import annotations

import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from runner.testing import RedisServer
from tests.helpers.wait import wait_for


def _echo(port: int, text: str) -> None:
    """ECHO over a bare socket: a client library would send its own commands on connect."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"*2\r\n$4\r\nECHO\r\n${len(text)}\r\n{text}\r\n".encode())
        reply = b""
        while not reply.endswith(f"{text}\r\n".encode()):
            chunk = sock.recv(4096)
            assert chunk, f"ECHO got {reply!r}"
            reply += chunk


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
        # MONITOR output is asynchronous, but in the server's order: once a marker sent now has
        # come through, so has every command before it.
        marker = f"monitor-barrier-{uuid.uuid4().hex}"
        _echo(server.port, marker)
        wait_for(lambda: any(marker in line for line in seen), what="MONITOR to catch up")
        return [line for line in seen if " lua]" not in line and "monitor-barrier-" not in line]

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
