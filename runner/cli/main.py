"""The CLI edge: parses flags and environment into settings once, runs a subcommand, and maps
every error to its exit code in one place (docs/design.md, Exit codes)."""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import os
import sys
from collections.abc import Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from runner import __version__, logs, streams
from runner.cli.launch import command_definition, execute
from runner.config.settings import Settings, load_settings, task_environment
from runner.config.sources import FLAG_DEST_PREFIX, OPTIONS_ATTR, setting_flags, setting_options
from runner.config.urls import url_has_password
from runner.errors import (
    EXIT_TASK_FAILED,
    ConfigError,
    CronRunnerError,
    StoreUnavailable,
    Terminated,
    UsageError,
)

if TYPE_CHECKING:
    from runner.tasks import CatchupOptions, RunOptions

log = logging.getLogger("runner")

EXIT_CODES = """exit codes:
  0    ran successfully, or skipped (another holder has the lease, the slot already ran,
       the task is paused, a later slot superseded this one, or, without a Job name, it
       started past CRON_RUNNER_STARTING_DEADLINE: too_late)
  1    the task failed (exec passes the command's own code through, whatever it is)
  64   usage error: the command line is wrong (unknown flag, missing argument)
  69   Redis unreachable within the connect deadline; the task did not run
  75   the lease was lost during the run and the task was stopped; or a run of the same slot
       held the lease and neither renewed nor released it within CRON_RUNNER_HELD_WAIT
  78   configuration error (bad cron, unknown task, bad URL, bad duration, another definition
       of the task or a newer protocol in Redis, a finish refused by the ACL or a key's type)
  79   replaced: under --overlap replace, a run of a newer slot asked this run to stop; the
       task was stopped and its slot marked done (not to be retried)
  126  exec: the command was found but cannot run (no execute bit, bad interpreter)
  127  exec: the command was not found
  143  stopped by SIGTERM, or by any other signal that would end the process (SIGINT, SIGHUP,
       SIGQUIT, SIGUSR1/2, SIGALRM, SIGXCPU, real-time signals...; not SIGPIPE, SIGXFSZ)
"""

ENVIRONMENT = """environment (flags win over variables):
  CRON_RUNNER_REDIS_URL          redis://host:6379/0, rediss://..., unix:///path (default redis://localhost:6379/0)
  CRON_RUNNER_REDIS_USERNAME     ACL user;  CRON_RUNNER_REDIS_PASSWORD  password (keep it in a Secret)
  CRON_RUNNER_REDIS_PASSWORD_FILE  read the password from this file (a mounted Secret) instead
  CRON_RUNNER_TASK_SHARES_CREDENTIALS  true: the task inherits the runner's Redis credentials
                                 (default false: they are removed from the task's environment)
  CRON_RUNNER_REDIS_SENTINELS    host:port,... with CRON_RUNNER_REDIS_SENTINEL_MASTER
  CRON_RUNNER_REDIS_CLUSTER      true for Redis Cluster
  CRON_RUNNER_LEASE_TTL          lease TTL (default 30s); renewed every TTL/3
  CRON_RUNNER_CONNECT_TIMEOUT    keep trying to reach Redis this long, then exit 69 (default 10s)
  CRON_RUNNER_SCHEDULE, _TIMEZONE  cron schedule (as Kubernetes reads it) and IANA zone, for slots
  CRON_RUNNER_SKEW_TOLERANCE     clock-skew tolerance for schedule slots (default 30s)
  CRON_RUNNER_STARTING_DEADLINE  without a Job name, a run this late after its slot records
                                 too_late and does not run (default 300s)
  CRON_RUNNER_HELD_WAIT          a run of the same slot holds the lease: wait this long for it to
                                 finish, renew or expire (default the TTL + 10s)
  CRON_RUNNER_OVERLAP            an earlier slot still holds the lease: skip (default), buffer-one
                                 (wait, run next), replace (stop it, run), allow-other-slots
  CRON_RUNNER_OVERLAP_WAIT       buffer-one's and replace's wait (default: the schedule's shortest
                                 gap; replace: the TTL + shutdown grace + 10s)
  CRON_RUNNER_CATCHUP            earlier slots within the window that never ran: none (default),
                                 latest (run the newest once), all (run each, oldest first)
  CRON_RUNNER_CATCHUP_WINDOW     how far back a run looks for them, e.g. 3h; a run late by up to
                                 this still runs its own slot
  CRON_RUNNER_REDEFINE           true: replace the task's stored definition (schedule, zone,
                                 command) with this one, on purpose; otherwise a conflict exits 78
  CRON_RUNNER_PAUSE_ON_FAILURES  pause the task everywhere after this many consecutive failures
                                 (default 0: never); `cron-runner resume TASK` ends the pause
  CRON_RUNNER_SHUTDOWN_GRACE     after SIGTERM, wait this long before killing the task (default 25s)
  CRON_RUNNER_TASK_MODULES       modules to import so their @task functions register
  CRON_RUNNER_HOLDER, _SCOPE     holder id (default host:pid) and key scope (default 'default')
  CRON_RUNNER_CLUSTER_NAME       the cluster or site, shown before the holder: CLUSTER/HOLDER
  CRON_RUNNER_HISTORY_LENGTH     runs kept in each task's history (default 1000, about 100 B each)
  CRON_RUNNER_LOG_FORMAT, _LEVEL json or text; debug, info, warning, error
  CRON_RUNNER_MODE               run, or enqueue (queue mode; then CRON_RUNNER_QUEUE, _RETRIES_MAX,
                                 _RETRIES_MIN_BACKOFF, _RETRIES_MAX_BACKOFF, _TIME_LIMIT apply)
  CRON_RUNNER_MAX_RUNTIME        a run holding its lease longer is reported (status, watchdog, serve)
  CRON_RUNNER_PING_URL           Healthchecks.io-style pings: URL/start, URL or URL/<exit code>, ?rid=
                                 (each waited for at most CRON_RUNNER_PING_TIMEOUT, default 3s)
  OTEL_EXPORTER_OTLP_ENDPOINT    turns OpenTelemetry on (telemetry extra); delivered at exit within
                                 CRON_RUNNER_TELEMETRY_FLUSH_TIMEOUT (default 3s)
Durations accept 30, 30s, 1m, 500ms, 1h. See docs/configuration.md for the full list.
"""

