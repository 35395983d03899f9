"""CRON_RUNNER_PING_URL against real HTTP servers on loopback: one that records the pings,
one that accepts and never answers, and a port where nothing listens."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from runner.errors import ConfigError
from runner.testing import RedisServer, free_port
from tests.helpers.proc import ROOT, cronjob_env, outcome, run, runner_env
from tests.helpers.wait import schedule_far_from_edges


class Recorder(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.paths: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(handler) -> None:  # the server is `self` here
                self.paths.append(handler.path)
                handler.send_response(200)
                handler.send_header("Content-Length", "2")
                handler.end_headers()
                handler.wfile.write(b"OK")

            def log_message(handler, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/ping/abc"

    def pings(self) -> list[tuple[str, str]]:
        """(path, rid) of each ping, in arrival order."""
        out = []
        for path in self.paths:
            parts = urlsplit(path)
            out.append((parts.path, parse_qs(parts.query)["rid"][0]))
        return out


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def hanging() -> Iterator[str]:
    """Accepts connections and reads, never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
                held.append(conn)
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/ping/hang"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_success_and_failure_ping_start_then_end_with_one_run_id(
    redis_server: RedisServer, recorder: Recorder
) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_PING_URL=recorder.url)
    assert run(["exec", "--name", "ok", "--", "true"], env).returncode == 0
    assert run(["exec", "--name", "bad", "--", "sh", "-c", "exit 3"], env).returncode == 3
    (start, end), (bad_start, bad_end) = recorder.pings()[:2], recorder.pings()[2:]
    assert (start[0], end[0]) == ("/ping/abc/start", "/ping/abc")
    assert start[1] == end[1]
    assert (bad_start[0], bad_end[0]) == ("/ping/abc/start", "/ping/abc/3")
    assert bad_start[1] == bad_end[1] != start[1]


def test_a_skipped_replica_does_not_ping(redis_server: RedisServer, recorder: Recorder) -> None:
    env = runner_env(redis_server.url, CRON_RUNNER_PING_URL=recorder.url,
                     CRON_RUNNER_SCHEDULE=schedule_far_from_edges(300))  # fmt: skip
    assert run(["exec", "--name", "once", "--", "true"], env).returncode == 0
    skipped = run(["exec", "--name", "once", "--holder", "b", "--", "true"], env)
    assert outcome(skipped.stderr) == "skipped_done"
    assert [p for p, _ in recorder.pings()] == ["/ping/abc/start", "/ping/abc"]


def _an_hour_ago_daily() -> str:
    then = time.gmtime(time.time() - 3600)
    return f"{then.tm_min} {then.tm_hour} * * *"


def _too_late(redis_url: str) -> dict[str, str]:
    # A crontab line an hour past its slot, with the default starting deadline of 300 s.
    env = runner_env(redis_url, CRON_RUNNER_SCHEDULE=_an_hour_ago_daily())
    del env["CRON_RUNNER_STARTING_DEADLINE"]
    return env


