"""Operations subcommands: status, history, unlock, forget, redefine, watchdog, ack and check
(pause and resume: runner.cli.pause).

Only the parsers live here: every run of ``cron-runner`` builds them, so each handler imports
what it needs (state.py reads Redis, report.py renders, check.py checks).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from runner import clock
from runner.cli.access import connected, registered
from runner.config.settings import Settings
from runner.config.sources import parse_duration, parse_time
from runner.errors import ConfigError, StoreUnavailable, UnknownTask, UsageError

AddFlags = Callable[[argparse.ArgumentParser, Sequence[str]], None]

log = logging.getLogger("runner")

DEFAULT_TOLERANCE = "10m"
MAX_HISTORY = 100_000
DEFAULT_HEARTBEAT_TTL = "15m"
TOLERANCE_HELP = (
    "how late a scheduled run may finish before its slot counts as missed "
    f"(default {DEFAULT_TOLERANCE}; set it above your longest run plus the pod's start-up)"
)


# (help, description) of the escape hatches.
UNLOCK = (
    "remove a task's lease (admin escape hatch; needs --force)",
    "Remove TASK's lease so that another run can start. The holder, if still running, finds its "
    "lease gone at its next renewal, stops its task and exits 75. Refused without --force. With "
    "--holder, the lease is removed only if that holder (a holder id as `status` shows it, or a "
    "whole token) holds it, checked inside Redis. Logged, and recorded in the task's history.",
)
FORGET = (
    "delete a removed task's state and history, so status and watchdog drop it",
    "Delete TASK's state hash and run history. Its fencing counter stays (a token must never be "
    "handed out twice) and its slot markers expire on their own. Refused without --force, and "
    "while a run holds the lease. Logged.",
)
REDEFINE = (
    "let a task's next scheduled run store a new definition (after a schedule change)",
    "Delete TASK's stored definition (mode, command or task, schedule, time zone), so that the "
    "next scheduled run stores its own. Runners of a definition that differs from the stored "
    "one are refused (exit 78) because one task with two definitions runs twice; after changing "
    "a task's schedule, zone or command everywhere (every cluster's `helm upgrade`, every "
    "server's crontab), run this once. A runner of the old definition still left is refused "
    "from then on. Refused without --force. Logged.",
)


# A bad flag value raises ConfigError itself, not argparse's ArgumentTypeError: argparse would
# turn that into a usage error (64), while a bad value is a configuration error (78) wherever
# it comes from, a flag or a variable.
def _duration(value: str) -> float:
    return parse_duration(value, "--tolerance")


def _heartbeat_ttl(value: str) -> float:
    seconds = parse_duration(value, "--heartbeat-ttl")
    if seconds < 1:
        # A heartbeat that expires as it is written reads as a watchdog that never ran.
        raise ConfigError(
            f"--heartbeat-ttl={value!r} is too small: expected at least 1s, and above the "
            "watchdog's own interval"
        )
    return seconds


def _count(value: str) -> int:
    if not (value.isascii() and value.isdigit() and len(value) <= 9):
        raise ConfigError(
            f"history: -n {value[:30]!r} is not valid: expected a count from 1 to {MAX_HISTORY}"
        )
    return int(value)


def _expected(value: str) -> tuple[str, str, str]:
    """``TASK=SCHEDULE[;TZ]`` from --expect, validated now so a typo exits 78 naming it."""
    from runner.keys import validate_name  # noqa: PLC0415
    from runner.schedule.slots import Schedule  # noqa: PLC0415

    task, sep, rest = value.partition("=")
    schedule, _, timezone = rest.partition(";")
    form = "expected TASK=SCHEDULE[;TZ], e.g. 'report=0 2 * * *;Europe/Berlin'"
    if not sep or not task.strip() or not schedule.strip():
        raise ConfigError(f"--expect {value!r} is not valid: {form}")
    task, schedule, timezone = task.strip(), schedule.strip(), timezone.strip() or "UTC"
    try:
        validate_name("--expect task", task)
        Schedule.parse(schedule, timezone, 0.0)
    except ConfigError as exc:
        raise ConfigError(f"--expect {value!r}: {exc}") from exc
    return task, schedule, timezone


def _max_runtime(value: str) -> tuple[str, float]:
    """``TASK=DURATION`` from --max-runtime."""
    from runner.keys import validate_name  # noqa: PLC0415

    task, sep, duration = value.partition("=")
    form = "expected TASK=DURATION, e.g. 'report=30m'"
    if not sep or not task.strip() or not duration.strip():
        raise argparse.ArgumentTypeError(f"{value!r} is not valid: {form}")
    try:
        validate_name("--max-runtime task", task.strip())
        seconds = parse_duration(duration.strip(), "--max-runtime")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from exc
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: the duration must be above 0; {form}")
    return task.strip(), seconds


def parse_slot(value: str) -> int:
    """A slot, as `status` and the watchdog list them: read as every command reads a time
    (runner.config.sources.parse_time), and whole seconds, as slots are."""
    t_s = parse_time(value, "SLOT")
    if t_s != int(t_s):
        raise ConfigError(
            f"SLOT={value[:60]!r} is not a slot: slots are whole seconds, as `status` lists them"
        )
    return int(t_s)


def _output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=("table", "json"), default="table", help="format")


def add_commands(sub: Any, add_flags: AddFlags) -> None:
    p = sub.add_parser(
        "check",
        help="check configuration, Redis, permissions and eviction policy (used by helm test)",
        description="Parse the configuration; reach Redis and report its latency; run the lease "
        "scripts on scratch keys in the task keyspace (so missing ACL permissions show now, not "
        "in a run); warn on an evicting maxmemory-policy (fail with --strict) and when AOF "
        "persistence is off. Exit 0 when nothing failed, 69 when Redis is unreachable, 78 when "
        "it refuses the credentials or the settings (as a run would), else 1.",
    )
    add_flags(p, ("CONNECT_TIMEOUT", "LEASE_TTL"))
    p.add_argument(
        "--strict", action="store_true", help="fail, not only warn, on an evicting policy"
    )
    p.set_defaults(handler=cmd_check)

    p = sub.add_parser(
        "status",
        help="each task's lease holder, last runs, next slot and whether it is overdue",
        description="Without TASK, every task of the scope that has run or holds a lease.",
    )
    p.add_argument(
        "task",
        nargs="?",
        metavar="TASK",
        help="one task (its --name, or the chart's task key); one never seen: exit 78",
    )
    _output_flag(p)
    p.add_argument("--tolerance", type=_duration, default=DEFAULT_TOLERANCE, help=TOLERANCE_HELP)
    add_flags(p, ("CONNECT_TIMEOUT",))
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser(
        "history", help="a task's recorded runs, newest first", description="From the run stream."
    )
    p.add_argument("task", metavar="TASK", help="the task (its --name, or the chart's task key)")
    p.add_argument("-n", type=_count, default=20, metavar="N", help="how many runs (default 20)")
    _output_flag(p)
    add_flags(p, ("CONNECT_TIMEOUT",))
    p.set_defaults(handler=cmd_history)

    # The escape hatches: each changes a task's keys, each is refused without --force.
    for name, handler, force, text in (
        ("unlock", cmd_unlock, "really remove it", UNLOCK),
        ("forget", cmd_forget, "really delete it", FORGET),
        ("redefine", cmd_redefine, "really delete the stored definition", REDEFINE),
    ):
        p = sub.add_parser(name, help=text[0], description=text[1])
        p.add_argument("task", metavar="TASK")
        p.add_argument("--force", action="store_true", help=force)
        if name == "unlock":
            p.add_argument("--holder", metavar="H", help="only if H holds it")
        add_flags(p, ("CONNECT_TIMEOUT",))
        p.set_defaults(handler=handler)

    p = sub.add_parser(
        "watchdog",
        help="exit 1 naming every task that missed a scheduled run (for a CronJob's alerts)",
        description="For every task of the scope with a schedule in its state (set "
        "CRON_RUNNER_SCHEDULE, as the chart does), judge the fire times since the last watchdog "
        "run by their slot markers and record those that passed with no run in the task's "
        "missed-slot ledger, where they stay until they run or `cron-runner ack` acknowledges "
        "them; list them, and the fire times after the last success that should have run by "
        "now minus the tolerance. Exit 1 if any task has one, or a run holds its lease past "
        "the task's max runtime, else 0. Each run leaves a heartbeat (--heartbeat-ttl). "
        "A task becomes known when it first runs, or when --expect names it: then it is "
        "overdue once a slot after that first expectation is missed, so a CronJob that never "
        "fires is caught too (the chart passes every task). A paused task (`cron-runner "
        "pause`) is not overdue, and the slots its pause skipped are never missed. A task "
        "removed for good stays known until `cron-runner forget TASK --force`.",
    )
    p.add_argument("--tolerance", type=_duration, default=DEFAULT_TOLERANCE, help=TOLERANCE_HELP)
    p.add_argument(
        "--expect",
        action="append",
        default=[],
        type=_expected,
        metavar="TASK=SCHEDULE[;TZ]",
        help="a task that should run on this schedule (time zone default UTC), whether or not "
        "it has run yet; repeat for each, e.g. --expect 'report=0 2 * * *;Europe/Berlin'",
    )
    p.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="TASK",
        help="do not check TASK (e.g. one suspended on purpose); repeat for each",
    )
    p.add_argument(
        "--max-runtime",
        action="append",
        default=[],
        type=_max_runtime,
        metavar="TASK=DURATION",
        help="report TASK when one run holds its lease longer than DURATION (the run's own "
        "CRON_RUNNER_MAX_RUNTIME does the same once it has run); repeat for each",
    )
    p.add_argument(
        "--heartbeat-ttl",
        type=_heartbeat_ttl,
        default=DEFAULT_HEARTBEAT_TTL,
        help="each run leaves a heartbeat that `status` and `serve` report missing after this "
        f"long (default {DEFAULT_HEARTBEAT_TTL}: keep it above the watchdog's own interval)",
    )
    _output_flag(p)
    add_flags(p, ("CONNECT_TIMEOUT",))
    p.set_defaults(handler=cmd_watchdog)

    p = sub.add_parser(
        "ack",
        help="acknowledge a missed slot, so it is no longer reported",
        description="Remove SLOT from TASK's missed-slot ledger, where a slot that passed with no "
        "run stays (reported by status, the watchdog and serve) until it runs or is "
        "acknowledged. SLOT is epoch seconds or an ISO 8601 time with Z or an offset, as status "
        "lists it. Logged, "
        "and recorded in the task's history. Exit 1 if the slot is not in the ledger. --all "
        "acknowledges every slot in it (a task stopped on purpose for a while).",
    )
    p.add_argument("task", metavar="TASK")
    p.add_argument("slot", metavar="SLOT", nargs="?")
    p.add_argument("--all", action="store_true", help="every slot in the ledger")
    p.add_argument("--tolerance", type=_duration, default=DEFAULT_TOLERANCE, help=TOLERANCE_HELP)
    add_flags(p, ("CONNECT_TIMEOUT",))
    p.set_defaults(handler=cmd_ack)

    from runner.cli import pause  # noqa: PLC0415 - pause and resume live in a module of their own

    pause.add_commands(sub, add_flags)


def _write(text: str) -> None:
    sys.stdout.write(text)


def cmd_check(args: argparse.Namespace, settings: Settings) -> int:
    from runner.ops.check import Check  # noqa: PLC0415

    return Check(settings, sys.stdout).run(strict=args.strict)


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    import dataclasses  # noqa: PLC0415

    from runner.keys import validate_name  # noqa: PLC0415
    from runner.ops import report  # noqa: PLC0415
    from runner.ops.state import Reader  # noqa: PLC0415
    from runner.queue import stats as queue  # noqa: PLC0415 - queue mode's counts; no Dramatiq import

    if args.task is not None:
        validate_name("TASK", args.task)
    now_s = clock.wall()
    lease = settings.lease
    with connected(settings, "status") as client:
        reader = Reader(client, lease.prefix, lease.scope)
        names = [args.task] if args.task else reader.tasks()
        statuses = reader.statuses(names, now_s=now_s, tolerance_s=args.tolerance)
        _require_readable(reader.unreadable, args.task)
        if not args.task:
            statuses = [s for s in statuses if s.known]
        queues = queue.status_for(client, settings, args.task)
        if args.task and not (statuses[0].known or queues or registered(settings, args.task)):
            # A typo, or another scope or prefix: an empty "free, never" row would hide both.
            known = ", ".join(reader.tasks()) or "none"
            raise UnknownTask(
                f"status: no task {args.task!r} in scope {lease.scope!r} (key prefix "
                f"{lease.prefix!r}): it has never run there, holds no lease, has no queue and "
                f"is not a registered task; known there: {known} (check the name, "
                "CRON_RUNNER_SCOPE and CRON_RUNNER_KEY_PREFIX)"
            )
        heartbeat = reader.heartbeat()
    if args.output == "json":
        tasks = [report.status_json(s) for s in statuses]
        _write(report.dumps({"scope": lease.scope, "now": report.iso(now_s), "tasks": tasks,
                             "queues": [dataclasses.asdict(q) for q in queues],
                             "watchdog": report.heartbeat_json(heartbeat),
                             "unreadable": reader.unreadable}))  # fmt: skip
        return 0
    if statuses:
        _write(report.status_table(statuses))
        for s in statuses:
            if s.over_max_runtime:
                _write(f"OVER MAX RUNTIME  {report.over_runtime_text(s)}\n")
            if s.paused is not None:
                _write(f"PAUSED  {report.paused_text(s)}\n")
    elif not reader.unreadable:
        _write(f"no tasks in scope {lease.scope!r} (key prefix {lease.prefix!r}) have run yet\n")
    _write("".join(f"UNREADABLE  {t}: {why}\n" for t, why in sorted(reader.unreadable.items())))
    if queues:
        _write("\n" + queue.format_status(queues))
    if not args.task:
        _write("\n" + report.heartbeat_text(heartbeat, now_s))
    return 0


def _require_readable(unreadable: dict[str, str], task: str | None) -> None:
    """A task asked for by name whose records cannot be read: nothing else to show."""
    if task in unreadable:
        raise StoreUnavailable(f"{task}: its records in Redis cannot be read: {unreadable[task]}")


def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    from runner.keys import validate_name  # noqa: PLC0415
    from runner.ops import report  # noqa: PLC0415
    from runner.ops.state import Reader  # noqa: PLC0415

    validate_name("TASK", args.task)
    if not 1 <= args.n <= MAX_HISTORY:
        raise ConfigError(
            f"history: -n {str(args.n)[:30]} is not valid: expected a count from 1 to "
            f"{MAX_HISTORY} (the run stream keeps about 1000 runs)"
        )
    lease = settings.lease
    with connected(settings, "history") as client:
        records = Reader(client, lease.prefix, lease.scope).history(args.task, args.n)
    if args.output == "json":
        runs = [report.record_json(r) for r in records]
        _write(report.dumps({"task": args.task, "scope": lease.scope, "runs": runs}))
    elif records:
        _write(report.history_table(records))
    else:
        _write(f"no runs recorded for task {args.task!r} in scope {lease.scope!r}\n")
    return 0


def _require_force(args: argparse.Namespace, command: str, why: str) -> None:
    """The admin commands act on one named task, and only when told twice (``--force``)."""
    from runner.keys import validate_name  # noqa: PLC0415

    validate_name("TASK", args.task)
    if not args.force:
        raise ConfigError(
            f"{command} {args.task}: refused without --force. {why} "
            f"Look first with `cron-runner status {args.task}`."
        )


def cmd_unlock(args: argparse.Namespace, settings: Settings) -> int:
    from runner.keys import TaskKeys  # noqa: PLC0415
    from runner.lease import journal  # noqa: PLC0415
    from runner.lease.scripts import holder_of, unlock  # noqa: PLC0415
    from runner.ops import report  # noqa: PLC0415

    _require_force(
        args,
        "unlock",
        "Removing a lease lets another run start while its holder may still be running (it "
        "stops at its next renewal, exit 75); --holder H removes it only from H.",
    )
    lease = settings.lease
    keys = TaskKeys(lease.prefix, lease.scope, args.task)
    record = journal.admin_record("unlocked", lease.holder, clock.wall())
    with connected(settings, "unlock") as client:
        result, token = unlock(client, keys, record, holder=args.holder)
    found = report.printable(holder_of(token)) if token else None
    fields = {"task": args.task, "holder": lease.holder, "run_holder": found}
    if result == "unlocked":
        log.warning(
            f"unlocked {args.task}: removed the lease held by {found}",
            extra={"event": "unlock", "outcome": "unlocked", **fields},
        )
        _write(f"unlocked {args.task}: removed the lease held by {found}\n")
        return 0
    if result == "free":
        log.info(f"unlock {args.task}: the lease is free", extra={"event": "unlock", **fields})
        _write(f"{args.task}: the lease is already free; nothing removed\n")
        return 0
    log.warning(
        f"unlock {args.task} refused: held by {found}, not {args.holder}",
        extra={"event": "unlock", "outcome": "refused", **fields},
    )
    _write(f"not unlocked: {args.task} is held by {found}, not {args.holder}\n")
    return 1


def cmd_forget(args: argparse.Namespace, settings: Settings) -> int:
    from runner.lease.scripts import holder_of  # noqa: PLC0415
    from runner.ops import report  # noqa: PLC0415
    from runner.ops.state import Reader  # noqa: PLC0415

    _require_force(args, "forget", "It deletes the task's state and run history for good.")
    lease = settings.lease
    with connected(settings, "forget") as client:
        reader = Reader(client, lease.prefix, lease.scope)
        token = client.get(reader.keys(args.task).lease)
        if token is not None:
            held_by = report.printable(holder_of(token))
            _write(f"not forgotten: {args.task} is running now (held by {held_by})\n")
            return 1
        # The pause lives in the meta hash, which forget keeps: it would go on stopping every
        # run of the name with nothing left in `status` to show why.
        paused_by = client.hmget(reader.keys(args.task).meta, "paused", "paused_by")
        if paused_by[0] == "1":
            _write(f"not forgotten: {args.task} is paused (by "
                   f"{report.printable(paused_by[1] or '?')}); `cron-runner resume "
                   f"{args.task}` first\n")  # fmt: skip
            return 1
        deleted = reader.forget(args.task)
    log.warning(
        f"forgot {args.task}: deleted its state and history",
        extra={"event": "forget", "task": args.task, "holder": lease.holder},
    )
    _write(f"forgot {args.task}: {deleted} key(s) deleted\n" if deleted else
           f"{args.task}: nothing recorded; nothing deleted\n")  # fmt: skip
    return 0


def cmd_redefine(args: argparse.Namespace, settings: Settings) -> int:
    from runner.ops import report  # noqa: PLC0415
    from runner.ops.state import Reader  # noqa: PLC0415

    _require_force(args, "redefine", "The task's next scheduled run stores its definition.")
    lease = settings.lease
    with connected(settings, "redefine") as client:
        meta = Reader(client, lease.prefix, lease.scope).keys(args.task).meta
        stored = client.hget(meta, "definition")
        client.hdel(meta, "definition")
    if stored is None:
        _write(f"{args.task}: no definition stored; its next scheduled run stores one\n")
        return 0
    old = report.printable(stored.decode() if isinstance(stored, bytes) else str(stored))
    log.warning(
        f"redefine {args.task}: deleted the stored definition [{old}]",
        extra={"event": "redefine", "task": args.task, "holder": lease.holder},
    )
    _write(f"{args.task}: deleted the stored definition [{old}]; its next scheduled run "
           "stores its own\n")  # fmt: skip
    return 0


def cmd_watchdog(args: argparse.Namespace, settings: Settings) -> int:
    from runner.keys import validate_name  # noqa: PLC0415
    from runner.ops import report  # noqa: PLC0415
    from runner.ops.state import Heartbeat, Reader  # noqa: PLC0415

    now_s = clock.wall()
    lease = settings.lease
    ignored = {validate_name("--ignore", name) for name in args.ignore}
    with connected(settings, "watchdog") as client:
        reader = Reader(client, lease.prefix, lease.scope)
        for task, schedule, timezone in args.expect:
            reader.expect(task, schedule, timezone, now_s=now_s)
        for task, seconds in args.max_runtime:
            reader.set_max_runtime(task, seconds)
        ignored = set(args.ignore)
        names = [n for n in reader.tasks() if n not in ignored]
        for name in names:
            reader.scan_ledger(name, now_s=now_s, tolerance_s=args.tolerance)
        statuses = [
            s for s in reader.statuses(names, now_s=now_s, tolerance_s=args.tolerance) if s.known
        ]
        overdue = [s for s in statuses if s.overdue]
        too_long = [s for s in statuses if s.over_max_runtime]
        unchecked = [s.task for s in statuses if s.overdue is None]
        reader.beat(
            Heartbeat(
                at=now_s,
                holder=lease.holder,
                ttl_s=args.heartbeat_ttl,
                checked=len(statuses) - len(unchecked),
                overdue=len(overdue),
            )
        )
    for s in overdue:
        assert s.missed is not None
        log.error(
            f"overdue: {report.missed_text(s)}",
            extra={"event": "overdue", "task": s.task, "slot": s.missed.slots[0]},
        )
    for s in too_long:
        log.error(
            f"over max runtime: {report.over_runtime_text(s)}",
            extra={"event": "over_max_runtime", "task": s.task},
        )
    for s in statuses:
        if s.paused is not None:
            log.info(f"paused, not overdue while paused: {report.paused_text(s)}",
                     extra={"event": "paused", "task": s.task})  # fmt: skip
    if args.output == "json":
        _write(report.dumps(report.watchdog_json(statuses, scope=lease.scope, now_s=now_s,
                                                 tolerance_s=args.tolerance)))  # fmt: skip
    else:
        _write(report.watchdog_text(statuses, scope=lease.scope))
    for task, reason in sorted(reader.unreadable.items()):
        log.error(f"unreadable, not judged: {task}: {reason}",
                  extra={"event": "unreadable", "task": task})  # fmt: skip
    return 1 if overdue or too_long or reader.unreadable else 0


def cmd_ack(args: argparse.Namespace, settings: Settings) -> int:
    from runner.keys import validate_name  # noqa: PLC0415
    from runner.lease import journal  # noqa: PLC0415
    from runner.ops import report  # noqa: PLC0415
    from runner.ops.state import Reader  # noqa: PLC0415

    validate_name("TASK", args.task)
    if (args.slot is None) == (not args.all):
        raise UsageError("ack: expected either SLOT or --all, e.g. cron-runner ack report "
                          "2026-01-01T10:00:00Z")  # fmt: skip
    slot_s = None if args.slot is None else parse_slot(args.slot)
    lease = settings.lease
    now_s = clock.wall()
    record = journal.admin_record("acknowledged", lease.holder, now_s)
    with connected(settings, "ack") as client:
        reader = Reader(client, lease.prefix, lease.scope)
        # Judge what passed since the last watchdog first, so a slot `status` lists is here.
        reader.scan_ledger(args.task, now_s=now_s, tolerance_s=args.tolerance)
        if args.all:
            slots = reader.ledger(args.task)
            for one in slots:
                reader.acknowledge(args.task, one, record)
            _write(f"acknowledged {len(slots)} missed slot(s) of {args.task}\n")
            if slots:
                log.warning(
                    f"acknowledged {len(slots)} missed slot(s) of {args.task}",
                    extra={"event": "ack", "task": args.task, "holder": lease.holder},
                )
            return 0
        assert slot_s is not None  # either SLOT or --all, checked above
        removed = reader.acknowledge(args.task, slot_s, record)
        left = [] if removed else reader.ledger(args.task)
    slot = report.iso(slot_s)
    if removed:
        log.warning(
            f"acknowledged {args.task}'s missed slot {slot}",
            extra={"event": "ack", "task": args.task, "slot": slot_s, "holder": lease.holder},
        )
        _write(f"acknowledged: {args.task} slot {slot} ({slot_s}) is no longer reported\n")
        return 0
    listed = ", ".join(f"{report.iso(s)} ({s})" for s in left) or "none"
    _write(f"not acknowledged: slot {slot} ({slot_s}) is not in {args.task}'s missed-slot "
           f"ledger; its missed slots: {listed}\n")  # fmt: skip
    return 1
