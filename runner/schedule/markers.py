"""A run's slot and how long its slot marker is kept, from the settings (docs/design.md,
CronJob slots): :func:`resolve_slot` picks the Job name's slot or the schedule's for a run,
:func:`retention_s` is how long a slot marker is kept, and :func:`stale_slot_reason` refuses a
CronJob slot older than that. The schedule arithmetic itself is runner.schedule.slots', which
the settings use to check a schedule: it does not know them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from runner.errors import ConfigError
from runner.schedule.jobname import cronjob_slot, utc
from runner.schedule.slots import Schedule, every_retention_s

if TYPE_CHECKING:
    from runner.config.settings import Settings, SlotSettings
    from runner.logs import RunLogger

ONE_HOUR_S: Final = 3600.0
#: The marker retention when the schedule cannot be read (only ever with a Job name).
FALLBACK_RETENTION_S: Final = 7 * 24 * ONE_HOUR_S


def resolve_slot(settings: Settings, now_s: float) -> int | None:
    """The run's slot: the CronJob's (Job name, scheduled-timestamp annotation), else the
    schedule's at ``now_s``, else None (a manual run). A CronJob slot later than now plus the
    skew tolerance is refused: running it would mark a slot done before its time."""
    s = settings.slots
    if s.job_name or s.scheduled_at_s is not None:
        slot = cronjob_slot(s.job_name, s.cronjob_name, s.scheduled_at_s)
        if slot is not None and slot > now_s + s.skew_tolerance_s:
            raise ConfigError(
                f"{_slot_origin(s.job_name, s.scheduled_at_s)} names the slot {utc(slot)}, "
                f"later than now ({utc(now_s)}) plus the skew tolerance "
                f"({s.skew_tolerance_s:g}s): not run, nothing written. Expected the CronJob "
                "controller's Job name <cronjob>-<scheduled minute since the epoch>"
            )
        return slot
    if s.schedule:
        return Schedule.parse(s.schedule, s.timezone, s.skew_tolerance_s).slot_for(now_s)
    return None


def _slot_origin(job_name: str | None, scheduled_at_s: float | None) -> str:
    if job_name:
        return f"CRON_RUNNER_JOB_NAME={job_name!r}"
    return f"CRON_RUNNER_SCHEDULED_TIMESTAMP ({utc(scheduled_at_s or 0.0)})"


def stale_slot_reason(settings: Settings, slot: int | None, now_s: float) -> str | None:
    """Why a CronJob slot is too old to run, or None. Past its marker's retention, the marker
    of a run that did happen may have expired: the slot cannot be proven unrun."""
    s = settings.slots
    if slot is None or not (s.job_name or s.scheduled_at_s is not None):
        return None
    age_s = now_s - slot
    explicit = settings.lease.slot_retention_s
    # A computed retention is never below an hour: younger slots need no schedule parsing,
    # so a CronJob pod's start stays free of the schedule machinery.
    if age_s <= (explicit if explicit is not None else ONE_HOUR_S):
        return None
    keep_s = retention_s(settings)
    if age_s <= keep_s:
        return None
    return (
        f"slot {utc(slot)} is {age_s:.0f}s old, older than its marker's retention "
        f"({keep_s:g}s): a run of it may have happened and its marker expired, so it is not run"
    )


def catchup_retention_s(s: SlotSettings, schedule: Schedule) -> float:
    """How long slot markers must be kept for catch-up to prove a slot of its window unrun (0
    when the task does not catch up; docs/design.md, Catch-up, trigger and backfill).

    A run looks back over the window from its own slot, and starts before the next slot: its
    oldest candidate is at most the window plus the longest gap old. The marker of a run of that
    slot was written at or after the slot, by a clock up to the skew tolerance ahead, and is
    read by one up to the tolerance behind: hence the two tolerances.
    """
    if not s.catches_up:
        return 0.0
    return (s.catchup_window_s or 0.0) + schedule.max_gap_s + 2 * s.skew_tolerance_s


def retention_s(settings: Settings, log: RunLogger | None = None) -> float:
    """How long a slot marker is kept: CRON_RUNNER_SLOT_RETENTION, else the schedule's
    (twice its longest gap, at least an hour, and what the catch-up window needs), else a day
    for a Job-name slot without one."""
    if settings.lease.slot_retention_s is not None:
        return settings.lease.slot_retention_s
    s = settings.slots
    if s.schedule:
        # With a Job name the tolerance plays no part (and was not checked at start).
        tolerance_s = 0.0 if s.job_name else s.skew_tolerance_s
        try:
            schedule = Schedule.parse(s.schedule, s.timezone, tolerance_s)
            return max(schedule.retention_s, catchup_retention_s(s, schedule))
        except ConfigError as exc:
            # Only with a Job name (else the schedule was checked at start). Kubernetes'
            # `@every 1h` has no slots we can compute, but a delay: twice it, as for a gap.
            every_s = every_retention_s(s.schedule)
            if every_s is not None:
                return every_s
            # Anything else the runner cannot read: the task has run, so keep the marker long
            # rather than fail the run and leave its lease to expire.
            if log is not None:
                log.warning(
                    f"CRON_RUNNER_SCHEDULE: {exc}; slot markers are kept {FALLBACK_RETENTION_S:g}s",
                    extra={"event": "retention_fallback"},
                )
            return FALLBACK_RETENTION_S
    # A Job-name slot without a schedule: a day covers any CronJob retry window.
    return 24 * ONE_HOUR_S
