"""`cron-runner pause` and `resume`: stop a task's runs everywhere its runners share the Redis,
and let them run again (docs/design.md, Pause). The scripts are runner.ops.pause's.

Only the parsers are built on every start (from runner.cli.ops); the handlers import the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from runner import clock
from runner.cli.access import connected, registered
from runner.config.settings import Settings
from runner.config.sources import TIME_FORM, parse_time
from runner.errors import ConfigError, UnknownTask

AddFlags = Callable[[argparse.ArgumentParser, Sequence[str]], None]

log = logging.getLogger("runner")

NOTE_MAX_CHARS = 500


def _note(value: str) -> str:
    # Shown on terminals, pages and in every skipped run's log line: one printable line.
    if len(value) > NOTE_MAX_CHARS or not value.isprintable():
        raise ConfigError(
            f"--note {value[:60]!r} is not valid: expected at most {NOTE_MAX_CHARS} printable "
            "characters on one line"
        )
    return value


def add_commands(sub: Any, add_flags: AddFlags) -> None:
    p = sub.add_parser(
        "pause",
        help="pause a task everywhere: its runs skip (outcome paused, exit 0) until resumed",
        description="Pause TASK for every runner that shares this Redis and scope: CronJob pods "
        "of every cluster, crontab lines, timers and enqueueing runs. Each run of a paused "
        "task skips with outcome paused and exit 0 (the skipped slot is recorded once in its "
        "history, and is not a missed slot for the watchdog); a run already going goes on. "
        "Runners of protocol 2 do not read the pause: they refuse the task (exit 78) until it "
        "is resumed. Pausing a paused task updates its note and end. Recorded in the task's "
        "history; `status` and `serve` show who paused it, since when, until when and why. "
        "A task this scope has never seen is refused (a typo would pause nothing) unless "
        "--force.",
    )
    p.add_argument("task", metavar="TASK", help="the task (its --name, or the chart's task key)")
    p.add_argument("--note", type=_note, default="", metavar="TEXT",
                   help="why: shown by status, history, serve and each skipped run's log line")  # fmt: skip
    p.add_argument(
        "--until",
        metavar="TIME",
        help="end the pause by itself at TIME: ISO 8601 with Z or an offset, e.g. "
        "2026-01-02T06:00:00Z, or epoch seconds (default: until `cron-runner resume`)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="pause a task this scope has never seen (never run, no lease, not a registered "
        "task), e.g. before its first slot",
    )
    add_flags(p, ("CONNECT_TIMEOUT",))
    p.set_defaults(handler=cmd_pause)

    p = sub.add_parser(
        "resume",
        help="resume a paused task: its next slot runs",
        description="End TASK's pause: its next slot runs, everywhere. The task's minimum "
        "protocol goes back to the one before the pause (runners of protocol 2 run it again "
        "where its policy allows), and its count of consecutive failures starts again from "
        "0. A task that is not paused is left as it is (exit 0). Recorded in the task's history.",
    )
    p.add_argument("task", metavar="TASK", help="the task (its --name, or the chart's task key)")
    add_flags(p, ("CONNECT_TIMEOUT",))
    p.set_defaults(handler=cmd_resume)


def _write(text: str) -> None:
    sys.stdout.write(text)


def _check_known(
    client: Any, settings: Settings, task: str, command: str, *, force: bool = False
) -> bool:
    """Whether the task has left anything in Redis (a meta hash, a state hash or a lease); a
    name that has not, and is not a registered task either, is refused (unless ``force``),
    naming the known ones. Returns whether its state hash exists (it has run, or is expected).
    """
    from runner.keys import TaskKeys  # noqa: PLC0415
    from runner.ops.state import Reader  # noqa: PLC0415

    lease = settings.lease
    keys = TaskKeys(lease.prefix, lease.scope, task)
    pipe = client.pipeline(transaction=False)
    for key in (keys.meta, keys.state, keys.lease):
        pipe.exists(key)
    meta, state, held = (bool(n) for n in pipe.execute())
    if force or meta or state or held or registered(settings, task):
        return state
    known = ", ".join(Reader(client, lease.prefix, lease.scope).tasks()) or "none"
    hint = " (or --force to pause it before its first run)" if command == "pause" else ""
    raise UnknownTask(
        f"{command}: no task {task!r} in scope {lease.scope!r} (key prefix {lease.prefix!r}): "
        f"it has never run there, holds no lease and is not a registered task; known there: "
        f"{known}. Check the name, CRON_RUNNER_SCOPE and CRON_RUNNER_KEY_PREFIX{hint}"
    )


def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    from redis.exceptions import NoPermissionError  # noqa: PLC0415

    from runner.keys import TaskKeys, validate_name  # noqa: PLC0415
    from runner.ops import report  # noqa: PLC0415
    from runner.ops.pause import Pause, pause  # noqa: PLC0415

    validate_name("TASK", args.task)
    now_s = clock.wall()
    until_s = None if args.until is None else parse_time(args.until, "--until")
    if until_s is not None and until_s <= now_s:
        raise ConfigError(
            f"--until={args.until[:60]!r} ({report.iso(until_s)}) is in the past (now "
            f"{report.iso(now_s)}): expected a time to come, {TIME_FORM.removeprefix('expected ')}"
        )
    lease = settings.lease
    keys = TaskKeys(lease.prefix, lease.scope, args.task)
    with connected(settings, "pause") as client:
        ran = _check_known(client, settings, args.task, "pause", force=args.force)
        done = pause(client, keys, by=lease.holder, at_s=now_s, note=args.note, until_s=until_s,
                     runs_maxlen=lease.history_length)  # fmt: skip
        # `status` lists it before its first run too; an ACL without +sadd has +scan.
        with contextlib.suppress(NoPermissionError):
            client.sadd(keys.index, args.task)
    text = report.pause_text(Pause(by=lease.holder, at=done.since, until=until_s, note=args.note))
    fields = {"task": args.task, "holder": lease.holder, "note": args.note,
              "until": report.iso(until_s)}  # fmt: skip
    if done.updated:
        log.warning(f"pause of {args.task} updated: {text}", extra={"event": "pause", **fields})
        _write(f"{args.task} was paused already: updated, now paused {text}\n")
    else:
        log.warning(f"paused {args.task}: {text}", extra={"event": "pause", **fields})
        _write(
            f"paused {args.task} {text}: each of its runs now skips (outcome paused, exit 0) "
            f"and runners of protocol 2 refuse it (exit 78) until `cron-runner resume "
            f"{args.task}`\n"
        )
    if ran and not done.protocol:
        _write(
            f"warning: no runner of protocol 2 or later has run {args.task} here: runners of "
            "b170e33 and before do not read a pause, and run it all the same\n"
        )
    return 0


def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    from runner.keys import TaskKeys, validate_name  # noqa: PLC0415
    from runner.ops import report  # noqa: PLC0415
    from runner.ops.pause import resume  # noqa: PLC0415

    validate_name("TASK", args.task)
    lease = settings.lease
    keys = TaskKeys(lease.prefix, lease.scope, args.task)
    with connected(settings, "resume") as client:
        _check_known(client, settings, args.task, "resume")
        done = resume(client, keys, by=lease.holder, at_s=clock.wall(),
                      runs_maxlen=lease.history_length)  # fmt: skip
    if done.pause is None:
        log.info(f"resume {args.task}: not paused", extra={"event": "resume", "task": args.task,
                                                             "holder": lease.holder})  # fmt: skip
        _write(f"{args.task} is not paused: it runs; nothing to do\n")
        return 0
    was = report.pause_text(done.pause)
    minimum = f"; its minimum protocol is {done.protocol_min}" if done.protocol_min else ""
    log.warning(
        f"resumed {args.task} (was paused {was})",
        extra={"event": "resume", "task": args.task, "holder": lease.holder},
    )
    if done.ended:
        _write(f"{args.task}'s pause had ended by itself at {report.iso(done.pause.until)} (it "
               f"was paused {was}); cleared{minimum}\n")  # fmt: skip
    else:
        _write(f"resumed {args.task}: its next slot runs (it was paused {was}){minimum}\n")
    return 0
