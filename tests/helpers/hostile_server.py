"""A TCP server at a Redis URL that answers what a real Redis never would.

It stands in only for servers that are not Redis, or that break its protocol: every command
gets the same canned bytes (``SHAPES``), or the connection is closed at once, or an HTTP
answer comes back. Everything a real Redis does is tested on a real redis-server.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# What the server answers to each command, by name. 'close' closes the connection at accept;
# 'http' answers as a web server does to anything it cannot read, and closes.
SHAPES: dict[str, bytes] = {
    "int_1": b":1\r\n",
    "int_minus_1": b":-1\r\n",
    "ok": b"+OK\r\n",
    "null_array": b"*-1\r\n",
    "string_array": b"*3\r\n$2\r\nno\r\n$1\r\nx\r\n$0\r\n\r\n",
    "int_array": b"*3\r\n:1\r\n:2\r\n:3\r\n",
    "nested_arrays": b"*2\r\n*1\r\n:1\r\n*2\r\n$2\r\nok\r\n*0\r\n",
    "resp3_map": b"%1\r\n+ok\r\n:1\r\n",
    "null_bulk": b"$-1\r\n",
    "error": b"-ERR no such thing\r\n",
    "garbage": b"\x00\xfe\xffgarbage\r\n",
    "close": b"",
    "http": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
}


def _commands(rfile: socketserver.StreamRequestHandler) -> Iterator[None]:
    """One item per command read (RESP arrays of bulk strings, or inline commands)."""
    read = rfile.rfile
    while True:
        line = read.readline()
        if not line:
            return
        if line.startswith(b"*"):
            try:
                count = int(line[1:])
            except ValueError:
                return
            for _ in range(max(count, 0)):
                header = read.readline()
                if not header.startswith(b"$"):
                    return
                read.read(int(header[1:]) + 2)
        yield None


class _Handler(socketserver.StreamRequestHandler):
    shape = "ok"

    def handle(self) -> None:
        if self.shape == "close":
            return
        answer = SHAPES[self.shape]
        for _ in _commands(self):
            try:
                self.wfile.write(answer)
                self.wfile.flush()
            except OSError:
                return
            if self.shape == "http":
                return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def hostile_server(shape: str) -> Iterator[str]:
    """A server answering every command with SHAPES[shape]; yields its redis:// URL."""
    handler = type(f"Handler_{shape}", (_Handler,), {"shape": shape})
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    finally:
        server.shutdown()
        server.server_close()
