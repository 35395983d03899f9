"""Runs an operator asks for: ``trigger`` (one run now, outside the schedule) and ``backfill``
(each slot of a past range that never ran); docs/design.md, Catch-up, trigger and backfill.

Both take a registered task (``TASK``, as ``run``) or a command (``--name NAME -- CMD...``, as
``exec``), and run under the task's lease as its scheduled runs do. Only the parsers live here:
every run of ``cron-runner`` but ``run`` and ``exec`` builds them, so each handler imports what
it needs (runner.run.backfill runs the slots).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from runner.config.settings import Settings
from runner.config.sources import TIME_FORM, parse_time
from runner.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from runner.run.targets import Target

AddFlags = Callable[[argparse.ArgumentParser, Sequence[str]], None]

log = logging.getLogger("runner")

#: The most slots one backfill runs: each is a run of its own, with its own acquire.
MAX_BACKFILL_SLOTS: Final = 10_000

TRIGGER_EXIT_CODES: Final = """exit codes: as `run` and `exec` (cron-runner --help); a trigger that
finds the lease held skips (0) as a run of the task would.
"""
BACKFILL_EXIT_CODES: Final = """exit codes:
  0    every slot of the range ran, or had already run (skipped)
  N    otherwise the first failed slot's code: the task's own (exec passes the command's
       through; 1 for a Python task that raised), 75 if its lease was lost; the slots after a
       failure still run
  64   usage error: the command line is wrong
  69   Redis unreachable within the connect deadline: the backfill stopped there
  75   the lease stayed held by another run past --wait, or the task is paused: the backfill
       stopped there; run it again later (slots already run are skipped)
  78   configuration error: --to before --from, a time without Z or an offset, more than
       10,000 slots, a range older than the slot markers are kept (without --force), no
       schedule, another definition of the task in Redis
  143  stopped by a signal: the slot running was stopped and released, the rest not run
