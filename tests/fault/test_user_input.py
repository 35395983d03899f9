"""User input at its edges, through the CLI on real processes and a real Redis
(docs/reliability.md, Hostile input): each test is one class, parametrized over its members.

* a secret in a URL of any shape is never shown (runner.config.urls);
* deep, huge and special-file input is a clean 78, never a traceback or a wait;
* a time at the edges of what the commands take (0, 1970, 9999, beyond) is read or refused
  with 78 naming the flag, and every command reads a time without a zone alike (refused);
* an empty executable file runs as the empty script sh would make of it.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.testing import RedisServer
from tests.helpers.proc import CRON_RUNNER, events, runner_env
from tests.helpers.wait import wait_for

MARK = "Zq7SECRETmark"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


# {hp}: the real server's host:port, {h}: its host, {sock}: a socket path. Each form holds MARK
# where a password would be, in a URL that is malformed, odd, or well formed with a secret-like
# option in a part redis-py ignores.
URL_FORMS = [
    "redis://{h}:p/0;password={m}",
    "redis://{h}:p/0#password={m}",
    "redis://{hp}/0;password={m}",
    "redis://{hp}/0#password={m}",
    "redis://{hp}/0#x&token={m}",
    "redis://{hp}/0?pwd={m}",
    "redis://{hp}/0?token={m}",
    "redis://{hp}/0?secret={m}",
    "redis://{hp}/0?auth={m}",
    "redis://{hp}/0?api_key={m}",
    "redis://{hp}/0?foo=1&password={m}",
    "redis://{hp}/0?password={m};x=1",
    "redis://{hp}/0?pass%77ord={m}",
    "redis://{hp}/0?password%3D{m}",
    "redis://{hp}/0/password={m}",
    "redis://{hp}/0?password={m}#frag",
    "redis://{hp}/0 password={m}",
    "redis://{hp}/0\tpassword={m}",
    "redis://:{m}@{hp}/x",
    "redis://u:{m}@{h}:p/0",
    "redis://u:{m}@{hp}:6379/0",
    "redis://{m}@[::1",
    "redis://[::1/0?password={m}",
    "redis://user;password={m}@{hp}/0",
    "redis://password={m}@{hp}/0",
    "redis://{h}:{m}/0",
    "{m}",
    "{hp};password={m}",
    "http://u:{m}@{hp}",
    "redis//{hp}?password={m}",
    "rediss://{hp}/0?token={m}",
    "unix://{sock};password={m}",
    "unix://{sock}?secret={m}",
    "redis://{hp}/0?password={m}&password={m}",
    "redis://{hp}/0?username=u&password={m}&x=1",
]


def _serve(env: dict[str, str], log: Path) -> str:
    """`serve` on a free port: its output, and its pages if it started."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [CRON_RUNNER, "serve", "--host", "127.0.0.1", "--port", "0"],
            env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        started = lambda: [e for e in events(log.read_text()) if e.get("event") == "serving"]  # noqa: E731
        wait_for(lambda: started() or proc.poll() is not None, 20)
        pages = ""
        for event in started()[:1]:
            for path in ("/", "/healthz", "/metrics", "/tasks/x"):
                try:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{event['port']}{path}", timeout=20
                    ) as resp:
                        pages += resp.read().decode()
                except urllib.error.HTTPError as exc:
                    pages += exc.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return log.read_text() + pages


@pytest.mark.parametrize("form", URL_FORMS)
def test_a_secret_in_a_url_of_any_shape_is_never_shown(
    server: RedisServer, tmp_path: Path, form: str
) -> None:
    url = form.format(
        hp=f"127.0.0.1:{server.port}", h="127.0.0.1", m=MARK, sock=tmp_path / "r.sock"
    )
    env = runner_env(url, CRON_RUNNER_CONNECT_TIMEOUT="500ms")
    flag_env = {k: v for k, v in env.items() if k != "CRON_RUNNER_REDIS_URL"}
    runs = [
        (env, ["exec", "--name", "x", "--", "true"]),
        (env, ["status"]),
        (env, ["check"]),
        (env, ["history", "x"]),
        (flag_env, ["exec", "--redis-url", url, "--name", "x", "--", "true"]),
        (flag_env, ["status", "--redis-url", url]),
    ]
    procs = [
        (args[0], subprocess.Popen([CRON_RUNNER, *args], env=e, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True))
        for e, args in runs
    ]  # fmt: skip
    shown = []
    for what, proc in procs:
        out, err = proc.communicate(timeout=60)
        assert "Traceback" not in err, (what, err)
        shown.append((what, proc.returncode, out + err))
    shown.append(("serve", 0, _serve(env, tmp_path / "log")))
    leaks = [(what, code) for what, code, text in shown if MARK in text]
    assert not leaks, (url, next(t for *_, t in shown if MARK in t)[-600:])
