"""Issue 12's fuzz pass: every flag of every command (read from the parser itself, so a new
flag is fuzzed as soon as it exists) and every ``CRON_RUNNER_*`` variable, with non-ASCII
digits, huge numbers and control characters, against a real Redis. The CLI is called in
process (``runner.cli.main``, what the ``cron-runner`` script calls), so that hundreds of
examples stay cheap: no exception may escape it (that is a traceback), and bad input is never
exit 1, the code a Job would take for a failed task and retry."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import subprocess
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runner.cli import main as cli
from runner.testing import RedisServer
from tests.fault.test_hostile_input import EDGES
from tests.helpers.proc import CRON_RUNNER, ROOT, runner_env

# The positional arguments each command needs; flags are added before them. Which commands
# and flags exist is read from the parser (test_every_command_is_fuzzed fails on a new one).
POSITIONALS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("run",): ("ok",),
    ("exec",): ("--name", "fuzzed", "--", "true"),
    ("tasks",): (),
    ("check",): (),
    ("status",): (),
    ("history",): ("ok",),
    ("unlock",): ("ok", "--force"),
    ("forget",): ("fuzzed", "--force"),
    ("redefine",): ("fuzzed", "--force"),
    ("watchdog",): (),
    ("ack",): ("ok", "--all"),
    ("pause",): ("ok",),
    ("resume",): ("ok",),
    ("trigger",): ("ok",),
    ("backfill",): ("--name", "fuzzed", "--schedule", "0 0 1 1 *", "--from",
                    "2026-01-01T00:00:00Z", "--to", "2026-01-01T00:00:00Z", "--force", "--",
                    "true"),
    ("import",): (str(ROOT / "tests" / "chart" / "cronjobs" / "db-backup.yaml"),),
    ("dlq", "list"): ("ok",),
    ("dlq", "show"): ("ok", "1-0"),
    ("dlq", "retry"): ("ok", "--all"),
    ("dlq", "purge"): ("ok", "--all"),
}  # fmt: skip
# They run until stopped: their flags are fuzzed in a subprocess, by a table
# (test_long_running_commands_refuse_a_bad_flag_naming_it).
LONG_RUNNING = {("worker",), ("serve",)}
# Exit 1 is an answer of these, not an error: a task overdue, a lease held by someone else, a
# slot not in the ledger, a DLQ message not found, a check failed.
ONE_IS_AN_ANSWER = {("watchdog",), ("unlock",), ("forget",), ("redefine",), ("ack",), ("check",),
                    ("dlq", "show"), ("dlq", "retry"), ("dlq", "purge")}  # fmt: skip
# Values that could make one example wait for long (a distant deadline against an address
# that never answers, a WAIT for replicas there are none of) are fuzzed by test_hostile_input's
# settings pass, which does no I/O.
SLOW_VARIABLES = {"REDIS_URL", "REDIS_SENTINELS", "REDIS_MIN_REPLICAS", "REDIS_CLUSTER",
                  "CONNECT_TIMEOUT", "SHUTDOWN_GRACE", "PING_URL", "PING_TIMEOUT",
                  "TELEMETRY_FLUSH_TIMEOUT", "HELD_WAIT", "OVERLAP_WAIT"}  # fmt: skip
SLOW_FLAGS = {"--redis-url", "--connect-timeout", "--shutdown-grace", "--name", "--wait",
              "--ping-url", "--ping-timeout", "--held-wait", "--overlap-wait"}  # fmt: skip
# Set by the runner for the task, not read from the runner's own environment.
FOR_THE_TASK = {"TASK", "FENCING_TOKEN", "SLOT"}


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [path]
    return [c for name, p in subs[0].choices.items() for c in _commands(p, (*path, name))]


def _variables() -> list[str]:
    """Every CRON_RUNNER_* name the runner's code spells out, and every one the settings
    loaders look up (read through a mapping that records the names asked for)."""
    import re  # noqa: PLC0415

    from runner.config.queue import load_queue_settings  # noqa: PLC0415
    from runner.config.settings import load_settings  # noqa: PLC0415

    class Recorder(dict[str, str]):
        asked: ClassVar[set[str]] = set()

        def get(self, key: str, default: Any = None) -> Any:
            self.asked.add(key)
            return super().get(key, default)

        def __contains__(self, key: object) -> bool:
            self.asked.add(str(key))
            return super().__contains__(key)

        def __getitem__(self, key: str) -> str:
            self.asked.add(key)
            return super().__getitem__(key)

    env = Recorder()
    load_queue_settings(load_settings(env), env)
    names = {k for k in Recorder.asked if k.startswith("CRON_RUNNER_")}
    for path in (ROOT / "runner").rglob("*.py"):
        names |= set(re.findall(r"CRON_RUNNER_([A-Z][A-Z0-9_]*[A-Z0-9])", path.read_text()))
        names |= {f"CRON_RUNNER_{n}" for n in
                  re.findall(r"\b(?:src|source)\.\w+\(\s*\"([A-Z][A-Z0-9_]*)\"", path.read_text())}  # fmt: skip
    return sorted({n.removeprefix("CRON_RUNNER_") for n in names} - FOR_THE_TASK)


VARIABLES = _variables()

# Arabic-Indic, fullwidth and Devanagari digits, a superscript, a huge number, controls.
NASTY = ["\u0661\u0662", "\uff13\uff10s", "\u0967\u0966m", "\u00b2", "9" * 30, "1e308", "-0",
         "0x10", "1_000", "\x1b[2J", "a\x00b", "\r\n", "\u202e", "\udcff", "", " "]  # fmt: skip
values = st.one_of(
    st.sampled_from(EDGES + NASTY),
    # No lone surrogates: an environment holds bytes, so only the surrogateescape range
    # (\udc80-\udcff, an undecodable byte) can reach the runner, and NASTY has one of those.
    st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=30),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)


def _parser_for(command: tuple[str, ...]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = cli.build_parser(command[0])
    for word in command:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[word]
    return parser


def _flags(command: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(flag, takes a value) for every option of the command."""
    out = []
    for action in _parser_for(command)._actions:
        if action.option_strings and action.dest != "help":
            out.append((action.option_strings[0], action.nargs != 0))
    return out