# Flags that override a CRON_RUNNER_* variable, by the variable's name without the prefix.
SETTING_FLAGS = {
    "REDIS_URL": "Redis URL (no password here: use CRON_RUNNER_REDIS_PASSWORD)",
    "LEASE_TTL": "lease TTL, e.g. 30s",
    "CONNECT_TIMEOUT": "how long to keep trying to reach Redis",
    "SCHEDULE": "cron schedule as Kubernetes reads it, e.g. '*/5 * * * *': gives each run its slot",
    "TIMEZONE": "IANA time zone of the schedule, e.g. Europe/Berlin",
    "SKEW_TOLERANCE": "clock-skew tolerance for schedule slots",
    "SHUTDOWN_GRACE": "wait this long after SIGTERM before killing the task",
    "HOLDER": "holder id shown to other replicas",
    "SCOPE": "key scope (the namespace in a cluster)",
    "LOG_FORMAT": "json or text",
    "LOG_LEVEL": "debug, info, warning or error",
    "MODE": "run (run the task here) or enqueue (send one message per slot to the workers)",
    "OVERLAP": "when an earlier slot still holds the lease: skip (default), buffer-one, "
    "replace or allow-other-slots",
    "OVERLAP_WAIT": "how long buffer-one and replace wait for the holder",
    "CATCHUP": "earlier slots within the window that never ran: none, latest or all",
    "CATCHUP_WINDOW": "how far back to look for slots that never ran, e.g. 3h",
    "PAUSE_ON_FAILURES": "pause the task everywhere after N consecutive failures (0: never)",
}
RUN_FLAGS = ("LEASE_TTL", "CONNECT_TIMEOUT", "SCHEDULE", "TIMEZONE", "SKEW_TOLERANCE",
             "SHUTDOWN_GRACE", "HOLDER", "OVERLAP", "OVERLAP_WAIT", "CATCHUP",
             "CATCHUP_WINDOW", "PAUSE_ON_FAILURES")  # fmt: skip
COMMON_FLAGS = ("REDIS_URL", "SCOPE", "LOG_FORMAT", "LOG_LEVEL")