"""


def add_commands(sub: Any, add_flags: AddFlags) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "trigger",
        usage="%(prog)s [options] TASK\n       %(prog)s --name NAME [options] -- CMD ARGS...",
        help="run a task once now, outside its schedule, under its lease",
        description="Run TASK (a registered task, as `run`) or CMD (as `exec`, with --name) once "
        "now, under the task's lease, as a manual run: no slot, recorded in its history with "
        "the field trigger. A run that holds the lease is not interrupted: the trigger skips as "
        "a run of the task would. In queue mode (CRON_RUNNER_MODE=enqueue) it enqueues one "
        "message. Examples:\n  cron-runner trigger billing\n"
        "  cron-runner trigger --name billing -- php artisan billing",
        epilog=TRIGGER_EXIT_CODES,
        formatter_class=fmt,
    )
    _task_or_command(p)
    add_flags(p, ("LEASE_TTL", "CONNECT_TIMEOUT", "SHUTDOWN_GRACE", "HOLDER", "MODE"))
    p.set_defaults(handler=cmd_trigger)

    p = sub.add_parser(
        "backfill",
        usage="%(prog)s [options] TASK --from T1 --to T2\n       %(prog)s --name NAME "
        "--schedule CRON [options] --from T1 --to T2 -- CMD ARGS...",
        help="run each slot of a past range that never ran, oldest first",
        description="Run every slot of the task's schedule from --from to --to (both included) "
        "that has no slot marker, once, oldest first: each slot is a run of its own (acquire, "
        "task, complete), under the task's lease. Slots already run are skipped and counted, "
        "so a backfill repeated over the same range runs nothing. A run that holds the lease "
        "is waited for (--wait), not skipped. A backfilled slot is recorded in the history "
        "(with the field backfill) but leaves the task's state, its latest slot's, as it is. "
        "In queue mode (CRON_RUNNER_MODE=enqueue) each slot's message is enqueued, and a worker "
        "runs each slot once, waiting for its turn while another slot holds the lease. The last "
        "line says how many slots ran (in queue mode: were sent), were skipped and failed. "
        "Examples:\n"
        "  cron-runner backfill billing --from 2026-01-01T00:00:00Z --to 2026-01-02T00:00:00Z\n"
        "  cron-runner backfill --name billing --schedule '0 * * * *' --from 1767225600 \\\n"
        "      --to 1767312000 -- php artisan billing",
        epilog=BACKFILL_EXIT_CODES,
        formatter_class=fmt,
    )
    _task_or_command(p)
    p.add_argument("--from", dest="start", required=True, metavar="T1", help=f"{TIME_FORM}")
    p.add_argument("--to", dest="end", required=True, metavar="T2", help="as --from, not before it")
    p.add_argument(
        "--force",
        action="store_true",
        help="also run slots older than the slot markers are kept: such a slot may have run "
        "and its marker expired, so it may run twice",
    )
    p.add_argument(
        "--wait",
        metavar="DURATION",
        help="how long to wait for a lease held by another run, per slot (default: the "
        "schedule's shortest gap)",
    )
    add_flags(p, ("LEASE_TTL", "CONNECT_TIMEOUT", "SCHEDULE", "TIMEZONE", "SHUTDOWN_GRACE",
                  "HOLDER", "MODE"))  # fmt: skip
    p.set_defaults(handler=cmd_backfill)


def _task_or_command(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "task", nargs="?", metavar="TASK", help="a registered task name, or package.module:function"
    )
    p.add_argument(
        "--name",
        help="the task name: the lease and slots are per name (with TASK, as `run --name`; with "
        "a command, required)",
    )
    # What follows the first '--' is the command, whatever it holds: argparse alone would take
    # its first word for TASK, and could not tell `TASK --name N` from `--name N -- CMD`.
    parse = p.parse_known_args

    def split(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        command = None
        if "--" in words:
            at = words.index("--")
            words, command = words[:at], words[at + 1 :]
        parsed, extra = parse(words, namespace)
        parsed.command = command
        return parsed, extra

    p.parse_known_args = split  # type: ignore[method-assign,assignment]


def _target(args: argparse.Namespace, settings: Settings, verb: str) -> tuple[str, Target, str]:
    """The task's name, what runs it (started again for each slot of a backfill), and what the
    runs are (their definition)."""
    from runner.keys import validate_name  # noqa: PLC0415

    argv: list[str] | None = args.command
    if argv is not None:
        if args.task is not None:
            raise UsageError(f"{verb}: give TASK or -- CMD ARGS, not both")
        if not argv or not args.name:
            raise UsageError(
                f"{verb}: a command needs --name and the command after --: expected "
                f"cron-runner {verb} --name NAME ... -- CMD ARGS..."
            )
        validate_name("--name", args.name)
        if settings.run.mode == "enqueue":
            raise ConfigError(
                f"{verb}: CRON_RUNNER_MODE=enqueue needs a registered task (cron-runner {verb} "
                "TASK): workers run registered tasks, not commands"
            )
        from runner.cli.launch import command_definition  # noqa: PLC0415
        from runner.run.targets import CommandTarget  # noqa: PLC0415

        target = CommandTarget(argv, adopt_descendants=True)
        return args.name, target, command_definition(argv)
    if args.task is None:
        raise UsageError(f"{verb}: expected TASK, or --name NAME -- CMD ARGS...")
    from runner.tasks import Registry  # noqa: PLC0415

    spec = Registry.discover(settings.run.task_modules).resolve(args.task)
    name = args.name or spec.name
    validate_name("--name", name)
    if settings.run.mode == "enqueue":
        from runner.cli.queue import enqueue_target  # noqa: PLC0415 - queue mode only

        sender = enqueue_target(settings, spec)
        # Each backfilled slot was asked for: a worker waits for its turn, never skips it.
        sender.wait_turn = verb == "backfill"
        return name, sender, f"enqueue {spec.name}"
    from runner.run.targets import PythonTarget  # noqa: PLC0415

    return name, PythonTarget(spec.fn), f"run {spec.name}"


def cmd_trigger(args: argparse.Namespace, settings: Settings) -> int:
    from runner.cli.launch import execute  # noqa: PLC0415
    from runner.run.execution import Asked  # noqa: PLC0415

    name, target, what = _target(args, settings, "trigger")
    return execute(settings, name, target, what, asked=Asked(None))


def backfill_slots(args: argparse.Namespace, settings: Settings, now_s: float) -> list[int]:
    """The slots of the range, oldest first, or ConfigError naming the flag that is wrong."""
    from runner.schedule.jobname import utc  # noqa: PLC0415
    from runner.schedule.markers import retention_s  # noqa: PLC0415
    from runner.schedule.slots import Schedule  # noqa: PLC0415

    start_s, end_s = parse_time(args.start, "--from"), parse_time(args.end, "--to")
    if end_s < start_s:
        raise ConfigError(
            f"--to {utc(end_s)} is before --from {utc(start_s)}: expected --from T1 --to T2 "
            "with T1 at or before T2"
        )
    s = settings.slots
    if not s.schedule:
        raise ConfigError(
            "backfill needs the task's schedule: --schedule CRON (CRON_RUNNER_SCHEDULE), and "
            "--timezone TZ (CRON_RUNNER_TIMEZONE) when it is not UTC"
        )
    try:
        schedule = Schedule.parse(s.schedule, s.timezone, 0.0)
    except ConfigError as exc:
        raise ConfigError(f"--schedule (CRON_RUNNER_SCHEDULE): {exc}") from exc
    if end_s > now_s + s.skew_tolerance_s:
        raise ConfigError(
            f"--to {utc(end_s)} is after now ({utc(now_s)}): a slot not yet due is the "
            "schedule's to run"
        )
    slots = schedule.fire_times(start_s, end_s, limit=MAX_BACKFILL_SLOTS + 1)
    if len(slots) > MAX_BACKFILL_SLOTS:
        raise ConfigError(
            f"--from {utc(start_s)} --to {utc(end_s)} holds more than {MAX_BACKFILL_SLOTS} "
            f"slots of {s.schedule!r}: expected at most {MAX_BACKFILL_SLOTS}; split the range"
        )
    keep_s = retention_s(settings)
    if slots and slots[0] < now_s - keep_s and not args.force:
        raise ConfigError(
            f"--from {utc(start_s)}: the slots before {utc(now_s - keep_s)} cannot be proven "
            f"unrun: a marker may have expired (slot markers are kept {keep_s:g}s: "
            "CRON_RUNNER_SLOT_RETENTION, else twice the schedule's longest gap); --force runs "
            "such slots"
        )
    return slots


def cmd_backfill(args: argparse.Namespace, settings: Settings) -> int:
    from runner import clock  # noqa: PLC0415
    from runner.config.sources import parse_duration  # noqa: PLC0415
    from runner.lease import store  # noqa: PLC0415
    from runner.run.backfill import Backfill  # noqa: PLC0415
    from runner.schedule.slots import Schedule  # noqa: PLC0415
    from runner.signals import Shutdown  # noqa: PLC0415

    name, target, what = _target(args, settings, "backfill")
    slots = backfill_slots(args, settings, clock.wall())
    wait_s = (
        parse_duration(args.wait, "--wait")
        if args.wait is not None
        else Schedule.parse(settings.slots.schedule or "", settings.slots.timezone, 0.0).min_gap_s
    )
    shutdown = Shutdown().install()
    client = store.connect(settings.redis, settings.lease.ttl_s)
    try:
        tally = Backfill(settings, client, name, target, shutdown, what=what, wait_s=wait_s).run(
            slots
        )
    finally:
        client.close()
    line = tally.line(name, len(slots))
    log.log(
        logging.INFO if tally.exit_code == 0 else logging.ERROR,
        line,
        extra={"event": "backfill", "task": name, "slots": len(slots), "ran": tally.ran,
               "sent": tally.sent,
               "skipped": tally.skipped, "failed": tally.failed, "exit_code": tally.exit_code},
    )  # fmt: skip
    sys.stdout.write(line + "\n")
    return tally.exit_code