COMMANDS = [c for c in _commands(cli.build_parser(None)) if c not in LONG_RUNNING]
FLAGS = {command: _flags(command) for command in COMMANDS}


def test_every_command_is_fuzzed() -> None:
    assert set(_commands(cli.build_parser(None))) == set(POSITIONALS) | LONG_RUNNING
    assert {"LEASE_TTL", "REDIS_PASSWORD_FILE", "SERVE_PORT", "WORKER_THREADS"} <= set(VARIABLES)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


@contextlib.contextmanager
def _isolated(env: dict[str, str]) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """The process environment and the root logger as main() finds them, restored after:
    main() sets up logging and removes the runner's credentials from os.environ."""
    saved_env, root = dict(os.environ), logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    out, err = io.StringIO(), io.StringIO()
    root.handlers[:] = []  # main() then logs its error line to err, as to a terminal
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        root.handlers[:], root.level = saved_handlers, saved_level


@st.composite
def invocations(draw: st.DrawFn) -> tuple[tuple[str, ...], list[str], dict[str, str]]:
    command = draw(st.sampled_from(sorted(COMMANDS)))
    flags = [f for f in FLAGS[command] if f[0] not in SLOW_FLAGS]
    argv = list(command)
    for flag, takes_value in draw(st.lists(st.sampled_from(flags), max_size=3)) if flags else []:
        argv += [flag, draw(values)] if takes_value else [flag]
    argv += POSITIONALS[command]
    env = draw(st.dictionaries(
        st.sampled_from([v for v in VARIABLES if v not in SLOW_VARIABLES]),
        values.filter(lambda v: "\x00" not in v),  # no process environment can hold a NUL
        max_size=3,
    ))  # fmt: skip
    return command, argv, {f"CRON_RUNNER_{k}": v for k, v in env.items()}


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(invocations())
@example((("history",), ["history", "-n", "9" * 30, "ok"], {}))
@example((("history",), ["history", "-n", "\u0661\u0662", "ok"], {}))
@example((("exec",), ["exec", "--skew-tolerance", "0", "--name", "x", "--", "true"], {}))
@example((("exec",), ["exec", "--lease-ttl", "\uff13\uff10s", "--name", "x", "--", "true"], {}))
@example((("status",), ["status", "--tolerance", "\u0661m"], {}))
@example((("watchdog",), ["watchdog", "--ignore", "\x1b[2J"], {}))
@example((("watchdog",), ["watchdog", "--expect", "a=\u0661 * * * *"], {}))
@example((("exec",), ["exec", "--holder", "pod\x1b]0;x\x07", "--name", "x", "--", "true"], {}))
@example((("dlq", "list"), ["dlq", "list", "no-such-task"], {}))
@example((("run",), ["run", "ok"], {"CRON_RUNNER_TASK_MODULES": "os.path,\udcff"}))
@example((("check",), ["check"], {"CRON_RUNNER_REDIS_USERNAME": "0"}))
def test_no_flag_or_variable_value_gets_a_traceback_or_exit_1(
    server: RedisServer, invocation: tuple[tuple[str, ...], list[str], dict[str, str]]
) -> None:
    command, argv, fuzzed = invocation
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRON_RUNNER_", "OTEL_"))}
    env.update(CRON_RUNNER_REDIS_URL=server.url, CRON_RUNNER_CONNECT_TIMEOUT="300ms",
               CRON_RUNNER_TASK_MODULES="tests.sample_tasks", CRON_RUNNER_LOG_FORMAT="json",
               PYTHONPATH=str(ROOT))  # fmt: skip
    env.update(fuzzed)
    with _isolated(env) as (out, err):
        code = cli.main(argv)
    assert isinstance(code, int)
    text = out.getvalue() + err.getvalue()
    assert "Traceback" not in err.getvalue(), (argv, text[-2000:])
    if code == 1 and command not in ONE_IS_AN_ANSWER:
        pytest.fail(f"exit 1 for {argv} {fuzzed}: {text[-1000:]}")
    # 69: Redis did not answer within the (short) connect deadline, on a loaded machine.
    assert code in (0, 1, 64, 69, 78), (argv, fuzzed, code, text[-1000:])
    standard = argv[len(argv) - len(POSITIONALS[command]) :] == list(POSITIONALS[command])
    if code in (64, 78) and standard:
        # A refusal names what it refuses: a flag given (by any of its names) or a variable set.
        aliases = _aliases(command)
        given_flags = argv[len(command) : len(argv) - len(POSITIONALS[command])]
        names = {n for token in given_flags for n in aliases.get(token, ())} | set(fuzzed)
        assert any(n in text for n in names), (argv, fuzzed, text[-1000:])