def _add_setting_flags(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    for name in names:
        parser.add_argument(
            "--" + name.lower().replace("_", "-"),
            dest=FLAG_DEST_PREFIX + name,
            metavar=name.rsplit("_", 1)[-1],
            help=f"{SETTING_FLAGS[name]} [CRON_RUNNER_{name}]",
        )


class _Parser(argparse.ArgumentParser):
    """Usage errors take the same path as every other error: logged, then their exit code."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _add_run(sub: Any) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "run",
        help="run a registered Python task under the lease",
        description="Take the task's lease, run the task, renew while it runs, release when it ends.",
        epilog=EXIT_CODES,
        formatter_class=fmt,
    )
    p.add_argument(
        "task", metavar="TASK", help="a registered task name, or package.module:function"
    )
    p.add_argument(
        "--name",
        help="the lease and slot name (default: the task's): two jobs running one task on "
        "different schedules or arguments need a name each (the chart passes its task key)",
    )
    _add_setting_flags(p, (*RUN_FLAGS, "MODE", *COMMON_FLAGS))
    p.set_defaults(handler=cmd_run)


def _add_exec(sub: Any) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "exec",
        help="run a command under the lease (crontab lines, PHP/Node/Go jobs)",
        description="Run CMD as task NAME: exactly one of the replicas that start it for the same "
        "slot runs it. Example:\n  cron-runner exec --name billing --schedule '0 * * * *' -- php artisan billing",
        epilog=EXIT_CODES,
        formatter_class=fmt,
    )
    p.add_argument("--name", required=True, help="task name: the lease and slot are per name")
    _add_setting_flags(p, (*RUN_FLAGS, *COMMON_FLAGS))
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command")
    p.set_defaults(handler=cmd_exec)


def _add_tasks(sub: Any) -> None:
    p = sub.add_parser(
        "tasks",
        help="list the registered tasks and where each comes from",
        description="List the tasks that `cron-runner run TASK` can run: the @task functions "
        "of the modules in CRON_RUNNER_TASK_MODULES (the working directory is searched too) "
        "and of the installed packages' cron_runner.tasks entry points, each with its source.",
    )
    _add_setting_flags(p, ("LOG_FORMAT", "LOG_LEVEL"))
    p.set_defaults(handler=cmd_tasks)


# The commands a CronJob pod or a crontab line runs: their start is on every run's hot path.
HOT_COMMANDS = ("run", "exec")
_HOT_PARSERS: dict[str, Callable[[Any], None]] = {"run": _add_run, "exec": _add_exec}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """All subcommands, or, for a hot command, only its own: building the other parsers costs
    milliseconds (each argument makes a formatter, each parser looks up translations) that a
    `run` or `exec` never uses."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="cron-runner",
        description="Run a scheduled job once and only once across replicas, clusters and servers, "
        "guarded by a fenced, renewed Redis lease.",
        epilog=EXIT_CODES + "\n" + ENVIRONMENT,
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"cron-runner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    if command in HOT_COMMANDS:
        _HOT_PARSERS[command](sub)
        return parser
    _add_run(sub)
    _add_exec(sub)
    _add_tasks(sub)
    from runner.cli import ops  # noqa: PLC0415 - ops adds its own subcommands

    ops.add_commands(sub, lambda p, names: _add_setting_flags(p, (*names, *COMMON_FLAGS)))
    from runner.cli import queue as queue_cli  # noqa: PLC0415 - worker and dlq; Dramatiq only in handlers

    queue_cli.add_commands(sub, lambda p, names: _add_setting_flags(p, (*names, *COMMON_FLAGS)))
    from runner.cli import manual  # noqa: PLC0415 - trigger and backfill

    manual.add_commands(sub, lambda p, names: _add_setting_flags(p, (*names, *COMMON_FLAGS)))

    p = sub.add_parser(
        "import",
        help="print chart values that run existing CronJobs under the runner, in their own images",
        description="Read CronJob manifests (files, or - for stdin; one or many YAML documents) and "
        "print chart values that reproduce them under the runner: the same image, command, "
        "schedule, time zone, history limits, labels, container name, pod settings and CronJob "
        "name, with the runner injected (runner.inject: initContainer); the header lists what "
        "the chart changes and why. A field the chart cannot carry over exits 78, naming it. "
        "Example:\n  kubectl get cronjob nightly -o yaml | cron-runner import - > values.yaml",
        formatter_class=fmt,
    )
    p.add_argument("files", nargs="*", default=["-"], metavar="FILE", help="manifests (default -)")
    p.add_argument(
        "--entrypoint",
        metavar="CMD",
        help="the image's ENTRYPOINT, for every container without command (a manifest does not "
        "show it), e.g. 'docker-php-entrypoint'",
    )
    p.add_argument(
        "--cmd",
        metavar="CMD",
        help="the image's CMD, for every container without command; its args replace it",
    )
    p.add_argument(
        "--diff",
        action="store_true",
        help="print each original CronJob next to the one the chart renders from the values, "
        "as a unified diff, instead of the values (Helm's engine: the import-diff extra)",
    )
    p.add_argument(
        "--chart",
        metavar="DIR",
        help="the chart --diff renders (default: the one beside the package, in a checkout)",
    )
    _add_setting_flags(p, ("LOG_FORMAT", "LOG_LEVEL"))
    p.set_defaults(handler=cmd_import)

    from runner import serve  # noqa: PLC0415 - the HTTP server and its libraries only in serve

    serve.add_commands(sub, lambda p, names: _add_setting_flags(p, (*names, *COMMON_FLAGS)))
    return parser


#: Far more than the manifests of thousands of CronJobs (a few KiB each).
MAX_IMPORT_CHARS = 32 * 2**20


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    import shlex  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    try:
        from runner.cli import adopt  # noqa: PLC0415 - PyYAML, for this command only
    except ImportError as exc:
        raise ConfigError(
            f"import needs PyYAML: pip install 'redis-cron-runner[import]' ({exc})"
        ) from exc
    docs = []
    for name in args.files:
        try:
            # Bounded: a path such as /dev/zero must not fill the memory.
            if name == "-":
                text = sys.stdin.read(MAX_IMPORT_CHARS + 1)
            else:
                with Path(name).open(encoding="utf-8") as f:
                    text = f.read(MAX_IMPORT_CHARS + 1)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"import: cannot read {name}: {exc}") from exc
        if len(text) > MAX_IMPORT_CHARS:
            raise ConfigError(
                f"import: {name} is longer than {MAX_IMPORT_CHARS // 2**20} MiB: expected "
                "CronJob manifests; import them a namespace or a few at a time"
            )
        docs.extend(adopt.load_documents(text, "stdin" if name == "-" else name))
    if not docs:
        # An empty `kubectl get ... -o yaml` (it failed, or found none) must not print values
        # with no tasks: `helm upgrade` with them would remove every task of the release.
        raise ConfigError(
            f"import: no CronJob in {', '.join(args.files)}: expected one or more CronJob "
            "manifests (batch/v1), or a List of them"
        )
    split: dict[str, list[str]] = {}
    for flag, value in (("--entrypoint", args.entrypoint), ("--cmd", args.cmd)):
        try:
            split[flag] = shlex.split(value or "")
        except ValueError as exc:
            raise ConfigError(
                f"import: {flag}={value!r} is not valid: {exc}; expected words as a shell "
                "reads them, e.g. --cmd 'php artisan schedule:run'"
            ) from exc
    imported = adopt.cronjobs_to_values(docs, entrypoint=split["--entrypoint"], cmd=split["--cmd"])
    for warning in imported.warnings:
        log.warning("import: %s", warning)
    if args.diff:
        from runner.cli import adopt_diff  # noqa: PLC0415

        rendered = adopt_diff.render_cronjobs(imported, Path(args.chart) if args.chart else None)
        cronjobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "CronJob"]
        sys.stdout.write(adopt_diff.diff(cronjobs, rendered))
        return 0
    sys.stdout.write(adopt.render_values(imported, args.files))
    return 0


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from runner.keys import validate_name  # noqa: PLC0415
    from runner.run.targets import PythonTarget  # noqa: PLC0415
    from runner.tasks import Registry, catchup_options, run_options  # noqa: PLC0415

    spec = Registry.discover(settings.run.task_modules).resolve(args.task)
    name = args.name or spec.name
    validate_name("--name", name)
    settings = with_catchup(
        with_task_options(settings, run_options(spec.fn)), catchup_options(spec.fn)
    )
    if settings.run.mode == "enqueue":
        from runner.cli.queue import enqueue_target  # noqa: PLC0415 - queue mode only

        return execute(settings, name, enqueue_target(settings, spec), f"enqueue {spec.name}")
    return execute(settings, name, PythonTarget(spec.fn), f"run {spec.name}")


