"""Schedule slots: which scheduled fire time a run belongs to, and how long its slot marker is
kept (docs/design.md, CronJob slots and The DST rule).

Two sources, both pure (no Redis, no clock reads):

* **Job names** (:mod:`runner.schedule.jobname`). A CronJob's pod knows its slot from its Job's
  name however late it starts. This path never imports the schedule parser
  (:mod:`runner.schedule.cron`): a CronJob pod starts cold every time.
* **Schedules.** Elsewhere the slot is the latest fire time at or before ``now + tolerance``
  (:class:`Schedule`), in the controller's own schedule language (:mod:`runner.schedule.cron`,
  robfig/cron v3.0.1's ParseStandard), parsed on first use.

Which of them gives a run its slot, and how long its marker is kept, follows from the settings:
:mod:`runner.schedule.markers`.

Fire times across daylight-saving changes (docs/design.md, The DST rule)
-------------------------------------------------------------------------
A fire time is a UTC instant whose wall-clock time in the schedule's zone matches the cron
fields. So a wall time that a spring-forward skips does not fire that day, and a wall time that a
fall-back repeats fires twice, an hour apart. This is what robfig/cron v3 does, and therefore what
the Kubernetes CronJob controller does with ``timeZone`` ("2am nightly job (skipped)", "1am
nightly job (runs twice)" in its spec tests): the slot a VM computes from the schedule is the
very slot the controller writes into the Job name.

Except where robfig itself is wrong, and the rule above is kept: when its search passes an
offset change at local midnight (America/Havana, Asia/Tehran until 2022, Africa/Casablanca until 2018,
...) its ``Next`` can step backwards, return a time its own fields do not match or skip a
matching day; at a change off the hour (Australia/Lord_Howe's 30 minutes, Pacific/Chatham at
02:45) it can skip matching times of that hour; across Pacific/Apia's skipped 30 December 2011
it never returns. tests/schedule/test_robfig_oracle.py compares the two and counts these.

Wall times are matched by :class:`runner.schedule.cron.Matcher` on naive wall-clock seconds, where
there is no DST to get wrong, and mapped to instants here, one stretch of constant UTC offset
at a time: within a stretch the wall clock is the instant plus a constant, so a match converts
exactly; when it falls outside the stretch, the search continues in the neighbouring stretch.
"""

from __future__ import annotations

import itertools
import math
import threading
from bisect import bisect_right
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Final

from runner.errors import ConfigError

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

    from runner.schedule.cron import CronSpec

# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------

CRON_FORM: Final = (
    "expected 5 fields: minute hour day-of-month month day-of-week, e.g. '*/5 * * * *', "
    "or one of @hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually "
    "(the Kubernetes CronJob schedule language, docs/design.md)"
)
TZ_FORM: Final = "expected an IANA name such as 'UTC' or 'Europe/Berlin'"
EVERY_REASON: Final = (
    "@every counts from when the CronJob was created or last scheduled, which only the "
    "Kubernetes controller knows, so a runner outside a CronJob cannot compute its slots; "
    "write the schedule in 5 fields (e.g. '@every 1h' as '0 * * * *')"
)


