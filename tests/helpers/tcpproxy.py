"""A TCP proxy for partition tests: forwards, delays, drops or black-holes Redis traffic.

It runs its own asyncio loop in a daemon thread of the test process, so the runners under
test (real subprocesses) connect to ``127.0.0.1:proxy.port`` as they would to Redis.

Modes, switched at any time from the test:
- ``heal()``: forward both ways (after ``set_latency``, each chunk ``latency_s`` later, in order);
- ``blackhole()``: accept connections but never forward a byte, either way: a partition
  behind a middlebox, where the client's writes succeed and no answer ever comes;
- ``refuse()``: new connections are closed as soon as they are accepted;
- ``drop()``: close every open connection now (combine with ``refuse()`` for an outage).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from runner.testing import Service

FORWARD = "forward"
BLACKHOLE = "blackhole"
REFUSE = "refuse"


class TcpProxy(Service):
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.mode = FORWARD
        self.latency_s = 0.0
        self.port = 0
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    # -- control, from the test's thread ------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    def set_latency(self, latency_s: float) -> None:
        self.latency_s = latency_s

    def heal(self) -> None:
        self.mode = FORWARD

    def blackhole(self) -> None:
        self.mode = BLACKHOLE

    def refuse(self) -> None:
        self.mode = REFUSE

    def drop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close_all(), self._loop).result(timeout=10)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # -- the loop's side ------------------------------------------------------------------

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_all()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.add(writer)
        if self.mode == REFUSE:
            await self._close(writer)
            return
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        if self.mode == FORWARD:
            try:
                upstream = await asyncio.open_connection(*self.target)
            except OSError:
                await self._close(writer)
                return
            self._writers.add(upstream[1])
        else:
            # Black hole: read and discard until the client gives up.
            await self._swallow(reader)
            await self._close(writer)
            return
        up_reader, up_writer = upstream
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )
        await self._close(writer)
        await self._close(up_writer)

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction, each chunk delivered ``latency_s`` after it arrived, in order.
        In black-hole mode, chunks are read and discarded: the connection stays open."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self.mode == BLACKHOLE:
                    continue
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                chunk = await reader.read(65536)
                await queue.put((time.monotonic() + self.latency_s, chunk))
                if not chunk:
                    break
            await sender
        except OSError:
            sender.cancel()
        finally:
            await self._close(writer)

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        writer.close()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await writer.wait_closed()