def with_task_options(settings: Settings, options: RunOptions) -> Settings:
    """The task's own ``@task`` run options, where no flag or variable set them."""
    lease = settings.lease
    return settings._replace(
        lease=lease._replace(
            overlap=lease.overlap or options.overlap,
            overlap_wait_s=lease.overlap_wait_s
            if lease.overlap_wait_s is not None
            else options.overlap_wait_s,
            pause_on_failures=lease.pause_on_failures
            if lease.pause_on_failures is not None
            else options.pause_on_failures,
        )
    )


def with_catchup(settings: Settings, options: CatchupOptions) -> Settings:
    """The task's own ``@task`` catch-up, where no flag or variable set it."""
    s = settings.slots
    window_s = s.catchup_window_s if s.catchup_window_s is not None else options.catchup_window_s
    return settings._replace(
        slots=s._replace(catchup=s.catchup or options.catchup, catchup_window_s=window_s)
    )


def cmd_exec(args: argparse.Namespace, settings: Settings) -> int:
    from runner.keys import validate_name  # noqa: PLC0415
    from runner.run.targets import CommandTarget  # noqa: PLC0415

    argv = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise UsageError(
            "exec: no command given: expected cron-runner exec --name NAME -- CMD ARGS..."
        )
    validate_name("--name", args.name)
    if settings.run.mode == "enqueue":
        raise ConfigError(
            "exec: CRON_RUNNER_MODE=enqueue needs a registered task (cron-runner run TASK): "
            "workers run registered tasks, not commands"
        )
    # This process runs nothing but the command: every other child it gets is the command's.
    target = CommandTarget(argv, adopt_descendants=True)
    return execute(settings, args.name, target, command_definition(argv))


