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
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runner.cli import main as cli
from runner.testing import RedisServer
from tests.fault.test_hostile_input import EDGES, VARIABLES
from tests.helpers.proc import ROOT

# The positional arguments each command needs; flags are added before them.
COMMANDS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("run",): ("ok",),
    ("exec",): ("--name", "fuzzed", "--", "true"),
    ("tasks",): (),
    ("check",): (),
    ("status",): (),
    ("history",): ("ok",),
    ("unlock",): ("ok", "--force"),
    ("forget",): ("fuzzed", "--force"),
    ("watchdog",): (),
    ("pause",): ("ok",),
    ("resume",): ("ok",),
    ("dlq", "list"): ("ok",),
    ("dlq", "purge"): ("ok", "--all"),
}
# Exit 1 is an answer of these, not an error: a task overdue, a lease held by someone else.
ONE_IS_AN_ANSWER = {("watchdog",), ("unlock",), ("forget",)}
# Values that could make one example wait for long (a distant deadline against an address
# that never answers, a WAIT for replicas there are none of) are fuzzed by test_hostile_input's
# settings pass, which does no I/O.
SLOW_VARIABLES = {"REDIS_URL", "REDIS_SENTINELS", "REDIS_MIN_REPLICAS", "REDIS_CLUSTER",
                  "CONNECT_TIMEOUT", "SHUTDOWN_GRACE"}  # fmt: skip
SLOW_FLAGS = {"--redis-url", "--connect-timeout", "--shutdown-grace", "--name"}

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


FLAGS = {command: _flags(command) for command in COMMANDS}


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
    argv += COMMANDS[command]
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
    with _isolated(env) as (_, err):
        code = cli.main(argv)
    assert isinstance(code, int)
    assert "Traceback" not in err.getvalue(), (argv, err.getvalue()[-2000:])
    if code == 1 and command not in ONE_IS_AN_ANSWER:
        pytest.fail(f"exit 1 for {argv} {fuzzed}: {err.getvalue()[-1000:]}")
