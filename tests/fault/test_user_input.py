"""User input at its edges, through the CLI on real processes and a real Redis
(docs/reliability.md, Hostile input): each test is one class, parametrized over its members.

* a secret in a URL of any shape is never shown (runner.config.urls);
* deep, huge and special-file input is a clean 78, never a traceback or a wait;
* a time at the edges of what the commands take (0, 1970, 9999, beyond) is read or refused
  with 78 naming the flag, and every command reads a time without a zone alike (refused);
* an empty executable file runs as the empty script sh would make of it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from runner.testing import RedisServer
from tests.helpers.proc import CRON_RUNNER, events, runner_env
from tests.helpers.wait import wait_for

MARK = "Zq7SECRETmark"


@pytest.fixture
def server(redis_server: RedisServer) -> RedisServer:
    # Per test: tests/fault's conftest stops every process a test leaves, a server too.
    return redis_server


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
    # CRON_RUNNER_PING_URL, with the real Redis: a ping URL's path is its key.
    "ping:http://127.0.0.1:1/{m}",
    "ping:http://127.0.0.1:1/{m} x",
    "ping:http://u:{m}@127.0.0.1:1/x",
    "ping:ftp://127.0.0.1/{m}",
    "ping:http://127.0.0.1:99999/{m}",
    "ping:http://127.0.0.1:1/x?token={m}",
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
    if url.startswith("ping:"):
        url = server.url
        env.update(CRON_RUNNER_REDIS_URL=url, CRON_RUNNER_PING_URL=form.format(m=MARK)[5:],
                   CRON_RUNNER_PING_TIMEOUT="1s")  # fmt: skip
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


# -- deep, huge and special-file input ------------------------------------------------------


def _nested(depth: int, *, json_form: bool = False) -> str:
    if json_form:
        return '{"a":' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def _make(tmp_path: Path, kind: str) -> str:
    """A path to an input of ``kind``."""
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "fifo-link":
        os.mkfifo(tmp_path / "fifo-target")
        path.symlink_to(tmp_path / "fifo-target")
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))  # left open for the test's life by the module-level list
        _KEEP.append(sock)
    elif kind == "huge":
        path.write_text("p" * 100_000)
    elif kind == "empty":
        path.write_text("")
    elif kind == "huge-yaml":
        path.write_text("# " + "x" * (33 * 2**20) + "\n")
    elif kind == "laughs":
        path.write_text(_LAUGHS)
    elif kind.startswith(("yaml-", "json-")):
        path.write_text(_nested(int(kind[5:]), json_form=kind.startswith("json-")))
    else:
        return kind  # a path as given: /dev/zero, /dev/null
    return str(path)


_KEEP: list[socket.socket] = []
BACKFILL = ["backfill", "--name", "bf", "--schedule", "0 0 1 1 *"]
# (arguments, variables, exit codes that are a clean answer); {X} is made by _make.
HOSTILE = {
    **{f"import yaml depth {d}": (["import", f"{{yaml-{d}}}"], {}, {78}) for d in (200, 500, 1000, 100_000)},
    **{f"import json depth {d}": (["import", f"{{json-{d}}}"], {}, {78}) for d in (600, 100_000)},
    "import huge": (["import", "{huge-yaml}"], {}, {78}),
    "import /dev/zero": (["import", "{/dev/zero}"], {}, {78}),
    "import aliases": (["import", "{laughs}"], {}, {78}),
    "import directory": (["import", "{directory}"], {}, {78}),
    "backfill from 0": ([*BACKFILL, "--from", "0", "--to", "100000000", "--force", "--", "true"], {}, {0}),
    "backfill from 0 unforced": ([*BACKFILL, "--from", "0", "--to", "100000000", "--", "true"], {}, {78}),
    "backfill from 1970": ([*BACKFILL, "--from", "1970-01-01T00:00:00Z", "--to", "1", "--force", "--", "true"], {}, {0}),
    "backfill to 9999": ([*BACKFILL, "--from", "0", "--to", "9999-12-31T23:59:59Z", "--", "true"], {}, {78}),
    "backfill to 10000": ([*BACKFILL, "--from", "0", "--to", "253402300800", "--", "true"], {}, {78}),
    "backfill from -1": ([*BACKFILL, "--from", "-1", "--to", "1", "--", "true"], {}, {78}),
    "backfill before 1970": ([*BACKFILL, "--from", "0001-01-01T00:00:00+14:00", "--to", "1", "--", "true"], {}, {78}),
    "backfill huge": ([*BACKFILL, "--from", "9" * 400, "--to", "1", "--", "true"], {}, {78}),
    "backfill 1e10": ([*BACKFILL, "--from", "1e10", "--to", "1", "--", "true"], {}, {78}),
    "pause until 0": (["pause", "ok", "--until", "0"], {}, {78}),
    "pause until 9999": (["pause", "ok", "--until", "9999-12-31T23:59:59Z"], {}, {0}),
    "pause until 10000": (["pause", "ok", "--until", "253402300800"], {}, {78}),
    "pause until huge": (["pause", "ok", "--until", "9" * 400], {}, {78}),
    "ack 0": (["ack", "ok", "0"], {}, {1}),
    "ack 9999": (["ack", "ok", "253402300799"], {}, {1}),
    "ack 10000": (["ack", "ok", "253402300800"], {}, {78}),
    "ack -1": (["ack", "ok", "-1"], {}, {78}),
    "ack huge": (["ack", "ok", "9" * 400], {}, {78}),
    **{f"scheduled timestamp {t}": (["run", "ok"], {"CRON_RUNNER_SCHEDULE": "* * * * *",
                                                      "CRON_RUNNER_SCHEDULED_TIMESTAMP": t}, {78})
       for t in ("1970-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00+14:00")},
    "trigger: no slot to read": (["trigger", "ok"], {"CRON_RUNNER_SCHEDULE": "* * * * *",
                                 "CRON_RUNNER_SCHEDULED_TIMESTAMP": "9999-12-31T23:59:59Z"}, {0}),
    **{f"password file {k}": (["status"], {"CRON_RUNNER_REDIS_PASSWORD_FILE": f"{{{k}}}"}, {78})
       for k in ("fifo", "fifo-link", "directory", "socket", "huge", "empty", "/dev/zero",
                 "/dev/null", "/dev/tty")},
    "sentinel password fifo": (["status"], {"CRON_RUNNER_REDIS_SENTINELS": "127.0.0.1:1",
                                            "CRON_RUNNER_REDIS_SENTINEL_PASSWORD_FILE": "{fifo}"}, {78}),
    "tls ca fifo": (["status"], {"CRON_RUNNER_REDIS_TLS_CA_FILE": "{fifo}"}, {78}),
}  # fmt: skip


def _fill(text: str, tmp_path: Path) -> str:
    if text.startswith("{") and text.endswith("}") and len(text) > 2:
        return _make(tmp_path, text[1:-1])
    return text


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_deep_huge_or_special_input_is_a_clean_answer_in_time(
    server: RedisServer, tmp_path: Path, case: str
) -> None:
    args, extra, codes = HOSTILE[case]
    env = runner_env(server.url, CRON_RUNNER_CONNECT_TIMEOUT="2s")
    env.update({k: _fill(v, tmp_path) for k, v in extra.items()})
    argv = [_fill(a, tmp_path) for a in args]
    try:
        # Each is refused before any wait, or runs at once: 60 s bounds only a broken case.
        res = subprocess.run([CRON_RUNNER, *argv], env=env, capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: still running after 60 s")
    assert "Traceback" not in res.stderr, (case, res.stderr[-2000:])
    assert res.returncode in codes, (case, res.returncode, res.stderr[-1000:])


# -- a time without a zone ------------------------------------------------------------------

# Every command that takes a time, with the flag its refusal must name. The documented rule
# (README, pause and backfill): ISO 8601 with Z or an offset, or epoch seconds; a time without
# a zone is refused, as each host would read it in its own zone.
TIME_TAKERS = {
    "ack SLOT": (["ack", "ok", "{t}"], "SLOT"),
    "pause --until": (["pause", "ok", "--until", "{t}"], "--until"),
    "backfill --from": ([*BACKFILL, "--from", "{t}", "--to", "2026-01-01T00:00:00Z", "--force",
                         "--", "true"], "--from"),
    "backfill --to": ([*BACKFILL, "--from", "2026-01-01T00:00:00Z", "--to", "{t}", "--force",
                       "--", "true"], "--to"),
}  # fmt: skip
ZONELESS = ["2027-12-04T15:00:00", "2027-12-04 15:00:00", "2027-12-04T15:00", "2027-12-04",
            "20271204T150000", "2027-12-04T15:00:00.5"]  # fmt: skip


@pytest.mark.parametrize("when", ZONELESS)
@pytest.mark.parametrize("command", sorted(TIME_TAKERS))
def test_every_command_refuses_a_time_without_a_zone_alike(
    server: RedisServer, command: str, when: str
) -> None:
    args, flag = TIME_TAKERS[command]
    env = runner_env(server.url)
    res = subprocess.run([CRON_RUNNER, *(a.replace("{t}", when) for a in args)], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 78, (command, when, res.returncode, res.stderr[-600:])
    (line,) = [e["msg"] for e in events(res.stderr) if e.get("event") == "error"]
    assert flag in line and "no time zone" in line, line


# -- an empty executable file -----------------------------------------------------------------

# Files without a #! line: execvp runs them with /bin/sh (and so env(1), timeout(1), a shell,
# crontab), and the runner does as they do.
SCRIPTS = {
    "empty": "",
    "a newline": "\n",
    "a comment": "# nothing to do\n",
    "commands": 'echo "ran $# $1"\nexit 3\n',
    "a failing command": "false\n",
}


@pytest.mark.parametrize("on_path", [False, True])
@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_a_file_without_an_interpreter_line_runs_as_sh_runs_it(
    server: RedisServer, tmp_path: Path, kind: str, on_path: bool
) -> None:
    script = tmp_path / "job"
    script.write_text(SCRIPTS[kind])
    script.chmod(0o755)
    env = runner_env(server.url, PATH=f"{tmp_path}:{os.environ['PATH']}")
    command = ["job" if on_path else str(script), "one"]
    sh = subprocess.run(["sh", str(script), "one"], capture_output=True, text=True, timeout=30)
    res = subprocess.run([CRON_RUNNER, "exec", "--name", "noshebang", "--", *command], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (res.returncode, res.stdout) == (sh.returncode, sh.stdout), res.stderr[-600:]
    (finished,) = [e for e in events(res.stderr) if e.get("event") == "finished"]
    assert finished["exit_code"] == sh.returncode
