"""The HTTP side of `serve`: the standard library's threading server, one port, GET only.

Routes: ``/metrics`` (Prometheus), ``/`` (status page), ``/tasks/TASK``, ``/healthz`` (the
process answers) and ``/readyz`` (Redis answers). A Redis fault is a 503 with a clear page or
line, never a traceback; a task that is not known is a 404.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.exceptions import RedisError

from runner.errors import ConfigError
from runner.keys import validate_name
from runner.lease.replies import pong
from runner.serve import pages
from runner.serve.metrics import Exposition
from runner.serve.snapshot import Source
from runner.signals import Shutdown

log = logging.getLogger("runner.serve")

HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class App:
    def __init__(self, source: Source, *, scope: str, redis_target: str) -> None:
        self.source = source
        self.scope = scope
        self.redis_target = redis_target
        self.exposition = Exposition()

    def handle(self, path: str) -> tuple[int, str, bytes]:
        route = urlsplit(path).path
        if route == "/healthz":
            return 200, TEXT, b"ok\n"
        if route == "/readyz":
            return self._ready()
        if route == "/metrics":
            return self._metrics()
        if route in ("/", "/index.html"):
            return self._page(lambda snap: pages.index(snap, self.scope, self.redis_target))
        if route.startswith("/tasks/"):
            return self._task(unquote(route.removeprefix("/tasks/")))
        return self._not_found(f"There is no page at {route}.")

    def _ready(self) -> tuple[int, str, bytes]:
        try:
            pong(self.source.client.ping(), self.redis_target)
        except RedisError as exc:
            return 503, TEXT, f"not ready: Redis at {self.redis_target}: {exc}\n".encode()
        return 200, TEXT, b"ready\n"

    def _metrics(self) -> tuple[int, str, bytes]:
        try:
            snap = self.source.snapshot()
        except RedisError as exc:
            log.warning(f"metrics: cannot read Redis: {exc}", extra={"event": "serve_redis"})
            # cron_runner_up 0: the scrape itself succeeds, so an alert can say why.
            return 200, METRICS_TYPE, self.exposition.render(None)
        return 200, METRICS_TYPE, self.exposition.render(snap)

    def _page(self, render: Any) -> tuple[int, str, bytes]:
        try:
            snap = self.source.snapshot()
        except RedisError as exc:
            return self._redis_down(exc)
        return 200, HTML, render(snap).encode()

    def _task(self, name: str) -> tuple[int, str, bytes]:
        try:
            validate_name("task", name)
        except ConfigError:
            return self._not_found("No task has that name.")
        try:
            snap = self.source.snapshot()
            status = next((s for s in snap.tasks if s.task == name), None)
            if status is None:
                return self._not_found(f"No task named {name!r} in scope {self.scope!r}.")
            history = self.source.history(name, pages.HISTORY)
        except RedisError as exc:
            return self._redis_down(exc)
        return 200, HTML, pages.task_page(snap, self.scope, status, history).encode()

    def _redis_down(self, exc: Exception) -> tuple[int, str, bytes]:
        log.warning(f"page: cannot read Redis: {exc}", extra={"event": "serve_redis"})
        message = (
            f"Redis at {self.redis_target} cannot be read: {exc}. The page shows the tasks again "
            "once it answers (it reloads every 30 seconds)."
        )
        return 503, HTML, pages.error_page("Redis unreachable", message).encode()

    @staticmethod
    def _not_found(message: str) -> tuple[int, str, bytes]:
        return 404, HTML, pages.error_page("Not found", message).encode()


def make_server(
    app: App, host: str, port: int, server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        server_version = "cron-runner"
        sys_version = ""

        def do_GET(self) -> None:
            try:
                status, content_type, body = app.handle(self.path)
            except Exception:
                # A bug must not take the page down with a traceback to the browser.
                log.exception("serve: request failed", extra={"event": "serve_error"})
                status, content_type = 500, TEXT
                body = b"internal error: see the serve process's log\n"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header(
                "Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"
            )
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format % args, extra={"event": "http"})

    server = server_class((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_until_stopped(server: ThreadingHTTPServer, shutdown: Shutdown) -> None:
    thread = threading.Thread(target=server.serve_forever, name="serve-http", daemon=True)
    thread.start()
    shutdown.wait()
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
