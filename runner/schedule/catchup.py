"""Catch-up: which earlier slots of its schedule a run may run late, and the checks of its
settings (docs/design.md, Catch-up, trigger and backfill).

A run that catches up (CRON_RUNNER_CATCHUP latest or all) hands the acquire script the slot
markers of its window, [own slot - CRON_RUNNER_CATCHUP_WINDOW, own slot); the script answers
which of them never ran. ``latest`` then runs the newest of those, ``all`` every one of them,
oldest first, before the run's own slot, all under the one lease (runner.run.execution).

Pure: no Redis, no clock reads. Imported only by a run that catches up, and by the checks: the
schedule parser stays off the start of a CronJob pod that does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from runner.config.settings import ALLOW_OTHER_SLOTS, CATCHUP_NONE
from runner.errors import ConfigError
from runner.schedule.markers import catchup_retention_s, retention_s
from runner.schedule.slots import Schedule

if TYPE_CHECKING:
    from runner.config.settings import Settings

LATEST: Final = "latest"
ALL: Final = "all"
#: The most slots a window may hold: each is one more key the acquire script reads.
MAX_WINDOW_SLOTS: Final = 1000

WINDOW: Final = "CRON_RUNNER_CATCHUP_WINDOW (--catchup-window, @task(catchup_window=))"


def _catchup_is(value: str | None) -> str:
    return f"CRON_RUNNER_CATCHUP={value} (--catchup, @task(catchup=))"


def _window_is(window_s: float) -> str:
    return f"CRON_RUNNER_CATCHUP_WINDOW={window_s:.0f}s (--catchup-window, @task(catchup_window=))"


def schedule_of(settings: Settings) -> Schedule:
    """The schedule the run's slots come from. A Job-name run reads it with no tolerance, as
    the controller fires it (the tolerance was not checked against it)."""
    s = settings.slots
    assert s.schedule is not None
    tolerance_s = 0.0 if (s.job_name or s.scheduled_at_s is not None) else s.skew_tolerance_s
    return Schedule.parse(s.schedule, s.timezone, tolerance_s)


def check_catchup(settings: Settings, overlap: str) -> None:
    """Refuse (ConfigError, exit 78) a catch-up that cannot keep its promise, naming the setting:
    latest or all with no window, no schedule to take slots from, a window holding more than
    MAX_WINDOW_SLOTS slots or more than an explicit CRON_RUNNER_SLOT_RETENTION keeps markers,
    and the overlap policy allow-other-slots."""
    s = settings.slots
    if not s.catches_up:
        return
    window_s = s.catchup_window_s or 0.0
    if window_s <= 0:
        raise ConfigError(
            f"{_catchup_is(s.catchup)} needs a window: set {WINDOW} to a duration > 0, e.g. '3h' "
            "(how far back a run looks for slots that never ran)"
        )
    if not s.schedule:
        raise ConfigError(
            f"{_catchup_is(s.catchup)} needs a schedule (CRON_RUNNER_SCHEDULE, --schedule): the "
            "slots to catch up are the schedule's"
        )
    if overlap == ALLOW_OTHER_SLOTS:
        raise ConfigError(
            f"{_catchup_is(s.catchup)} cannot run with CRON_RUNNER_OVERLAP={ALLOW_OTHER_SLOTS}: "
            "caught-up slots run one after another under the run's lease, and under "
            f"{ALLOW_OTHER_SLOTS} each slot needs a lease of its own; set CRON_RUNNER_CATCHUP=none "
            "or another overlap policy"
        )
    try:
        schedule = schedule_of(settings)
    except ConfigError as exc:
        raise ConfigError(f"{_catchup_is(s.catchup)}: CRON_RUNNER_SCHEDULE: {exc}") from exc
    most = -(-window_s // schedule.min_gap_s)  # ceil: slots at least min_gap_s apart
    if most > MAX_WINDOW_SLOTS:
        raise ConfigError(
            f"{_window_is(window_s)} holds up to {most:.0f} slots of {schedule.expr!r} (one every "
            f"{schedule.min_gap_s:g}s at the most): expected at most {MAX_WINDOW_SLOTS}, a "
            f"window of at most {MAX_WINDOW_SLOTS * schedule.min_gap_s:g}s"
        )
    explicit_s = settings.lease.slot_retention_s
    needed_s = catchup_retention_s(s, schedule)
    if explicit_s is not None and explicit_s < needed_s:
        raise ConfigError(
            f"{_window_is(window_s)} needs slot markers kept at least {needed_s:g}s (the window, "
            f"the schedule's longest gap of {schedule.max_gap_s:g}s and twice the skew tolerance), "
            f"but CRON_RUNNER_SLOT_RETENTION={explicit_s:g}s keeps them shorter: a slot whose "
            "marker expired cannot be proven unrun. Raise CRON_RUNNER_SLOT_RETENTION, or unset it "
            "(the retention then grows with the window), or shorten the window"
        )


def starting_deadline_s(settings: Settings) -> float:
    """How late after its slot a run without a Job name may start and still run it: the starting
    deadline, or the catch-up window when that is longer (a late start within the window is a
    slot caught up, the run's own)."""
    s = settings.slots
    if not s.catches_up:
        return s.starting_deadline_s
    return max(s.starting_deadline_s, s.catchup_window_s or 0.0)


def candidates(settings: Settings, own: int | None, now_s: float) -> list[int]:
    """The slots of the window before ``own``, oldest first, for the acquire script to judge.

    Only those whose markers are still kept: a slot older than the marker retention may have run
    and its marker expired, so it cannot be proven unrun (a CronJob pod retried long after its
    slot, whose window then reaches that far back).
    """
    s = settings.slots
    if own is None or not s.catches_up or not s.schedule:
        return []
    schedule = schedule_of(settings)
    oldest = own - (s.catchup_window_s or 0.0)
    kept_from = now_s - retention_s(settings) + 2 * s.skew_tolerance_s
    fires = schedule.fire_times(max(oldest, kept_from), own - 1, limit=MAX_WINDOW_SLOTS + 1)
    return fires[-MAX_WINDOW_SLOTS:]


def chosen(catchup: str | None, unrun: Sequence[int]) -> tuple[int, ...]:
    """The slots to run before the run's own, oldest first: the newest unrun one (latest), every
    one (all), or none."""
    if catchup == ALL:
        return tuple(unrun)
    if catchup == LATEST:
        return tuple(unrun[-1:])
    assert catchup in (None, CATCHUP_NONE), catchup
    return ()