def cmd_tasks(args: argparse.Namespace, settings: Settings) -> int:
    from runner.tasks import Registry  # noqa: PLC0415

    registry = Registry.discover(settings.run.task_modules)
    specs = registry.specs()
    if not specs:
        sys.stdout.write("no tasks registered (set CRON_RUNNER_TASK_MODULES or install a package "
                         "with a cron_runner.tasks entry point)\n")  # fmt: skip
        return 0
    width = max(len(s.name) for s in specs)
    for spec in specs:
        sys.stdout.write(f"{spec.name:<{width}}  {spec.source}\n")
    return 0


def _log_format_asked(argv: Sequence[str]) -> str:
    """--log-format, else CRON_RUNNER_LOG_FORMAT, else text on a terminal and JSON elsewhere."""
    asked = os.environ.get("CRON_RUNNER_LOG_FORMAT", "")
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--log-format" and i + 1 < len(argv):
            asked = argv[i + 1]
        elif arg.startswith("--log-format="):
            asked = arg.partition("=")[2]
    asked = asked.strip().lower()
    if asked in ("json", "text"):
        return asked
    return "text" if sys.stderr is not None and sys.stderr.isatty() else "json"


def _hide_credentials(env: MutableMapping[str, str]) -> None:
    """Settings hold the credentials now: a task, in this process or a child, gets none."""
    kept = task_environment(env)
    for name in [n for n in env if n.startswith("CRON_RUNNER_") and env[n] != kept.get(n)]:
        if name in kept:
            env[name] = kept[name]
        else:
            del env[name]


def _import_redis_without_opentelemetry() -> None:
    """Import redis-py with OpenTelemetry out of its reach, for a run whose telemetry is off.

    redis-py 7.2 and later try ``from opentelemetry.metrics import Meter`` and ``from
    opentelemetry.sdk.metrics import MeterProvider`` at ``import redis``, for their own opt-in
    metrics: with OpenTelemetry installed (our telemetry extra) that is some 60 modules in
    every run. A ``None`` in ``sys.modules`` makes those imports fail as if OpenTelemetry were
    absent, for this one import only: what imports it later (a task, or redis-py when its
    metrics are turned on) gets it as usual. The one flag redis-py keeps from the failed
    import, ``OTEL_AVAILABLE``, which its metrics collector reads before it starts, is set
    back to whether OpenTelemetry is installed, found without importing it. Only the CLI's
    run and exec do this: ``import runner`` in an application changes nothing.
    """
    if "redis" in sys.modules or "opentelemetry" in sys.modules:
        return
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    try:
        import redis  # noqa: F401, PLC0415
    finally:
        del sys.modules["opentelemetry"]
    metrics = sys.modules.get("redis.observability.metrics")
    if metrics is None or getattr(metrics, "OTEL_AVAILABLE", None) is not False:
        return
    import importlib.util  # noqa: PLC0415

    vars(metrics)["OTEL_AVAILABLE"] = importlib.util.find_spec("opentelemetry") is not None