_DAY_S: Final = 86_400
# Every stretch of constant UTC offset in tzdata since 1970 lasts at least 6.9 days (scanned
# over all zones, 1970-2060; shortest: Brazil 2000, Gaza/Hebron predictions). Probing the
# offset every 2 days therefore cannot step over a whole stretch, so between two probes with
# different offsets there is exactly one change, and a bisection finds it to the second.
_PROBE_STEP_S: Final = 2 * _DAY_S
# Offset changes are listed once per schedule for this window (used for the gap analysis, and
# to answer queries inside it without probing). Fixed, so a Schedule depends only on its inputs
# and the tzdata version: 29 years cover every weekday/date alignment of DST rules.
_WINDOW_START_S: Final = int(datetime(2020, 1, 1, tzinfo=UTC).timestamp())
_WINDOW_END_S: Final = int(datetime(2049, 1, 1, tzinfo=UTC).timestamp())
# The calendar repeats every 28 years from 1901 to 2099 (the Gregorian exceptions are 1900 and
# 2100), so these 33 years hold every gap between matching days that any year of that range
# has, including the 4 years of a Feb-29 schedule. (Across 2100 that gap is 8 years; ignored.)
_CALENDAR_YEARS: Final = range(2001, 2034)
# No schedule accepted here fires less often than every 8 years; further means it never fires.
_MAX_SEARCH_DAYS: Final = 10 * 366
_MAX_SEARCH_S: Final = _MAX_SEARCH_DAYS * _DAY_S
_LATEST_S: Final = int(datetime(4000, 1, 1, tzinfo=UTC).timestamp())
# The gap that spans an offset change of an every-day or weekday schedule is at most 8 days, so
# only another change closer than this can make two changes that look alike give other gaps.
_NEIGHBOUR_CAP_S: Final = 9 * _DAY_S


class ToleranceTooLarge(ConfigError):
    """The skew tolerance is not below half the schedule's shortest gap."""

    def __init__(self, message: str, min_gap_s: float) -> None:
        super().__init__(message)
        self.min_gap_s = min_gap_s


_cache: dict[tuple[str, str, float], Schedule] = {}
_cache_lock = threading.Lock()


def _spec(expr: str) -> CronSpec:
    from runner.schedule import cron as cronexpr  # noqa: PLC0415 - start-up cost: not on the Job-name path

    def bad(reason: str) -> ConfigError:
        return ConfigError(f"bad cron expression {expr!r}: {reason}; {CRON_FORM}")

    try:
        spec = cronexpr.parse(expr)
    except cronexpr.CronSyntaxError as exc:
        raise bad(str(exc)) from exc
    if isinstance(spec, cronexpr.Every):
        raise bad(EVERY_REASON)
    if not spec.times_of_day() or not spec.months:
        # ParseStandard accepts an empty list (','), which matches nothing: robfig's Next
        # gives up after five years. There is no slot to run, so say so now.
        raise bad("no time ever matches (an empty field)")
    return spec


def every_retention_s(expr: str) -> float | None:
    """The marker retention of an ``@every <duration>`` CronJob schedule (twice the delay, at
    least an hour, as for any schedule), or None for anything else."""
    from runner.schedule import cron as cronexpr  # noqa: PLC0415 - start-up cost

    try:
        spec = cronexpr.parse(expr)
    except cronexpr.CronSyntaxError:
        return None
    return max(3600.0, 2.0 * spec.delay_s) if isinstance(spec, cronexpr.Every) else None


def _zone(tz: str) -> ZoneInfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # noqa: PLC0415 - start-up cost

    try:
        if not tz or tz != tz.strip():
            raise ValueError(tz)
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ConfigError(f"unknown time zone {tz!r}: {TZ_FORM}") from exc


def _instant(t_s: float) -> float:
    if not (math.isfinite(t_s) and 0 <= t_s < _LATEST_S):
        raise ValueError(f"time {t_s!r} is not epoch seconds between 1970 and the year 4000")
    return t_s


_MEMO = 8  # answers remembered per query


