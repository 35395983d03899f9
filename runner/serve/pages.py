"""The status page and the task pages: server-rendered HTML, no JavaScript.

Jinja2 escapes every value (autoescape on for all templates): task names, holders and errors
come from Redis and whoever wrote it, so none of them can add markup to the page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jinja2

from runner.ops.pause import PAUSE
from runner.ops.report import human_duration
from runner.ops.state import Result, RunRecord, TaskStatus
from runner.serve.snapshot import FAILURES, Snapshot, TaskRuns, strip_of

HISTORY = 50


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )


@lru_cache(maxsize=256)
def _zone(name: str | None) -> ZoneInfo | None:
    if not name or name == "UTC":
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


@dataclass(frozen=True)
class When:
    utc: str
    local: str


def when(t_s: float | None, zone_name: str | None) -> When:
    """A time in UTC, and in the task's zone when it has one other than UTC."""
    if t_s is None:
        return When("-", "")
    utc = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t_s))
    zone = _zone(zone_name)
    if zone is None:
        return When(utc, "")
    local = datetime.fromtimestamp(t_s, UTC).astimezone(zone)
    return When(utc, f"{local:%Y-%m-%d %H:%M:%S %Z} ({zone_name})")


def states(s: TaskStatus) -> list[tuple[str, str]]:
    """What a person reads first: (css class, label)."""
    out: list[tuple[str, str]] = []
    if s.paused is not None:
        out.append(("paused", f"paused by {s.paused.by or '?'}"))
    if s.holder is not None:
        out.append(("running", f"running on {s.holder}"))
    if s.over_max_runtime:
        out.append(("over-max-runtime", "over max runtime"))
    if s.overdue:
        assert s.missed is not None
        out.append(("overdue", f"overdue: {s.missed.total}{'+' if s.missed.more else ''} missed"))
    if s.last_outcome in FAILURES:
        out.append(("failing", f"failing: {s.last_outcome}"))
    if s.schedule_error:
        out.append(("unknown", "bad schedule"))
    elif s.overdue is None and not out:
        out.append(("unknown", "not checked: no schedule" if not s.schedule else "no runs yet"))
    if not out:
        out.append(("ok", "ok"))
    return out


def _result(r: Result | None, zone: str | None) -> str:
    if r is None:
        return "never"
    w = when(r.at, zone)
    text = f"{w.utc} ({human_duration(r.duration_ms)})"
    if r.outcome != "ran":
        text += f" {r.outcome} exit {r.exit_code}"
    return text


def _pause_view(s: TaskStatus) -> dict[str, Any] | None:
    p = s.paused
    if p is None:
        return None
    return {"by": p.by or "?", "since": when(p.at, s.timezone),
            "until": when(p.until, s.timezone) if p.until is not None else None,
            "note": p.note}  # fmt: skip


def task_view(s: TaskStatus, runs: TaskRuns | None, now_s: float) -> dict[str, Any]:
    zone = s.timezone
    last = None
    if s.last_run_at is not None:
        last = {"outcome": s.last_outcome or "-", "holder": s.last_holder or "-",
                "at": when(s.last_run_at, zone).utc}  # fmt: skip
    missed = s.missed.slots if s.missed else ()
    return {
        "name": s.task,
        "url": "/tasks/" + quote(s.task, safe=""),
        "schedule": s.schedule,
        "timezone": zone,
        "states": states(s),
        "next_slot": when(s.next_slot, zone),
        "last": last,
        "strip": strip_of(runs, s),
        "holder": s.holder,
        "running_since": when(s.running_since, zone) if s.running_since else None,
        "running_for": human_duration((now_s - s.running_since) * 1000) if s.running_since else "",
        "max_runtime": human_duration(s.max_runtime_s * 1000) if s.max_runtime_s else None,
        "fence": s.fence,
        "last_success": _result(s.last_success, zone),
        "last_failure": _result(s.last_failure, zone),
        "missed": [{"slot": m, **vars(when(m, zone))} for m in missed],
        "missed_more": bool(s.missed and s.missed.more),
        "paused": _pause_view(s),
    }


def _record_view(r: RunRecord, zone: str | None) -> dict[str, Any]:
    return {
        "started": when(r.started_at, zone),
        "slot": when(r.slot, zone) if r.slot is not None else When("manual", ""),
        "holder": r.holder or "-",
        "fence": "-" if r.fence is None else r.fence,
        "outcome": f"unlocked {r.unlocked}" if r.unlocked else (r.outcome or "-"),
        "exit_code": "-" if r.exit_code is None else r.exit_code,
        "duration": human_duration(r.duration_ms),
        "error": (r.error or _note(r))[:300],
    }


def _note(r: RunRecord) -> str:
    """A pause's end and note, or a resume's note, where a run's error would be."""
    if r.outcome == PAUSE:
        until = f"until {when(r.paused_until, None).utc}" if r.paused_until else "until resumed"
        return until + (f": {r.note}" if r.note else "")
    return r.note or ""


def _common(snap: Snapshot, scope: str) -> dict[str, Any]:
    return {"scope": scope, "now": when(snap.now_s, None).utc}


def index(snap: Snapshot, scope: str, redis: str) -> str:
    hb = snap.heartbeat
    heartbeat = None
    if hb is not None:
        heartbeat = {"at": when(hb.at, None).utc, "holder": hb.holder, "checked": hb.checked,
                     "overdue": hb.overdue}  # fmt: skip
    return (
        _env()
        .get_template("index.html")
        .render(
            **_common(snap, scope),
            redis=redis,
            read_ms=f"{snap.read_s * 1000:.0f}",
            heartbeat=heartbeat,
            tasks=[task_view(s, snap.runs.get(s.task), snap.now_s) for s in snap.tasks],
            queues=snap.queues,
        )
    )


def task_page(snap: Snapshot, scope: str, status: TaskStatus, history: list[RunRecord]) -> str:
    return (
        _env()
        .get_template("task.html")
        .render(
            **_common(snap, scope),
            t=task_view(status, snap.runs.get(status.task), snap.now_s),
            history=[_record_view(r, status.timezone) for r in history],
        )
    )


def error_page(title: str, message: str) -> str:
    return _env().get_template("error.html").render(title=title, message=message)
