"""Pings to a dead-man's switch, in the Healthchecks.io form that Cronitor and others accept.

``URL/start`` when the run takes its lease, then ``URL`` on success or ``URL/<exit code>`` on
failure, each with the same run id (``?rid=UUID``), so the service pairs them and measures the
run. A ping never changes a run's outcome: it is sent from a thread of its own, and the run
waits for it at its end at most ``timeout_s`` (a hung or absent server costs that, no more).
A run that does not run its slot sends nothing: a replica that skips, and a slot too late
to start or too old to prove unrun (``too_late``, ``skipped_stale``: exit 0, yet no success;
docs/design.md, Monitoring). Imported only when ``CRON_RUNNER_PING_URL`` is set and the
run gets as far as its lease or its outcome (``runner.run.observer.PingHook``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

from runner.config.urls import redact_url

log = logging.getLogger("runner.ping")


def ping_url(base: str, suffix: str, rid: str) -> str:
    parts = urlsplit(base)
    path = parts.path.rstrip("/") + suffix
    query = f"{parts.query}&rid={rid}" if parts.query else f"rid={rid}"
    return urlunsplit((parts.scheme, parts.netloc, path, query, ""))


class Pinger:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.rid = str(uuid.uuid4())
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._send("/start")

    def finish(self, exit_code: int) -> None:
        self._send("" if exit_code == 0 else f"/{exit_code}")

    def _send(self, suffix: str) -> None:
        url = ping_url(self.url, suffix, self.rid)
        # After the one before it: a service reads an end before its start as a run with none.
        after = self._threads[-1] if self._threads else None
        thread = threading.Thread(
            target=self._get, args=(url, suffix, after), name="ping", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def _get(self, url: str, suffix: str, after: threading.Thread | None) -> None:
        import urllib.request  # noqa: PLC0415 - only on this thread, only when pinging

        if after is not None:
            after.join(self.timeout_s)
        shown = redact_url(self.url, keep_path=False) + suffix
        request = urllib.request.Request(url, headers={"User-Agent": "cron-runner"})  # noqa: S310 - http(s) only, checked in settings
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:  # noqa: S310
                resp.read(1024)
        except Exception as exc:  # noqa: BLE001 - a ping must never fail a run
            log.warning(f"ping {shown} failed: {exc}", extra={"event": "ping_failed"})
            return
        log.debug(f"pinged {shown}", extra={"event": "pinged"})

    def close(self) -> None:
        """Wait for the pings still going, ``timeout_s`` at most in all."""
        deadline = time.monotonic() + self.timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            log.warning(
                f"ping: no answer within {self.timeout_s:g}s; the run did not wait longer",
                extra={"event": "ping_timeout"},
            )