class Schedule:
    """A validated cron schedule in a time zone, with the skew tolerance it is used with.

    Build it with :meth:`parse`. Times in and out are epoch seconds (UTC); fire times are whole
    minutes of wall-clock time in the zone (see the module docstring for DST). Immutable and
    safe to share between threads.

    ``min_gap_s`` / ``max_gap_s`` are the shortest and longest gaps between consecutive fire
    times. They combine two exact parts:

    * the wall-clock gaps, computed from the cron fields: gaps between fire times within a day,
      and gaps between matching days, scanned over 33 years of calendar (every alignment of
      weekdays, month lengths and leap years from 1901 to 2099); and
    * the gap that spans each change of UTC offset in the zone from 2020 to 2048, found by
      bisection and measured with the exact fire times on both sides (a skipped 02:30, a
      doubled 01:30, a Friday-to-Monday gap that holds a DST change).

    Away from offset changes the real gap is a wall-clock gap, so the result is exact, except
    that a wall-clock gap which only ever occurs across a DST change is still counted: then
    ``min_gap_s`` can be a little smaller and ``max_gap_s`` a little larger than the real ones,
    the safe side for both the tolerance check and the slot-marker retention.
    """

    expr: str
    tz: str
    tolerance_s: float
    min_gap_s: float
    max_gap_s: float

    def __init__(
        self, expr: str, tz: str, tolerance_s: float, zone: ZoneInfo, spec: CronSpec
    ) -> None:
        self.expr = expr
        self.tz = tz
        self.tolerance_s = tolerance_s
        self._zone = zone
        from runner.schedule.cron import Matcher  # noqa: PLC0415 - imported by _spec already

        self._spec = spec
        self._matcher = Matcher(spec)
        # The latest answers of each query, with where each holds: (low, fire) and (fire, high).
        # Each tuple is replaced whole, so threads sharing the schedule read consistent ones.
        self._next_memo: tuple[tuple[int, int], ...] = ()
        self._prev_memo: tuple[tuple[int, int], ...] = ()
        self._transitions = self._scan_transitions(_WINDOW_START_S, _WINDOW_END_S)
        self.min_gap_s, self.max_gap_s = self._gaps()

    @classmethod
    def parse(cls, expr: str, tz: str = "UTC", tolerance_s: float = 30.0) -> Schedule:
        """Validate and build; raises :class:`ConfigError` naming the bad part and the form.

        Results are cached by their arguments: a run parses the same schedule several times.
        """
        key = (expr, tz, float(tolerance_s))
        with _cache_lock:
            cached = _cache.get(key)
        if cached is not None:
            return cached
        schedule = cls._build(expr, tz, float(tolerance_s))
        with _cache_lock:
            if len(_cache) >= 64:
                _cache.clear()
            _cache[key] = schedule
        return schedule

    @classmethod
    def _build(cls, expr: str, tz: str, tolerance_s: float) -> Schedule:
        spec = _spec(expr)
        zone = _zone(tz)
        if not (math.isfinite(tolerance_s) and tolerance_s >= 0):
            raise ConfigError(
                f"skew tolerance {tolerance_s!r} is not valid: expected a duration >= 0 seconds"
            )
        schedule = cls(expr, tz, tolerance_s, zone, spec)
        if tolerance_s >= schedule.min_gap_s / 2:
            raise ToleranceTooLarge(
                f"skew tolerance {tolerance_s:g}s is too large for schedule {expr!r} in {tz}: "
                f"it must be less than half the shortest gap between fire times "
                f"({schedule.min_gap_s:g}s / 2 = {schedule.min_gap_s / 2:g}s)",
                schedule.min_gap_s,
            )
        return schedule

    def __repr__(self) -> str:
        return f"Schedule({self.expr!r}, tz={self.tz!r}, tolerance_s={self.tolerance_s:g})"

    @property
    def retention_s(self) -> float:
        """How long to keep a slot marker: twice the longest gap, at least an hour."""
        return max(3600.0, 2 * self.max_gap_s)

    # -- queries ------------------------------------------------------------------------------

    def slot_for(self, now_s: float) -> int:
        """The latest fire time at or before ``now_s + tolerance_s``.

        A runner whose clock is behind the trigger's by up to the tolerance, or that starts
        late (up to the next fire time minus the tolerance), gets the same slot.
        """
        return self._prev_fire(math.floor(_instant(now_s) + self.tolerance_s))

    def next_after(self, t_s: float) -> int:
        """The first fire time strictly after ``t_s``."""
        t = math.floor(_instant(t_s)) + 1
        # An answer holds for every t from where it was asked up to it: `serve` asks this of a
        # thousand tasks that share a few schedules, each scrape, and the cron arithmetic is most
        # of its time.
        for low, fire in self._next_memo:
            if low <= t <= fire:
                return fire
        fire = self._next_fire(t)
        self._next_memo = ((t, fire), *self._next_memo[: _MEMO - 1])
        return fire

    def fire_times(self, start_s: float, end_s: float, *, limit: int) -> list[int]:
        """The fire times from ``start_s`` to ``end_s`` (both included), oldest first, at most
        ``limit`` of them: ask for one more than a range may hold to tell that it holds more."""
        fires: list[int] = []
        # The epoch itself is no slot (the first a schedule knows is after it): a range from 0
        # starts there, where asking for the fire after -1 would be outside what it computes.
        t = max(math.ceil(_instant(start_s)) - 1, 0)
        while len(fires) < limit:
            t = self.next_after(t)
            if t > end_s:
                break
            fires.append(t)
        return fires

    def previous_at_or_before(self, t_s: float) -> int:
        """The last fire time at or before ``t_s``."""
        t = math.floor(_instant(t_s))
        for fire, high in self._prev_memo:  # an answer holds from it up to where it was asked
            if fire <= t <= high:
                return fire
        fire = self._prev_fire(t)
        self._prev_memo = ((fire, t), *self._prev_memo[: _MEMO - 1])
        return fire

    # -- fire times: one stretch of constant UTC offset at a time ---------------------------

    def _prev_fire(self, t: int) -> int:
        cur = t
        while t - cur <= _MAX_SEARCH_S:
            offset = self._offset(cur)
            fire = self._cron_prev_wall(cur + offset) - offset
            start = self._stretch_start(cur, offset, fire)
            if fire >= start:
                return fire
            cur = start - 1
        raise self._never_fires(t)

    def _next_fire(self, t: int) -> int:
        cur = t
        while cur - t <= _MAX_SEARCH_S:
            offset = self._offset(cur)
            fire = self._cron_next_wall(cur + offset) - offset
            end = self._stretch_end(cur, offset, fire)
            if fire <= end:
                return fire
            cur = end + 1
        raise self._never_fires(t)

    def _never_fires(self, t: int) -> ConfigError:
        when = datetime.fromtimestamp(t, UTC).isoformat()
        return ConfigError(
            f"schedule {self.expr!r} in {self.tz} has no fire time within 10 years of {when}"
            " (every matching wall-clock time falls in a DST gap?)"
        )

    def _cron_prev_wall(self, wall: int) -> int:
        """The latest matching wall time <= ``wall`` (naive seconds, read as if UTC)."""
        found = self._matcher.previous_at_or_before(wall, _MAX_SEARCH_DAYS)
        # None: nothing within the search limit; a time that far away ends the search.
        return wall - 2 * _MAX_SEARCH_S if found is None else found

    def _cron_next_wall(self, wall: int) -> int:
        """The earliest matching wall time >= ``wall``."""
        found = self._matcher.next_at_or_after(wall, _MAX_SEARCH_DAYS)
        return wall + 2 * _MAX_SEARCH_S if found is None else found

    def _offset(self, t: int) -> int:
        delta = datetime.fromtimestamp(t, self._zone).utcoffset()
        assert delta is not None  # a ZoneInfo always has one
        return int(delta.total_seconds())

    def _stretch_start(self, cur: int, offset: int, floor: int) -> int:
        """Where the stretch of ``offset`` that holds ``cur`` begins, or ``floor`` if earlier."""
        if _WINDOW_START_S <= cur <= _WINDOW_END_S:
            i = bisect_right(self._transitions, cur)
            if i:
                return self._transitions[i - 1]
            cur = _WINDOW_START_S
        while cur > floor:
            probe = max(cur - _PROBE_STEP_S, floor)
            if self._offset(probe) != offset:
                return self._change_between(probe, cur)
            cur = probe
        return floor

    def _stretch_end(self, cur: int, offset: int, ceiling: int) -> int:
        """Where the stretch of ``offset`` that holds ``cur`` ends, or ``ceiling`` if later."""
        if _WINDOW_START_S <= cur < _WINDOW_END_S:
            i = bisect_right(self._transitions, cur)
            if i < len(self._transitions):
                return self._transitions[i] - 1
            cur = _WINDOW_END_S
        while cur < ceiling:
            probe = min(cur + _PROBE_STEP_S, ceiling)
            if self._offset(probe) != offset:
                return self._change_between(cur, probe) - 1
            cur = probe
        return ceiling

    def _change_between(self, low: int, high: int) -> int:
        """The first second of the new offset, given one change in (low, high]."""
        low_offset = self._offset(low)
        while high - low > 1:
            mid = (low + high) // 2
            if self._offset(mid) == low_offset:
                low = mid
            else:
                high = mid
        return high

    def _scan_transitions(self, start: int, end: int) -> list[int]:
        changes = []
        offset = self._offset(start)
        t = start
        while t < end:
            probe = min(t + _PROBE_STEP_S, end)
            probe_offset = self._offset(probe)
            if probe_offset != offset:
                changes.append(self._change_between(t, probe))
                offset = probe_offset
            t = probe
        return changes

    # -- gaps ---------------------------------------------------------------------------------

    def _gaps(self) -> tuple[float, float]:
        times_s = [minute * 60 for minute in self._spec.times_of_day()]
        gaps = {b - a for a, b in itertools.pairwise(times_s)}
        span_s = times_s[-1] - times_s[0]
        gaps |= {days * _DAY_S - span_s for days in self._day_gaps()}
        weekdays = self._spec.weekdays_only()
        gaps |= self._gaps_across_offset_changes(
            weekdays is not None, weekdays is not None and len(weekdays) < 7
        )
        return float(min(gaps)), float(max(gaps))

    def _day_gaps(self) -> set[int]:
        """Gaps, in days, between consecutive days that match (robfig's day rule)."""
        weekdays = self._spec.weekdays_only()
        if weekdays is not None:
            w = sorted(weekdays)
            days = [*w, *(d + 7 for d in w), *(d + 14 for d in w)]
        else:
            first = date(_CALENDAR_YEARS[0], 1, 1).toordinal()
            last = date(_CALENDAR_YEARS[-1], 12, 31).toordinal()
            days = [d for d in range(first, last + 1) if self._spec.day_matches(d)]
        if len(days) < 2:
            raise ConfigError(
                f"bad cron expression {self.expr!r}: no day ever matches (such as 30 February); "
                f"{CRON_FORM}"
            )
        return {b - a for a, b in itertools.pairwise(days)}

    def _gaps_across_offset_changes(self, every_day_alike: bool, by_weekday: bool) -> set[int]:
        """The gap that spans each offset change in the window, from the exact fire times.

        When the day fields do not depend on the date (only, perhaps, on the weekday), changes
        that look alike locally give the same gap, and only one of each kind is measured.
        """
        gaps: set[int] = set()
        seen: set[tuple[int | None, ...]] = set()
        changes = self._transitions
        covered_until = -1
        for i, change in enumerate(changes):
            if change <= covered_until:
                continue  # the gap measured for the previous change spans this one too
            if every_day_alike:
                before = change - changes[i - 1] if i else None
                after = changes[i + 1] - change if i + 1 < len(changes) else None
                new_offset = self._offset(change)
                wall = datetime.fromtimestamp(change, self._zone)
                kind = (
                    self._offset(change - 1),
                    new_offset,
                    (change + new_offset) % _DAY_S,
                    wall.isoweekday() if by_weekday else None,
                    None if before is None else min(before, _NEIGHBOUR_CAP_S),
                    None if after is None else min(after, _NEIGHBOUR_CAP_S),
                )
                if kind in seen:
                    continue
                seen.add(kind)
            last_before = self._prev_fire(change - 1)
            covered_until = self._next_fire(last_before + 1)
            gaps.add(covered_until - last_before)
        return gaps