def _freeze_before_exit() -> None:
    """exec's process ends next: move every object out of the cycle collector's reach, so the
    interpreter's teardown does not walk them all again (about half of its cost, some 30 ms of
    each start on the 2-core VM: bench/README.md, Cold start). What teardown does that can be
    seen still happens: atexit handlers, the flush of stdout and stderr, refcount frees. Only
    cyclic garbage goes uncollected, which in exec (no task code in this process) holds no
    unflushed file; the OS reclaims the memory. Called without argv only: main() as the
    process's entry (the console script, ``python -m runner``), never a caller's main(argv).
    """
    gc.freeze()


def _redis_error_exit_code(exc: BaseException) -> int | None:
    """The exit code of an error redis-py raised, else None. redis is imported by then if it
    raised: looked up, not imported, so that commands without Redis do not load it."""
    exceptions = sys.modules.get("redis.exceptions")
    if exceptions is None or not isinstance(exc, exceptions.RedisError):
        return None
    if isinstance(exc, exceptions.InvalidResponse):
        return ConfigError.exit_code
    return StoreUnavailable.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        # The process's entry: before anything opens a file or a socket, which would take a
        # closed standard descriptor (runner/streams.py).
        streams.guard()
    args_list = sys.argv[1:] if argv is None else list(argv)
    try:
        code = _main(args_list)
    except SystemExit as exc:
        if argv is not None or not isinstance(exc.code, int):
            raise
        code = exc.code  # --help, --version: their output is their result too
    finally:
        if argv is None and args_list[:1] == ["exec"]:
            _freeze_before_exit()
    return _output_written(code, args_list) if argv is None else code


def _output_written(code: int, args_list: Sequence[str]) -> int:
    """A command whose output is its result (status, history, check...) and could not write it
    did not succeed. run, exec and worker print nothing of their own: what a task printed and
    lost changes nothing of its run. A reader gone (``| head``) took what it wanted: no news."""
    error = streams.output_error()
    if (
        error is None
        or args_list[:1] in (["run"], ["exec"], ["worker"])
        or error.errno == errno.EPIPE
    ):
        return code
    log.error(
        f"could not write the output to stdout: {error.strerror or error}",
        extra={"event": "output_failed"},
    )
    return code or EXIT_TASK_FAILED


def _main(args_list: list[str]) -> int:
    parser = build_parser(args_list[0] if args_list else None)
    try:
        args = parser.parse_args(args_list)
        setattr(args, OPTIONS_ATTR, setting_options(parser))
        if not getattr(args, "handler", None):
            parser.print_help(sys.stderr)
            return UsageError.exit_code
        flags = setting_flags(args)
        settings = load_settings(os.environ, flags)
        logs.setup(settings.log.format, settings.log.level)
        if url_has_password(flags.get("REDIS_URL") or ""):
            log.warning(
                "--redis-url carries a password, which any user of this host can read in the "
                "process list: set CRON_RUNNER_REDIS_PASSWORD_FILE (or _PASSWORD) instead",
                extra={"event": "password_on_command_line"},
            )
        if not settings.run.share_credentials:
            _hide_credentials(os.environ)
        if args.command in HOT_COMMANDS and not settings.telemetry.enabled:
            _import_redis_without_opentelemetry()
        handler: Callable[[argparse.Namespace, Settings], int] = args.handler
        return handler(args, settings)
    # Every error ends here, with its own exit code (runner.errors): the one mapping.
    except CronRunnerError as exc:
        if not logging.getLogger().handlers:
            # Settings failed, so read the asked-for format as given: a bad cron or duration
            # must still come out as text when --log-format text asked for it.
            logs.setup(_log_format_asked(args_list), "INFO")
        log.error(str(exc), extra={"event": "error", "exit_code": exc.exit_code})
        return exc.exit_code
    except KeyboardInterrupt:
        return Terminated.exit_code
    except Exception as exc:
        # A Redis error no caller expected (a reply that broke the protocol mid-command): a
        # clear line and 69 (78 for bytes that are not Redis at all), never a traceback.
        code = _redis_error_exit_code(exc)
        if code is None:
            raise
        log.error(f"Redis: {exc}", extra={"event": "error", "exit_code": code})
        return code