def _aliases(command: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return {
        name: tuple(action.option_strings)
        for action in _parser_for(command)._actions
        for name in action.option_strings
    }


# The base command line of each long-running command: each fuzzed flag is put before it, so
# the base's own value of that flag is the one argparse keeps... after it: the fuzzed one wins.
LONG_BASE: dict[tuple[str, ...], list[str]] = {
    ("serve",): ["serve", "--host", "127.0.0.1", "--port", "0"],
    ("worker",): ["worker", "--processes", "1", "--threads", "1"],
}
LONG_VALUES = ["\u0661\u0662", "9" * 30, "a\x1bb"]


@pytest.mark.parametrize("value", LONG_VALUES, ids=["digits", "huge", "control"])
@pytest.mark.parametrize(
    ("command", "flag"),
    [(c, f) for c in sorted(LONG_RUNNING) for f, takes in _flags(c) if takes],
)
def test_long_running_commands_refuse_a_bad_flag_naming_it(
    redis_server: RedisServer, command: tuple[str, ...], flag: str, value: str
) -> None:
    """Refused at once (64 or 78, naming the flag), or taken: still running after 3 s."""
    env = runner_env(redis_server.url, CRON_RUNNER_TASK_MODULES="tests.queue.queue_tasks")
    proc = subprocess.Popen([CRON_RUNNER, *LONG_BASE[command], flag, value], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=3)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        assert "Traceback" not in err, err[-2000:]
        return
    assert "Traceback" not in err, err[-2000:]
    assert proc.returncode in (64, 78), (flag, value, proc.returncode, err[-1000:])
    assert any(name in out + err for name in _aliases(command)[flag]), err[-1000:]