def _stale(redis_url: str) -> dict[str, str]:
    # A CronJob pod of a daily slot three days old: past its marker's retention (two days).
    old_s = (int(time.time()) // 86_400 - 3) * 86_400 + 3 * 3600
    env = cronjob_env(redis_url, "late", "0 3 * * *", old_s)
    del env["CRON_RUNNER_SLOT_RETENTION"]
    return env


@pytest.mark.parametrize(("expected", "env_for"), [("too_late", _too_late),
                                                   ("skipped_stale", _stale)])  # fmt: skip
def test_a_slot_not_run_for_being_late_or_stale_does_not_ping_success(
    redis_server: RedisServer,
    recorder: Recorder,
    expected: str,
    env_for: Callable[[str], dict[str, str]],
) -> None:
    # Exit 0, yet the task never ran: a success ping would hide the missed run from the
    # dead-man's switch, and a failure ping would page for a slot another runner may have run.
    env = {**env_for(redis_server.url), "CRON_RUNNER_PING_URL": recorder.url}
    res = run(["exec", "--name", "late", "--", "true"], env)
    assert (outcome(res.stderr), res.returncode) == (expected, 0), res.stderr
    assert recorder.pings() == []


def test_redis_unreachable_pings_its_exit_code(recorder: Recorder) -> None:
    from runner.errors import StoreUnavailable  # noqa: PLC0415

    env = runner_env(f"redis://127.0.0.1:{free_port()}/0", CRON_RUNNER_PING_URL=recorder.url,
                     CRON_RUNNER_CONNECT_TIMEOUT="500ms")  # fmt: skip
    res = run(["exec", "--name", "x", "--", "true"], env)
    assert res.returncode == StoreUnavailable.exit_code
    assert [p for p, _ in recorder.pings()] == [f"/ping/abc/{StoreUnavailable.exit_code}"]


@pytest.mark.parametrize("kind", ["hanging", "nothing listening"])
def test_a_ping_server_that_hangs_or_is_gone_changes_nothing(
    redis_server: RedisServer, hanging: str, kind: str
) -> None:
    url = hanging if kind == "hanging" else f"http://127.0.0.1:{free_port()}/ping"
    env = runner_env(redis_server.url, CRON_RUNNER_PING_URL=url, CRON_RUNNER_PING_TIMEOUT="1s")
    started = time.monotonic()
    res = run(["exec", "--name", "hung", "--", "true"], env, timeout=60)
    elapsed = time.monotonic() - started
    assert (res.returncode, outcome(res.stderr)) == (0, "ran"), res.stderr
    # Bounded by the ping timeout, not by the server: it never answers at all.
    assert elapsed < 30
    assert "failed" in res.stderr or "no answer" in res.stderr
    assert "/ping/hang" not in res.stderr  # the path (a credential) is not logged


@pytest.mark.parametrize(
    ("name", "value"), [("CRON_RUNNER_PING_URL", "ftp://x/y"), ("CRON_RUNNER_PING_URL", "hc"),
                        ("CRON_RUNNER_PING_URL", "http://x\r\nHost: evil/"),
                        ("CRON_RUNNER_PING_URL", "http://user:pw@hc.example/u"),
                        ("CRON_RUNNER_PING_URL", "http://hc.example:port/u"),
                        ("CRON_RUNNER_PING_URL", "http://:80/u"),
                        ("CRON_RUNNER_PING_TIMEOUT", "5m")],
)  # fmt: skip
def test_bad_ping_settings_are_refused(redis_server: RedisServer, name: str, value: str) -> None:
    res = run(["exec", "--name", "x", "--", "true"], runner_env(redis_server.url, **{name: value}))
    assert res.returncode == ConfigError.exit_code
    assert name in res.stderr and "Traceback" not in res.stderr


def test_ping_is_imported_only_when_a_run_pings(redis_server: RedisServer) -> None:
    probe = ("import sys; from runner.cli.main import main; code = main(sys.argv[1:]); "
             "print('runner.run.ping' in sys.modules, 'urllib.request' in sys.modules, "
             "file=sys.__stdout__)")  # fmt: skip
    base = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE=schedule_far_from_edges(300))
    pinged = {**base, "CRON_RUNNER_PING_URL": f"http://127.0.0.1:{free_port()}/p",
              "CRON_RUNNER_PING_TIMEOUT": "200ms"}  # fmt: skip

    def probe_run(env: dict[str, str], holder: str) -> str:
        res = subprocess.run(
            [sys.executable, "-c", probe, "exec", "--name", "lazy", "--holder", holder, "--", "true"],
            env=env, capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        return res.stdout.strip()

    assert probe_run(base, "a") == "False False"  # not configured
    assert probe_run(pinged, "b") == "False False"  # configured, but this replica skipped
    assert run(["exec", "--name", "other", "--", "true"], pinged).returncode == 0
    assert probe_run({**pinged, "CRON_RUNNER_SCHEDULE": "* * * * *"}, "c").startswith("True")
