"""How status, history and the watchdog show what they read: aligned tables, or JSON.

JSON shapes are stable: times are ISO 8601 UTC strings (``...Z``), slots are epoch seconds
(as in the logs, the keys and the telemetry), durations are milliseconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from runner.ops.pause import PAUSE, RESUME, Pause
from runner.ops.state import Heartbeat, Missed, Result, RunRecord, TaskStatus


def iso(t_s: float | None) -> str | None:
    if t_s is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_s))


def human_duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (ESC, CR, BEL, other controls,
    bidirectional overrides) shown as its escape, so that what another holder wrote into
    Redis cannot rewrite the operator's screen."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [headers, *rows]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in lines
    )


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2) + "\n"


# -- status -----------------------------------------------------------------------------------


def _result_json(result: Result | None) -> dict[str, Any] | None:
    if result is None:
        return None
    return {
        "at": iso(result.at),
        "slot": result.slot,
        "duration_ms": result.duration_ms,
        "outcome": result.outcome,
        "exit_code": result.exit_code,
    }


def missed_json(missed: Missed | None) -> dict[str, Any] | None:
    if missed is None:
        return None
    return {
        "due_slot": missed.due_slot,
        "slots": list(missed.slots),
        "more": missed.more,
        "running_slot": missed.running,
    }


def pause_json(p: Pause | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {"by": p.by, "since": iso(p.at), "until": iso(p.until), "note": p.note}


def status_json(s: TaskStatus) -> dict[str, Any]:
    return {
        "task": s.task,
        "lease": None if s.holder is None else {"holder": s.holder, "ttl_ms": s.ttl_ms},
        "fencing_token": s.fence,
        "schedule": s.schedule,
        "timezone": s.timezone,
        "last_slot": s.last_slot,
        "last_run": None
        if s.last_run_at is None
        else {"at": iso(s.last_run_at), "outcome": s.last_outcome, "holder": s.last_holder},
        "last_success": _result_json(s.last_success),
        "last_failure": _result_json(s.last_failure),
        "next_slot": s.next_slot,
        "overdue": s.overdue,
        "missed": missed_json(s.missed),
        "schedule_error": s.schedule_error,
        "running_since": iso(s.running_since),
        "max_runtime_s": s.max_runtime_s,
        "over_max_runtime": s.over_max_runtime,
        "paused": pause_json(s.paused),
    }


def heartbeat_json(h: Heartbeat | None) -> dict[str, Any] | None:
    if h is None:
        return None
    return {"at": iso(h.at), "holder": h.holder, "ttl_s": h.ttl_s, "checked": h.checked,
            "overdue": h.overdue}  # fmt: skip


def heartbeat_text(h: Heartbeat | None, now_s: float) -> str:
    if h is None:
        return ("watchdog: MISSING: no heartbeat (no `cron-runner watchdog` has run within its "
                "--heartbeat-ttl)\n")  # fmt: skip
    ago = human_duration((now_s - h.at) * 1000)
    return (f"watchdog: last ran {iso(h.at)} ({ago} ago) by {h.holder}: {h.checked} checked, "
            f"{h.overdue} overdue\n")  # fmt: skip


def over_runtime_text(s: TaskStatus) -> str:
    assert s.running_since is not None
    ran = human_duration((s.now_s - s.running_since) * 1000)
    limit = human_duration((s.max_runtime_s or 0) * 1000)
    return f"{s.task}: held by {s.holder} since {iso(s.running_since)} ({ran}, max {limit})"


def pause_text(p: Pause) -> str:
    """'by H since T until U: note', as status, the watchdog and the pause itself say it."""
    until = f"until {iso(p.until)}" if p.until is not None else "until resumed"
    note = f": {p.note}" if p.note else ""
    return printable(f"by {p.by or '?'} since {iso(p.at) or '?'} {until}{note}")


def paused_text(s: TaskStatus) -> str:
    assert s.paused is not None
    return f"{s.task}: {pause_text(s.paused)} (`cron-runner resume {s.task}` resumes it)"


def _when(result: Result | None, *, with_outcome: bool = False) -> str:
    if result is None:
        return "never"
    text = f"{iso(result.at)} ({human_duration(result.duration_ms)})"
    if with_outcome:
        text += f" {result.outcome}"
        if result.exit_code is not None:
            text += f" exit {result.exit_code}"
    return text


def overdue_text(s: TaskStatus) -> str:
    if s.paused is not None:
        missed = s.missed.total if s.missed else 0
        return f"no (paused; {missed} missed before)" if missed else "no (paused)"
    if s.schedule_error:
        return "unknown: bad schedule"
    if s.missed is None:
        return "unknown" if s.schedule is None else "no runs yet"
    m = s.missed
    if not m.slots:
        return "no (running)" if m.running is not None else "no"
    count = f"{m.total}{'+' if m.more else ''}"
    return f"yes: {count} missed since {iso(m.slots[0])}"


def status_table(statuses: Sequence[TaskStatus]) -> str:
    rows = [
        [
            s.task,
            "free"
            if s.holder is None
            else f"{s.holder} ({human_duration(s.ttl_ms)} left)"
            if s.ttl_ms is not None
            else s.holder,
            str(s.fence),
            "-" if s.schedule is None else f"{s.schedule} {s.timezone}",
            iso(s.last_slot) or "-",
            # Who ran last: with CRON_RUNNER_CLUSTER_NAME, the cluster too (CLUSTER/HOLDER).
            s.last_holder or "-",
            _when(s.last_success),
            _when(s.last_failure, with_outcome=True),
            iso(s.next_slot) or "-",
            overdue_text(s),
        ]
        for s in statuses
    ]
    headers = ["TASK", "LEASE", "FENCE", "SCHEDULE", "LAST SLOT", "LAST HOLDER",
               "LAST SUCCESS", "LAST FAILURE", "NEXT SLOT", "OVERDUE"]  # fmt: skip
    return table(headers, rows)


# -- history ----------------------------------------------------------------------------------


def record_json(r: RunRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "started_at": iso(r.started_at),
        "slot": r.slot,
        "holder": r.holder,
        "fencing_token": r.fence,
        "outcome": r.outcome,
        "exit_code": r.exit_code,
        "duration_ms": r.duration_ms,
        "error": r.error,
        "unlocked": r.unlocked,
        "note": r.note,
        "paused_until": iso(r.paused_until),
    }


def _note_text(r: RunRecord) -> str:
    """What the last column shows: the error, or a pause's end and note, or a resume's note."""
    if r.outcome == PAUSE:
        until = f"until {iso(r.paused_until)}" if r.paused_until is not None else "until resumed"
        return until + (f": {r.note}" if r.note else "")
    return r.error or r.note or ""


def history_table(records: Sequence[RunRecord]) -> str:
    rows = [
        [
            iso(r.started_at) or "-",
            iso(r.slot) or ("-" if r.outcome in (PAUSE, RESUME) else "manual"),
            r.holder or "-",
            "-" if r.fence is None else str(r.fence),
            r.outcome or "-" if not r.unlocked else f"unlocked {r.unlocked}",
            "-" if r.exit_code is None else str(r.exit_code),
            human_duration(r.duration_ms),
            _note_text(r)[:80],
        ]
        for r in records
    ]
    headers = ["STARTED", "SLOT", "HOLDER", "FENCE", "OUTCOME", "EXIT", "DURATION", "ERROR/NOTE"]
    return table(headers, rows)


# -- watchdog ---------------------------------------------------------------------------------


def missed_text(s: TaskStatus) -> str:
    assert s.missed is not None
    m = s.missed
    listed = ", ".join(iso(slot) or "" for slot in m.slots)
    more = ", and more" if m.more else ""
    last = _when(s.last_success) if s.last_success else "never"
    return printable(
        f"{s.task} ({s.schedule} {s.timezone}): last success {last}; "
        f"missed {m.total}{'+' if m.more else ''}: {listed}{more}"
    )


def watchdog_json(
    statuses: Sequence[TaskStatus], *, scope: str, now_s: float, tolerance_s: float
) -> dict[str, Any]:
    unchecked = [s.task for s in statuses if s.overdue is None]
    return {
        "scope": scope,
        "now": iso(now_s),
        "tolerance_s": tolerance_s,
        "checked": len(statuses) - len(unchecked),
        "overdue": [
            {
                "task": s.task,
                "schedule": s.schedule,
                "timezone": s.timezone,
                "last_success_at": iso(s.last_success.at) if s.last_success else None,
                "missed": missed_json(s.missed),
            }
            for s in statuses
            if s.overdue
        ],
        "over_max_runtime": [
            {
                "task": s.task,
                "holder": s.holder,
                "running_since": iso(s.running_since),
                "max_runtime_s": s.max_runtime_s,
            }
            for s in statuses
            if s.over_max_runtime
        ],
        "unchecked": unchecked,
        # Not overdue while paused: what they missed before is reported again once resumed.
        "paused": [
            {"task": s.task, **(pause_json(s.paused) or {})}
            for s in statuses
            if s.paused is not None
        ],
    }


def watchdog_text(statuses: Sequence[TaskStatus], *, scope: str) -> str:
    overdue = [s for s in statuses if s.overdue]
    too_long = [s for s in statuses if s.over_max_runtime]
    paused = [s for s in statuses if s.paused is not None]
    unchecked = [s.task for s in statuses if s.overdue is None]
    lines = [f"OVERDUE  {missed_text(s)}\n" for s in overdue]
    lines += [f"OVER MAX RUNTIME  {over_runtime_text(s)}\n" for s in too_long]
    lines += [f"PAUSED  {paused_text(s)}\n" for s in paused]
    summary = f"{len(statuses) - len(unchecked)} tasks checked, {len(overdue)} overdue"
    if too_long:
        summary += f", {len(too_long)} over their max runtime"
    if paused:
        summary += f", {len(paused)} paused (not overdue while paused)"
    if unchecked:
        summary += f"; no schedule recorded for: {', '.join(unchecked)}"
    lines.append(f"{'FAIL' if overdue else 'ok'}  {summary} (scope {scope!r})\n")
    if overdue:
        lines.append(
            "(a task removed on purpose stays known until `cron-runner forget TASK --force`)\n"
        )
    return "".join(lines)
