"""`cron-runner serve`: Prometheus metrics, a status page and health checks, read-only.

Only the parser lives here (built for every non-hot command); the handler imports the HTTP
server, prometheus_client and Jinja2 (the ``serve`` extra), so `run` and `exec` never do.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from runner.config.settings import Settings
from runner.config.sources import Source, parse_duration, setting_flags, whole_number
from runner.errors import ConfigError

AddFlags = Callable[[argparse.ArgumentParser, Sequence[str]], None]

log = logging.getLogger("runner.serve")

DEFAULT_HOST = "0.0.0.0"  # noqa: S104 - a pod's port is reached through its Service
DEFAULT_PORT = 8080
DEFAULT_TOLERANCE_S = 600.0

EPILOG = """routes:
  /metrics      Prometheus text format (prometheus_client): per task, per queue, the watchdog
  /             the status page: every task, its state, next slot and last runs
  /tasks/TASK   one task and its history (404 for a task that is not known)
  /healthz      200 while the process answers
  /readyz       200 while Redis answers, else 503

environment (flags win):
  CRON_RUNNER_SERVE_HOST       address to listen on (default 0.0.0.0: all interfaces)
  CRON_RUNNER_SERVE_PORT       port (default 8080)
  CRON_RUNNER_SERVE_TOLERANCE  how late a run may finish before its slot is missed (default 10m)
It never writes to Redis: leases, markers and the ledger are the runs' and the watchdog's.
"""


class ServeSettings(NamedTuple):
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tolerance_s: float = DEFAULT_TOLERANCE_S


def load_serve_settings(
    env: Mapping[str, str], flags: Mapping[str, str | None] | None = None
) -> ServeSettings:
    src = Source(env, flags or {})
    host, _ = src.get("SERVE_HOST")
    port_raw, origin = src.get("SERVE_PORT")
    origin = origin.replace("--serve-", "--")  # the flags are --host, --port, --tolerance
    port = DEFAULT_PORT
    if port_raw is not None:
        if not whole_number(port_raw) or not 0 <= int(port_raw) < 65536:
            raise ConfigError(
                f"{origin}={port_raw!r} is not valid: expected a port, 1 to 65535 (0: any free one)"
            )
        port = int(port_raw)
    return ServeSettings(
        host=host or DEFAULT_HOST,
        port=port,
        tolerance_s=_tolerance(src),
    )


def _tolerance(src: Source) -> float:
    value, origin = src.get("SERVE_TOLERANCE")
    if value is None:
        return DEFAULT_TOLERANCE_S
    return parse_duration(value, origin.replace("--serve-", "--"))


def add_commands(sub: Any, add_flags: AddFlags) -> None:
    p = sub.add_parser(
        "serve",
        help="serve Prometheus metrics, a status page and health checks (read-only)",
        description="A long-running, read-only process that shows what the runs, the workers "
        "and the watchdog leave in Redis: /metrics for Prometheus, a status page for people.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", dest="setting_SERVE_HOST", metavar="ADDRESS",
                   help=f"address to listen on (default {DEFAULT_HOST}) [CRON_RUNNER_SERVE_HOST]")  # fmt: skip
    p.add_argument("--port", dest="setting_SERVE_PORT", metavar="PORT",
                   help=f"port (default {DEFAULT_PORT}) [CRON_RUNNER_SERVE_PORT]")  # fmt: skip
    p.add_argument("--tolerance", dest="setting_SERVE_TOLERANCE", metavar="DURATION",
                   help="how late a run may finish before its slot counts as missed (default "
                   "10m, as the watchdog's) [CRON_RUNNER_SERVE_TOLERANCE]")  # fmt: skip
    add_flags(p, ("CONNECT_TIMEOUT",))
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    serve = load_serve_settings(os.environ, setting_flags(args))
    try:
        from runner.serve.app import App, make_server, serve_until_stopped  # noqa: PLC0415
        from runner.serve.snapshot import Source as StatusSource  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            f"serve needs the 'serve' extra (pip install 'redis-cron-runner[serve]'): {exc}"
        ) from exc
    from runner.lease import store  # noqa: PLC0415
    from runner.signals import Shutdown  # noqa: PLC0415

    lease = settings.lease
    # No PING first: serve starts while Redis is away, and /readyz says so.
    with store.connected(settings.redis, "serve", ping=False) as client:
        source = StatusSource(client, lease.prefix, lease.scope, tolerance_s=serve.tolerance_s)
        app = App(source, scope=lease.scope, redis_target=settings.redis.display_target)
        try:
            server = _bind(app, make_server, serve)
        except OSError as exc:
            raise ConfigError(
                f"serve: cannot listen on {serve.host}:{serve.port}: {exc.strerror or exc} "
                "(set --host/--port or CRON_RUNNER_SERVE_HOST/_PORT)"
            ) from exc
        # The one stop flag: SIGTERM, SIGINT and every other stop signal end it cleanly.
        shutdown = Shutdown().install()
        host, port = server.server_address[:2]
        log.info(
            f"serving on http://{host}:{port}/ (scope {lease.scope!r}, Redis {app.redis_target})",
            extra={"event": "serving", "port": port},
        )
        serve_until_stopped(server, shutdown)
    return 0


def _bind(app: Any, make_server: Any, serve: ServeSettings) -> Any:
    if ":" in serve.host:  # an IPv6 address
        import http.server  # noqa: PLC0415

        class V6(http.server.ThreadingHTTPServer):
            address_family = socket.AF_INET6

        server = make_server(app, serve.host, serve.port, server_class=V6)
    else:
        server = make_server(app, serve.host, serve.port)
    return server
