"""Slots: Job-name parsing, schedule fire times across DST, tolerance checks, and the properties
that let runners with different clocks agree on a slot (issue 2, section 3).

Fire times are checked against two oracles that share no code with runner.schedule.slots: a scan of every
UTC minute whose wall-clock time matches (for short windows), and croniter's naive wall times
mapped to every instant that shows them (for whole years).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.errors import ConfigError
from runner.schedule import slots
from runner.schedule.jobname import MAX_SLOT_MINUTES, MIN_SLOT_MINUTES, slot_from_job_name
from runner.schedule.slots import CRON_FORM, TZ_FORM, Schedule

DAY_S = 86_400
MINUTE_2026 = 29_579_100  # 2026-03-29T01:00Z, the minute Europe/Berlin moves to summer time


def at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def job_name_for(cronjob_name: str, slot_s: int) -> str:
    """The name the CronJob controller gives the Job of ``slot_s`` (the inverse of the parser)."""
    if not cronjob_name:
        raise ValueError("a CronJob name is required")
    if slot_s % 60:
        raise ValueError(f"slot {slot_s} is not a whole minute: the controller names minutes")
    return f"{cronjob_name}-{slot_s // 60}"


# ---------------------------------------------------------------------------------------------
# Job names
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_name", "cronjob_name", "expected_minutes"),
    [
        # what the controller writes
        ("report-29579100", "report", MINUTE_2026),
        ("report-29579100", None, MINUTE_2026),
        ("report-29579100", "", MINUTE_2026),
        # digits inside the CronJob's own name stay in the prefix
        ("report-v2-29579100", "report-v2", MINUTE_2026),
        ("report-v2-29579100", None, MINUTE_2026),
        ("backup-2-29579100", "backup-2", MINUTE_2026),
        ("a-12345678-29579100", "a-12345678", MINUTE_2026),
        ("a-12345678-29579100", None, MINUTE_2026),
        ("0day-29579100", "0day", MINUTE_2026),
        # the plausible range, both ends
        ("x-23667840", None, MIN_SLOT_MINUTES),
        ("x-23667839", None, None),
        ("x-99999999", None, 99_999_999),
        ("x-100000000", None, None),
        # prefix mismatch: a Job of another CronJob, or a hand-made Job name
        ("report-29579100", "other", None),
        ("report-29579100", "repor", None),
        ("report-29579100", "report-", None),
        ("report-v2-29579100", "report", None),
        ("report-29579100", "report-v2", None),
        ("report-manual-29579100", "report", None),
        # manual runs: names that do not parse
        ("report-manual", "report", None),
        ("report-manual", None, None),
        ("x-abc", None, None),
        ("x-manual-1", "x", None),
        ("backup-2", None, None),
        ("backup-2", "backup", None),
        ("job-42", None, None),
        ("report-7f9c2", None, None),  # generateName suffix
        ("report-24567", None, None),  # generateName suffix that happens to be all digits
        ("report-29579100-1", "report", None),
        ("report-29579100-x", None, None),
        ("report", "report", None),
        ("29579100", None, None),
        ("-29579100", None, None),
        ("", None, None),
        # digits that are not a controller's minute
        ("x-1774746000", None, None),  # epoch seconds
        ("x-20260329", None, None),  # date +%Y%m%d: a minute in 2008
        ("x-202603290100", None, None),  # date +%Y%m%d%H%M
        ("x-029579100", None, None),  # leading zero
        ("x-02957910", None, None),
        ("x-2957910", None, None),  # 7 digits (1975)
        ("x-29579100 ", None, None),
        ("x-29579100\n", None, None),
        ("x-\uff12\uff19\uff15\uff17\uff19\uff11\uff10\uff10", None, None),  # fullwidth digits
        ("x-\u0662\u0669\u0665\u0667\u0669\u0661\u0660\u0660", None, None),  # Arabic-Indic
    ],
)
def test_slot_from_job_name(
    job_name: str, cronjob_name: str | None, expected_minutes: int | None
) -> None:
    expected = None if expected_minutes is None else expected_minutes * 60
    assert slot_from_job_name(job_name, cronjob_name) == expected


@pytest.mark.parametrize(
    ("cronjob_name", "slot_s", "expected"),
    [
        ("report", MINUTE_2026 * 60, "report-29579100"),
        ("report-v2", MINUTE_2026 * 60, "report-v2-29579100"),
        ("x", MIN_SLOT_MINUTES * 60, "x-23667840"),
    ],
)
def test_job_name_for(cronjob_name: str, slot_s: int, expected: str) -> None:
    assert job_name_for(cronjob_name, slot_s) == expected


@pytest.mark.parametrize(
    ("cronjob_name", "slot_s", "message"),
    [("report", MINUTE_2026 * 60 + 30, "not a whole minute"), ("", 1_774_746_000, "required")],
)
def test_job_name_for_refuses(cronjob_name: str, slot_s: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        job_name_for(cronjob_name, slot_s)


# Kubernetes object names: DNS labels, and a CronJob name has at most 52 characters.
cronjob_names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?", fullmatch=True)
plausible_minutes = st.integers(MIN_SLOT_MINUTES, MAX_SLOT_MINUTES - 1)


@given(cronjob_names, plausible_minutes)
def test_job_name_round_trip(cronjob_name: str, minutes: int) -> None:
    name = job_name_for(cronjob_name, minutes * 60)
    assert len(name) <= 63
    assert slot_from_job_name(name, cronjob_name) == minutes * 60
    assert slot_from_job_name(name, None) == minutes * 60


@given(cronjob_names, cronjob_names, plausible_minutes)
def test_job_name_of_another_cronjob_is_a_manual_run(mine: str, other: str, minutes: int) -> None:
    if mine != other:
        assert slot_from_job_name(job_name_for(other, minutes * 60), mine) is None


@given(st.text(), st.none() | st.text())
def test_any_job_name_parses_or_is_manual(job_name: str, cronjob_name: str | None) -> None:
    slot = slot_from_job_name(job_name, cronjob_name)
    if slot is not None:
        assert slot % 60 == 0
        assert MIN_SLOT_MINUTES * 60 <= slot < MAX_SLOT_MINUTES * 60
        assert job_name.endswith(str(slot // 60))


def test_the_job_name_path_does_not_import_the_schedule_machinery() -> None:
    code = (
        "import sys, runner.schedule.jobname as j, runner.schedule.slots as s\n"
        "assert j.slot_from_job_name('report-29579100', 'report') == 29579100 * 60\n"
        "loaded = [m for m in ('croniter', 'runner.schedule.cron') if m in sys.modules]\n"
        "assert not loaded, f'imported by the Job-name path: {loaded}'\n"
        "s.Schedule.parse('*/5 * * * *')\n"
        "assert 'runner.schedule.cron' in sys.modules\n"
        "assert 'croniter' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------

H = 3600


@pytest.mark.parametrize(
    ("expr", "tz", "min_gap_s", "max_gap_s"),
    [
        ("* * * * *", "UTC", 60, 60),
        ("*/5 * * * *", "UTC", 300, 300),
        ("*/5 * * * *", "Europe/Berlin", 300, 300),
        ("  */15  *  *  *  *  ", "UTC", 900, 900),
        ("*/7 * * * *", "UTC", 240, 420),
        ("0-59/20 * * * *", "UTC", 1200, 1200),
        ("0 * * * *", "America/New_York", H, H),  # hourly stays hourly across both changes
        ("@hourly", "Europe/Berlin", H, H),
        ("@daily", "UTC", DAY_S, DAY_S),
        ("@midnight", "UTC", DAY_S, DAY_S),
        ("0 9 * * *", "Europe/Berlin", 23 * H, 25 * H),
        ("30 2 * * *", "Europe/Berlin", H, 47 * H),  # skipped in spring, twice in autumn
        ("30 1 * * *", "America/New_York", H, DAY_S),  # twice in autumn
        ("0 0 * * *", "America/Sao_Paulo", DAY_S, DAY_S),  # no DST since 2019
        ("0 9 * * 1-5", "UTC", DAY_S, 3 * DAY_S),
        ("0 9 * * 1-5", "Europe/Berlin", DAY_S, 3 * DAY_S + H),
        ("0 9 * * MON-FRI", "America/New_York", DAY_S, 3 * DAY_S + H),
        ("0 12 * * sat,SUN", "UTC", DAY_S, 6 * DAY_S),
        ("@weekly", "UTC", 7 * DAY_S, 7 * DAY_S),
        ("0 0 * * 0", "UTC", 7 * DAY_S, 7 * DAY_S),
        ("0 0 ? * ?", "UTC", DAY_S, DAY_S),
        ("0 12 1 * 1", "UTC", DAY_S, 7 * DAY_S),  # day-of-month OR day-of-week
        ("0 0 1 * *", "UTC", 28 * DAY_S, 31 * DAY_S),
        ("@monthly", "Europe/Berlin", 28 * DAY_S, 31 * DAY_S + H),
        ("0 0 * jan,JUL *", "UTC", DAY_S, 154 * DAY_S),  # 31 July to 1 January
        ("@yearly", "UTC", 365 * DAY_S, 366 * DAY_S),
        ("@annually", "Asia/Tokyo", 365 * DAY_S, 366 * DAY_S),
        ("0 0 29 2 *", "UTC", 1461 * DAY_S, 1461 * DAY_S),
        # 02:30 on 26 March falls in Berlin's DST gap when the 26th is the last Sunday.
        ("30 2 26 3 *", "Europe/Berlin", 365 * DAY_S, 731 * DAY_S),
    ],
)
def test_parse_and_gaps(expr: str, tz: str, min_gap_s: int, max_gap_s: int) -> None:
    schedule = Schedule.parse(expr, tz, tolerance_s=0)
    assert (schedule.min_gap_s, schedule.max_gap_s) == (min_gap_s, max_gap_s)
    assert schedule.retention_s == max(3600, 2 * max_gap_s)


def test_parse_defaults_and_cache() -> None:
    schedule = Schedule.parse("*/5 * * * *")
    assert (schedule.tz, schedule.tolerance_s) == ("UTC", 30.0)
    assert Schedule.parse("*/5 * * * *", "UTC", 30) is schedule
    assert "*/5 * * * *" in repr(schedule)


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("", "it is empty"),
        ("   ", "it has 0 fields"),
        ("* * * *", "it has 4 fields"),
        ("0 * * * * *", "it has 6 fields (a seconds or year field is not supported)"),
        ("*/10 * * * * *", "it has 6 fields (a seconds or year field is not supported)"),
        ("0 0 0 * * * 2030", "it has 7 fields (a seconds or year field is not supported)"),
        ("* * * * * * * *", "it has 8 fields"),
        ("@reboot", "unknown macro '@reboot'"),
        ("@every 5m", "@every counts from when the CronJob was created"),
        ("@every nope", "@every: 'nope' is not a Go duration"),
        ("@DAILY", "unknown macro '@DAILY' (macros are lower case, with no spaces)"),
        ("@daily ", "unknown macro '@daily '"),
        ("TZ=Europe/Berlin 0 9 * * *", "a time zone (TZ= or CRON_TZ=) inside the schedule"),
        ("CRON_TZ=UTC 0 9 * * *", "a time zone (TZ= or CRON_TZ=) inside the schedule"),
        ("@fortnightly", "unknown macro"),
        ("60 * * * *", "minute field '60': 60 is above the maximum 59 (range 0-59)"),
        ("-1 * * * *", "minute field '-1': '' is not a number"),
        ("* 24 * * *", "hour field '24': 24 is above the maximum 23"),
        ("* * 0 * *", "day-of-month field '0': 0 is below the minimum 1 (range 1-31)"),
        ("* * 32 * *", "day-of-month field '32': 32 is above the maximum 31"),
        ("* * * 0 *", "month field '0': 0 is below the minimum 1"),
        ("* * * 13 *", "month field '13': 13 is above the maximum 12"),
        ("* * * * 7", "day-of-week field '7': 7 is above the maximum 6 (range 0-6)"),
        ("* * * * 8", "day-of-week field '8': 8 is above the maximum 6"),
        ("* * * * 5-7", "day-of-week field '5-7': 7 is above the maximum 6"),
        ("*/0 * * * *", "minute field '*/0': a step must be a positive number"),
        ("5-1 * * * *", "minute field '5-1': the range 5-1 runs backwards"),
        ("* * * * fri-mon", "day-of-week field 'fri-mon': the range fri-mon runs backwards"),
        ("* * * dec-jan *", "runs backwards"),
        ("1-2-3 * * * *", "too many hyphens in '1-2-3'"),
        ("1/2/3 * * * *", "too many slashes in '1/2/3'"),
        ("* * L * *", "day-of-month field 'L': 'L' is not a number"),
        ("* * 15W * *", "day-of-month field '15W': '15W' is not a number"),
        ("* * * * 1#2", "day-of-week field '1#2': '1#2' is neither a number nor a name"),
        ("* * * * 5L", "day-of-week field '5L': '5L' is neither a number nor a name"),
        ("H * * * *", "minute field 'H': 'H' is not a number"),
        ("R * * * *", "minute field 'R': 'R' is not a number"),
        ("* * * foo *", "month field 'foo': 'foo' is neither a number nor a name (jan, feb"),
        ("* * * * jan", "day-of-week field 'jan': 'jan' is neither a number nor a name (sun,"),
        ("* * * mon *", "month field 'mon': 'mon' is neither a number nor a name"),
        ("*/x * * * *", "minute field '*/x': 'x' is not a number"),
        ("\uff11 * * * *", "minute field '\uff11': '\uff11' is not a number"),
        ("99999999999999999999 * * * *", "is out of range"),
        (", 0 * * *", "no time ever matches (an empty field)"),
        ("0 0 , * *", "no day ever matches"),
        ("0 0 30 2 *", "no day ever matches"),
        ("0 0 31 4,6,9,11 *", "no day ever matches"),
    ],
)
def test_bad_cron_expression(expr: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        Schedule.parse(expr, "UTC", tolerance_s=0)
    message = str(info.value)
    assert message.startswith(f"bad cron expression {expr!r}: ")
    assert reason in message
    assert message.endswith(CRON_FORM)
    assert "expected 5 fields: minute hour day-of-month month day-of-week, e.g. '*/5 * * * *'" in (
        message
    )
    assert info.value.exit_code == 78


# ---------------------------------------------------------------------------------------------
# The schedule language of the Kubernetes controller (robfig/cron v3.0.1's ParseStandard), one
# test per fault of issue 13. tests/schedule/test_robfig_oracle.py compares against robfig itself.
# ---------------------------------------------------------------------------------------------


def fires(expr: str, start: str, count: int, tz: str = "UTC") -> list[str]:
    schedule = Schedule.parse(expr, tz, tolerance_s=0)
    zone = ZoneInfo(tz)
    out, t = [], at(start) - 1
    for _ in range(count):
        t = schedule.next_after(t)
        out.append(datetime.fromtimestamp(t, zone).strftime("%Y-%m-%d %a %H:%M"))
    return out


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("0 9 * * 1-1", ["2026-03-02 Mon 09:00", "2026-03-09 Mon 09:00", "2026-03-16 Mon 09:00"]),
        (
            "0 9 * * mon-mon",
            ["2026-03-02 Mon 09:00", "2026-03-09 Mon 09:00", "2026-03-16 Mon 09:00"],
        ),
        ("0-0 * * * *", ["2026-03-01 Sun 00:00", "2026-03-01 Sun 01:00", "2026-03-01 Sun 02:00"]),
        ("0 0 1 12-12 *", ["2026-12-01 Tue 00:00", "2027-12-01 Wed 00:00", "2028-12-01 Fri 00:00"]),
        ("0 0 1 jan-1 *", ["2027-01-01 Fri 00:00", "2028-01-01 Sat 00:00", "2029-01-01 Mon 00:00"]),
        (
            "10 0-8 29-29 2 *",
            ["2028-02-29 Tue 00:10", "2028-02-29 Tue 01:10", "2028-02-29 Tue 02:10"],
        ),
    ],
)
def test_a_single_value_range_is_that_value_not_a_star(expr: str, expected: list[str]) -> None:
    assert fires(expr, "2026-03-01T00:00Z", 3) == expected


def test_a_star_inside_a_list_is_accepted_as_every_value() -> None:
    assert fires("*,45 * * * *", "2026-03-01T10:58Z", 3) == [
        "2026-03-01 Sun 10:58", "2026-03-01 Sun 10:59", "2026-03-01 Sun 11:00"]  # fmt: skip
    assert fires("0 *,3 * * *", "2026-03-01T10:58Z", 1) == ["2026-03-01 Sun 11:00"]


@pytest.mark.parametrize(
    ("expr", "start", "expected"),
    [
        # */1 keeps the star bit: both day fields must match, and every weekday does.
        ("*/19 * 18 * MON-5,*/1", "2026-03-01T00:00Z",
         ["2026-03-18 Wed 00:00", "2026-03-18 Wed 00:19"]),
        ("0-51/1 2-23 28-29/2 2 */1", "2026-03-01T00:00Z",
         ["2027-02-28 Sun 02:00", "2027-02-28 Sun 02:01"]),
        ("0 0 18 * ?", "2026-03-01T00:00Z", ["2026-03-18 Wed 00:00", "2026-04-18 Sat 00:00"]),
        # */2 clears it: either day field matches (the 1st, the 3rd, ... or a Monday).
        ("0 0 */2 * 1", "2026-03-01T00:00Z", ["2026-03-01 Sun 00:00", "2026-03-02 Mon 00:00"]),
        ("0 0 18 * */2", "2026-03-16T00:00Z", ["2026-03-17 Tue 00:00", "2026-03-18 Wed 00:00"]),
        # An empty list (ParseStandard drops empty items) sets nothing and no star.
        ("0 0 , * 1", "2026-03-01T00:00Z", ["2026-03-02 Mon 00:00", "2026-03-09 Mon 00:00"]),
    ],
)  # fmt: skip
def test_the_day_fields_follow_robfigs_star_bit(expr: str, start: str, expected: list[str]) -> None:
    assert fires(expr, start, 2) == expected


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("5/15 * * * *", ["2026-03-01 Sun 00:05", "2026-03-01 Sun 00:20", "2026-03-01 Sun 00:35",
                          "2026-03-01 Sun 00:50", "2026-03-01 Sun 01:05"]),
        ("0 10/6 * * *", ["2026-03-01 Sun 10:00", "2026-03-01 Sun 16:00", "2026-03-01 Sun 22:00",
                          "2026-03-02 Mon 10:00", "2026-03-02 Mon 16:00"]),
        ("0 0 27/2 * *", ["2026-03-27 Fri 00:00", "2026-03-29 Sun 00:00", "2026-03-31 Tue 00:00",
                          "2026-04-27 Mon 00:00", "2026-04-29 Wed 00:00"]),
        ("0 0 1 nov/1 *", ["2026-11-01 Sun 00:00", "2026-12-01 Tue 00:00", "2027-11-01 Mon 00:00",
                           "2027-12-01 Wed 00:00", "2028-11-01 Wed 00:00"]),
        ("0 0 * * fri/1", ["2026-03-06 Fri 00:00", "2026-03-07 Sat 00:00", "2026-03-13 Fri 00:00",
                           "2026-03-14 Sat 00:00", "2026-03-20 Fri 00:00"]),
    ],
)  # fmt: skip
def test_n_slash_step_means_n_to_the_maximum(expr: str, expected: list[str]) -> None:
    assert fires(expr, "2026-03-01T00:00Z", 5) == expected


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # N at the field's maximum: N-max/step is the single value N (croniter read it as *).
        ("59/5 0 * * *", ["2026-03-01 Sun 00:59", "2026-03-02 Mon 00:59"]),
        ("0 23/2 * * *", ["2026-03-01 Sun 23:00", "2026-03-02 Mon 23:00"]),
        ("0 0 31/7 * *", ["2026-03-31 Tue 00:00", "2026-05-31 Sun 00:00"]),
        ("0 0 1 dec/3 *", ["2026-12-01 Tue 00:00", "2027-12-01 Wed 00:00"]),
        ("0 0 * * sat/2", ["2026-03-07 Sat 00:00", "2026-03-14 Sat 00:00"]),
    ],
)
def test_n_slash_step_at_the_maximum_is_that_single_value(expr: str, expected: list[str]) -> None:
    assert fires(expr, "2026-03-01T00:00Z", 2) == expected


@pytest.mark.parametrize("expr", ["@every 1h", "@every 90s", "@every 1h30m"])
def test_every_is_refused_outside_a_cronjob_saying_why(expr: str) -> None:
    with pytest.raises(ConfigError) as info:
        Schedule.parse(expr)
    assert "@every counts from when the CronJob was created or last scheduled" in str(info.value)
    assert "write the schedule in 5 fields" in str(info.value)


@pytest.mark.parametrize(
    ("expr", "same_as"),
    [
        ("*-5 * * * *", "* * * * *"),  # robfig reads no further than a star
        ("? * * * *", "* * * * *"),  # '?' is a star in every field
        ("+5 * * * *", "5 * * * *"),  # Go's Atoi
        ("05 009 * * *", "5 9 * * *"),
        ("1,,2 * * * mon,", "1,2 * * * 1"),  # empty list items are dropped
        ("0 0 * JAN,fEb * ", "0 0 * 1,2 *"),  # names in any case
        ("0 0 * * FR\u0130", "0 0 * * 5"),  # Go lower-cases U+0130 to 'i'
        ("0\u00a00\t*\u3000* *", "0 0 * * *"),  # Go's white space
        ("@weekly", "0 0 * * 0"),
    ],
)
def test_parse_standard_spellings(expr: str, same_as: str) -> None:
    assert fires(expr, "2026-03-01T00:00Z", 4) == fires(same_as, "2026-03-01T00:00Z", 4)


@pytest.mark.parametrize(
    ("expr", "tz", "start", "expected"),
    [
        # Havana skips midnight at the spring change: that day has no 00:00 (robfig instead
        # fires at 23:00 the day before, a time its fields do not match).
        ("0 0 * * *", "America/Havana", "2024-03-09T00:00-05:00",
         ["2024-03-09 Sat 00:00", "2024-03-11 Mon 00:00"]),
        # ... and has midnight twice in autumn.
        ("0 0 * * *", "America/Havana", "2024-11-02T12:00-04:00",
         ["2024-11-03 Sun 00:00", "2024-11-03 Sun 00:00", "2024-11-04 Mon 00:00"]),
        # Tehran until 2022: midnight skipped on 22 March; 23:xx twice on 21 September.
        ("30 0 * * *", "Asia/Tehran", "2021-03-21T12:00+03:30",
         ["2021-03-23 Tue 00:30", "2021-03-24 Wed 00:30"]),
        ("30 23 * * *", "Asia/Tehran", "2021-09-21T12:00+04:30",
         ["2021-09-21 Tue 23:30", "2021-09-21 Tue 23:30", "2021-09-22 Wed 23:30"]),
        # Casablanca 2013: 00:00 skipped on 28 April (robfig skips the whole day).
        ("0 5 28 4 *", "Africa/Casablanca", "2013-04-01T00:00Z", ["2013-04-28 Sun 05:00"]),
        # Lord Howe moves 30 minutes: 02:00-02:29 skipped in October, 01:30-01:59 twice in
        # April; 02:15 and 02:00 exist on the April day (robfig skips them).
        ("15 2 * * *", "Australia/Lord_Howe", "2024-10-05T12:00+10:30",
         ["2024-10-07 Mon 02:15"]),
        ("45 2 * * *", "Australia/Lord_Howe", "2024-10-05T12:00+10:30",
         ["2024-10-06 Sun 02:45", "2024-10-07 Mon 02:45"]),
        ("45 1 * * *", "Australia/Lord_Howe", "2024-04-06T12:00+11:00",
         ["2024-04-07 Sun 01:45", "2024-04-07 Sun 01:45", "2024-04-08 Mon 01:45"]),
        ("15 2 * * *", "Australia/Lord_Howe", "2024-04-06T12:00+11:00",
         ["2024-04-07 Sun 02:15", "2024-04-08 Mon 02:15"]),
    ],
)  # fmt: skip
def test_fire_times_are_matching_wall_times_where_robfig_errs_at_dst(
    expr: str, tz: str, start: str, expected: list[str]
) -> None:
    # The rule (runner/slots.py, docs/design.md): an instant fires when its wall-clock time in
    # the zone matches the fields; a skipped wall time does not fire, a repeated one fires twice.
    assert fires(expr, start, len(expected), tz) == expected


@pytest.mark.parametrize(
    "tz", ["", "Europe", "Nope/Zone", "Europe/Berlin ", " UTC", "../etc/passwd", "/etc/localtime",
           "CET+1", "+02:00", "europe/berlin\n"],
)  # fmt: skip
def test_unknown_time_zone(tz: str) -> None:
    with pytest.raises(ConfigError) as info:
        Schedule.parse("*/5 * * * *", tz)
    assert str(info.value) == f"unknown time zone {tz!r}: {TZ_FORM}"
    assert info.value.exit_code == 78


@pytest.mark.parametrize(
    ("expr", "tz", "tolerance_s", "numbers"),
    [
        ("* * * * *", "UTC", 30, "(60s / 2 = 30s)"),
        ("* * * * *", "UTC", 45, "(60s / 2 = 30s)"),
        ("*/7 * * * *", "UTC", 120, "(240s / 2 = 120s)"),
        ("30 1 * * *", "America/New_York", 1800, "(3600s / 2 = 1800s)"),  # the doubled 01:30
        ("0 9 * * *", "Europe/Berlin", 41_400, "(82800s / 2 = 41400s)"),
    ],
)
def test_tolerance_too_large(expr: str, tz: str, tolerance_s: float, numbers: str) -> None:
    with pytest.raises(ConfigError) as info:
        Schedule.parse(expr, tz, tolerance_s)
    message = str(info.value)
    assert message.startswith(f"skew tolerance {tolerance_s:g}s is too large for schedule {expr!r}")
    assert "less than half the shortest gap between fire times" in message
    assert message.endswith(numbers)


@pytest.mark.parametrize(
    ("expr", "tz", "tolerance_s"),
    [
        ("* * * * *", "UTC", 29.999),
        ("*/7 * * * *", "UTC", 119.5),
        ("30 1 * * *", "America/New_York", 1799),
        ("0 9 * * *", "Europe/Berlin", 41_399),
        ("0 9 * * *", "Europe/Berlin", 0),
    ],
)
def test_tolerance_just_below_half_the_shortest_gap(expr: str, tz: str, tolerance_s: float) -> None:
    assert Schedule.parse(expr, tz, tolerance_s).tolerance_s == tolerance_s


@pytest.mark.parametrize("tolerance_s", [-1.0, float("nan"), float("inf"), float("-inf")])
def test_tolerance_not_a_duration(tolerance_s: float) -> None:
    with pytest.raises(ConfigError, match=r"skew tolerance .* is not valid: expected a duration"):
        Schedule.parse("0 * * * *", "UTC", tolerance_s)


@pytest.mark.parametrize("t_s", [float("nan"), float("inf"), -1.0, 2.0**40])
def test_time_out_of_range(t_s: float) -> None:
    schedule = Schedule.parse("0 * * * *")
    for query in (schedule.slot_for, schedule.next_after, schedule.previous_at_or_before):
        with pytest.raises(ValueError, match="not epoch seconds"):
            query(t_s)


def test_a_schedule_that_finds_no_fire_time_within_the_search_limit_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No real zone skips every match for 10 years; a shorter limit exercises the same path.
    schedule = Schedule.parse("0 0 1 1 *", "Europe/Berlin")
    monkeypatch.setattr(slots, "_MAX_SEARCH_S", 30 * DAY_S)
    with pytest.raises(ConfigError, match="has no fire time within 10 years"):
        schedule.previous_at_or_before(at("2026-06-01T00:00Z"))
    with pytest.raises(ConfigError, match="has no fire time within 10 years"):
        schedule.next_after(at("2026-06-01T00:00Z"))


# ---------------------------------------------------------------------------------------------
# Fire times and slots near boundaries
# ---------------------------------------------------------------------------------------------

TICK = 2.0**-10  # exactly representable, so now + tolerance is exact


@pytest.mark.parametrize(
    ("expr", "tz", "tolerance_s", "now", "slot"),
    [
        # a fire time, a tolerance before it, and just short of that
        ("*/5 * * * *", "UTC", 30, "2026-03-05T10:05:00Z", "2026-03-05T10:05:00Z"),
        ("*/5 * * * *", "UTC", 30, "2026-03-05T10:04:30Z", "2026-03-05T10:05:00Z"),
        ("*/5 * * * *", "UTC", 30, "2026-03-05T10:04:29.999Z", "2026-03-05T10:00:00Z"),
        ("*/5 * * * *", "UTC", 30, "2026-03-05T10:09:29.999Z", "2026-03-05T10:05:00Z"),
        ("*/5 * * * *", "UTC", 0, "2026-03-05T10:05:00Z", "2026-03-05T10:05:00Z"),
        ("*/5 * * * *", "UTC", 0, "2026-03-05T10:04:59.999Z", "2026-03-05T10:00:00Z"),
        ("* * * * *", "UTC", 20, "2026-12-31T23:59:40Z", "2027-01-01T00:00:00Z"),
        ("@yearly", "UTC", 30, "2026-12-31T23:59:30Z", "2027-01-01T00:00:00Z"),
        ("@yearly", "UTC", 30, "2026-12-31T23:59:29Z", "2026-01-01T00:00:00Z"),
        # weekdays across a weekend that holds Berlin's spring change
        ("0 9 * * 1-5", "Europe/Berlin", 30, "2026-03-27T09:00:00+01:00", "2026-03-27T09:00+01:00"),
        ("0 9 * * 1-5", "Europe/Berlin", 30, "2026-03-28T12:00:00+01:00", "2026-03-27T09:00+01:00"),
        ("0 9 * * 1-5", "Europe/Berlin", 30, "2026-03-30T08:59:29+02:00", "2026-03-27T09:00+01:00"),
        ("0 9 * * 1-5", "Europe/Berlin", 30, "2026-03-30T08:59:30+02:00", "2026-03-30T09:00+02:00"),
        # 02:30 does not exist on 2026-03-29 in Berlin, and happens twice on 2026-10-25
        ("30 2 * * *", "Europe/Berlin", 30, "2026-03-29T12:00:00+02:00", "2026-03-28T02:30+01:00"),
        ("30 2 * * *", "Europe/Berlin", 30, "2026-03-30T02:29:30+02:00", "2026-03-30T02:30+02:00"),
        ("30 2 * * *", "Europe/Berlin", 30, "2026-10-25T02:29:30+02:00", "2026-10-25T02:30+02:00"),
        ("30 2 * * *", "Europe/Berlin", 30, "2026-10-25T02:10:00+01:00", "2026-10-25T02:30+02:00"),
        ("30 2 * * *", "Europe/Berlin", 30, "2026-10-25T02:29:29+01:00", "2026-10-25T02:30+02:00"),
        ("30 2 * * *", "Europe/Berlin", 30, "2026-10-25T02:29:30+01:00", "2026-10-25T02:30+01:00"),
        ("30 2 * * *", "Europe/Berlin", 30, "2026-10-26T02:29:29+01:00", "2026-10-25T02:30+01:00"),
        # New York: 01:30 twice on 2026-11-01; the first is the slot until the second is near
        ("30 1 * * *", "America/New_York", 30, "2026-11-01T01:10-05:00", "2026-11-01T01:30-04:00"),
        ("30 1 * * *", "America/New_York", 30, "2026-11-01T01:29:30-05:00", "2026-11-01T01:30-05:00"),
        ("30 1 * * *", "America/New_York", 30, "2026-03-08T12:00-04:00", "2026-03-08T01:30-05:00"),
        ("0 * * * *", "America/New_York", 30, "2026-03-08T01:59:29-05:00", "2026-03-08T01:00-05:00"),
        ("0 * * * *", "America/New_York", 30, "2026-03-08T01:59:30-05:00", "2026-03-08T03:00-04:00"),
        ("0 * * * *", "America/New_York", 30, "2026-11-01T01:59:30-04:00", "2026-11-01T01:00-05:00"),
        # outside the window of cached offset changes (1990s, 2060s): the probing path
        ("30 2 * * *", "Europe/Berlin", 30, "2060-03-28T12:00:00+02:00", "2060-03-27T02:30+01:00"),
        ("30 2 * * *", "Europe/Berlin", 30, "2060-10-31T02:10:00+01:00", "2060-10-31T02:30+02:00"),
        ("0 9 * * 1-5", "Europe/Berlin", 30, "1999-03-29T08:59:30+02:00", "1999-03-29T09:00+02:00"),
        ("0 0 * * *", "America/Sao_Paulo", 30, "2018-11-04T12:00-02:00", "2018-11-03T00:00-03:00"),
    ],
)  # fmt: skip
def test_slot_for(expr: str, tz: str, tolerance_s: float, now: str, slot: str) -> None:
    assert Schedule.parse(expr, tz, tolerance_s).slot_for(at(now)) == at(slot)


# robfig/cron v3's DST table (spec_test.go), which the Kubernetes CronJob controller follows.
@pytest.mark.parametrize(
    ("start", "expr", "expected"),
    [
        ("2012-03-11T00:00:00-05:00", "30 2 11 3 *", "2013-03-11T02:30:00-04:00"),
        ("2012-03-11T00:00:00-05:00", "0 * * * *", "2012-03-11T01:00:00-05:00"),
        ("2012-03-11T01:00:00-05:00", "0 * * * *", "2012-03-11T03:00:00-04:00"),
        ("2012-03-11T03:00:00-04:00", "0 * * * *", "2012-03-11T04:00:00-04:00"),
        ("2012-03-11T00:00:00-05:00", "0 1 * * *", "2012-03-11T01:00:00-05:00"),
        ("2012-03-11T01:00:00-05:00", "0 1 * * *", "2012-03-12T01:00:00-04:00"),
        ("2012-03-11T00:00:00-05:00", "0 2 * * *", "2012-03-12T02:00:00-04:00"),  # skipped
        ("2012-11-04T00:00:00-04:00", "30 2 4 11 *", "2012-11-04T02:30:00-05:00"),
        ("2012-11-04T01:45:00-04:00", "30 1 4 11 *", "2012-11-04T01:30:00-05:00"),
        ("2012-11-04T00:00:00-04:00", "0 * * * *", "2012-11-04T01:00:00-04:00"),
        ("2012-11-04T01:00:00-04:00", "0 * * * *", "2012-11-04T01:00:00-05:00"),
        ("2012-11-04T01:00:00-05:00", "0 * * * *", "2012-11-04T02:00:00-05:00"),
        ("2012-11-04T00:00:00-04:00", "0 1 * * *", "2012-11-04T01:00:00-04:00"),  # runs twice
        ("2012-11-04T01:00:00-04:00", "0 1 * * *", "2012-11-04T01:00:00-05:00"),
        ("2012-11-04T01:00:00-05:00", "0 1 * * *", "2012-11-05T01:00:00-05:00"),
        ("2012-11-04T00:00:00-04:00", "0 2 * * *", "2012-11-04T02:00:00-05:00"),
        ("2012-11-04T02:00:00-05:00", "0 2 * * *", "2012-11-05T02:00:00-05:00"),
        ("2012-11-04T00:00:00-04:00", "0 3 * * *", "2012-11-04T03:00:00-05:00"),
        # the same rules in 2024, inside the window of cached offset changes
        ("2024-03-10T01:00:00-05:00", "0 * * * *", "2024-03-10T03:00:00-04:00"),
        ("2024-03-10T00:00:00-05:00", "0 2 * * *", "2024-03-11T02:00:00-04:00"),
        ("2024-11-03T01:00:00-04:00", "0 1 * * *", "2024-11-03T01:00:00-05:00"),
    ],
)
def test_next_after_follows_robfig_cron_across_dst(start: str, expr: str, expected: str) -> None:
    schedule = Schedule.parse(expr, "America/New_York", tolerance_s=0)
    assert schedule.next_after(at(start)) == at(expected)
    assert schedule.previous_at_or_before(at(expected)) == at(expected)
    assert schedule.previous_at_or_before(at(expected) - TICK) <= at(start)


@pytest.mark.parametrize(
    ("expr", "tz", "fire", "previous", "following"),
    [
        ("0 * * * *", "UTC", "2026-03-05T10:00Z", "2026-03-05T09:00Z", "2026-03-05T11:00Z"),
        ("* * * * *", "UTC", "2026-03-05T10:00Z", "2026-03-05T09:59Z", "2026-03-05T10:01Z"),
        ("0 9 * * 1-5", "UTC", "2026-03-09T09:00Z", "2026-03-06T09:00Z", "2026-03-10T09:00Z"),
        ("0 0 1 * *", "UTC", "2024-03-01T00:00Z", "2024-02-01T00:00Z", "2024-04-01T00:00Z"),
        ("30 1 * * *", "America/New_York", "2026-11-01T01:30-04:00", "2026-10-31T01:30-04:00",
         "2026-11-01T01:30-05:00"),
        ("30 1 * * *", "America/New_York", "2026-11-01T01:30-05:00", "2026-11-01T01:30-04:00",
         "2026-11-02T01:30-05:00"),
        ("0 * * * *", "America/New_York", "2026-03-08T03:00-04:00", "2026-03-08T01:00-05:00",
         "2026-03-08T04:00-04:00"),
    ],
)  # fmt: skip
def test_queries_exactly_at_a_fire_time(
    expr: str, tz: str, fire: str, previous: str, following: str
) -> None:
    # croniter's get_prev/get_next are strict; these queries are inclusive or strict by name.
    schedule = Schedule.parse(expr, tz, tolerance_s=0)
    f, p, n = at(fire), at(previous), at(following)
    assert schedule.previous_at_or_before(f) == f
    assert schedule.previous_at_or_before(f + 0.5) == f
    assert schedule.previous_at_or_before(f - TICK) == p
    assert schedule.next_after(f) == n
    assert schedule.next_after(f - TICK) == f
    assert schedule.next_after(p) == f
    assert schedule.slot_for(f) == f
    assert schedule.slot_for(f - TICK) == p
    assert all(isinstance(v, int) for v in (schedule.slot_for(f), schedule.next_after(f)))


# ---------------------------------------------------------------------------------------------
# Whole years against an oracle: croniter's naive wall times, each mapped to every instant
# that shows it on the zone's clock (two in a repeated hour, none in a skipped one).
# ---------------------------------------------------------------------------------------------


def fires_by_wall_time(expr: str, tz: str, start_s: int, end_s: int) -> list[int]:
    zone = ZoneInfo(tz)
    naive_start = datetime.fromtimestamp(start_s, UTC).replace(tzinfo=None) - timedelta(days=2)
    naive_end = datetime.fromtimestamp(end_s, UTC).replace(tzinfo=None) + timedelta(days=2)
    walls = croniter(expr, naive_start)
    found = set()
    while (wall := walls.get_next(datetime)) <= naive_end:
        for fold in (0, 1):
            instant = int(wall.replace(tzinfo=zone, fold=fold).timestamp())
            if datetime.fromtimestamp(instant, zone).replace(tzinfo=None) == wall:
                found.add(instant)
    return sorted(u for u in found if start_s <= u < end_s)


def chain(schedule: Schedule, start_s: int, end_s: int) -> list[int]:
    fires = []
    t = schedule.next_after(start_s - 1)
    while t < end_s:
        fires.append(t)
        t = schedule.next_after(t)
    return fires


@pytest.mark.parametrize(
    ("expr", "tz", "years"),
    [
        ("30 2 * * *", "Europe/Berlin", (2024, 2025)),
        ("30 1 * * *", "America/New_York", (2024, 2025)),
        ("0 9 * * 1-5", "Europe/Berlin", (2026, 2027)),
        ("0 9 * * 1-5", "America/New_York", (2012, 2013)),
        ("45 1 * * *", "Australia/Lord_Howe", (2024, 2025)),  # a 30-minute DST shift
        ("0 0 * * *", "America/Sao_Paulo", (2017, 2019)),  # DST began at midnight
        ("0 0 1 * *", "Europe/Berlin", (2020, 2030)),
        ("30 2 26 3 *", "Europe/Berlin", (2020, 2049)),
        ("0 0 29 2 *", "Europe/Berlin", (2000, 2060)),
        ("0 0 * * 0", "Asia/Tehran", (2015, 2024)),  # DST on fixed dates, abolished 2022
        ("0 0 * * 0", "Asia/Tehran", (2020, 2024)),
    ],
)
def test_whole_years_match_the_wall_time_oracle(expr: str, tz: str, years: tuple[int, int]) -> None:
    start_s = int(datetime(years[0], 1, 1, tzinfo=UTC).timestamp())
    end_s = int(datetime(years[1], 1, 1, tzinfo=UTC).timestamp())
    schedule = Schedule.parse(expr, tz, tolerance_s=0)
    expected = fires_by_wall_time(expr, tz, start_s, end_s)
    assert chain(schedule, start_s, end_s) == expected
    gaps = [b - a for a, b in itertools.pairwise(expected)]
    if years[0] >= 2020 and years[1] <= 2049:
        # The gaps are measured over the DST changes from 2020 to 2048; earlier ones differ
        # (Sao Paulo's skipped midnights until 2019, Tehran's Sunday change in 2015).
        assert schedule.min_gap_s <= min(gaps)
        assert max(gaps) <= schedule.max_gap_s
    backwards = [schedule.previous_at_or_before(u) for u in expected]
    assert backwards == expected
    assert [schedule.previous_at_or_before(u - 1) for u in expected[1:]] == expected[:-1]


# ---------------------------------------------------------------------------------------------
# Properties, on short windows around DST changes checked against a minute-by-minute oracle
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    expr: str
    tz: str
    tolerance_s: float
    matches: Callable[[datetime], bool]

    def __str__(self) -> str:
        return f"{self.expr!r} in {self.tz}, tolerance {self.tolerance_s}s"


CASES = [
    Case("* * * * *", "UTC", 20, lambda w: True),
    Case("*/5 * * * *", "Europe/Berlin", 30, lambda w: w.minute % 5 == 0),
    Case("0 * * * *", "America/New_York", 29.5, lambda w: w.minute == 0),
    Case("30 2 * * *", "Europe/Berlin", 30, lambda w: (w.hour, w.minute) == (2, 30)),
    Case("30 1 * * *", "America/New_York", 12.25, lambda w: (w.hour, w.minute) == (1, 30)),
    Case("@daily", "America/New_York", 30, lambda w: (w.hour, w.minute) == (0, 0)),
    Case(
        "0 9 * * 1-5", "Europe/Berlin", 30, lambda w: (w.hour, w.minute) == (9, 0) and w.weekday() < 5
    ),
    Case(
        "0 9 * * 1-5", "America/New_York", 0, lambda w: (w.hour, w.minute) == (9, 0) and w.weekday() < 5
    ),
]  # fmt: skip
YEARS = (2012, 2026, 2061)  # before, inside and after the window of cached offset changes


def dst_change_days(tz: str, year: int) -> list[date]:
    zone = ZoneInfo(tz)
    noon = datetime(year, 1, 1, 12, tzinfo=UTC)
    offsets = [(noon + timedelta(days=d)).astimezone(zone).utcoffset() for d in range(366)]
    return [
        (noon + timedelta(days=d)).date() for d in range(1, 366) if offsets[d] != offsets[d - 1]
    ]


@cache
def windows(tz: str) -> list[tuple[int, int]]:
    centres = [day for year in YEARS for day in dst_change_days(tz, year)]
    centres = centres or [date(year, 7, 1) for year in YEARS]
    out = []
    for centre in centres:
        midnight = int(datetime(centre.year, centre.month, centre.day, tzinfo=UTC).timestamp())
        out.append((midnight - 4 * DAY_S, midnight + 4 * DAY_S))
    return out


@cache
def oracle_fires(case_index: int, window_index: int) -> list[int]:
    case = CASES[case_index]
    zone = ZoneInfo(case.tz)
    start, end = windows(case.tz)[window_index]
    return [u for u in range(start, end, 60) if case.matches(datetime.fromtimestamp(u, zone))]


@st.composite
def case_and_window(draw: st.DrawFn) -> tuple[Case, list[int]]:
    case_index = draw(st.integers(0, len(CASES) - 1))
    window_index = draw(st.integers(0, len(windows(CASES[case_index].tz)) - 1))
    return CASES[case_index], oracle_fires(case_index, window_index)


# k / 2**20 of an interval: exact in binary, so now + tolerance is computed exactly.
fractions = st.integers(0, 2**20 - 1).map(lambda k: k / 2**20)
PROPERTY_SETTINGS = settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(case_and_window(), fractions)
def test_slot_is_the_latest_fire_time_at_or_before_now_plus_tolerance(
    case_window: tuple[Case, list[int]], fraction: float
) -> None:
    case, fires = case_window
    low, high = fires[0] - case.tolerance_s, fires[-1] - case.tolerance_s
    now = low + fraction * (high - low)
    expected = fires[bisect_right(fires, now + case.tolerance_s) - 1]
    assert Schedule.parse(case.expr, case.tz, case.tolerance_s).slot_for(now) == expected, case


@PROPERTY_SETTINGS
@given(case_and_window(), st.data())
def test_every_clock_reading_from_f_minus_tolerance_to_the_next_minus_tolerance_gets_f(
    case_window: tuple[Case, list[int]], data: st.DataObject
) -> None:
    """A runner whose clock is behind by up to the tolerance, or that starts late, agrees."""
    case, fires = case_window
    schedule = Schedule.parse(case.expr, case.tz, case.tolerance_s)
    i = data.draw(st.integers(0, len(fires) - 2))
    fire, following = fires[i], fires[i + 1]
    fraction = data.draw(fractions)
    for now in (
        fire - case.tolerance_s,
        fire - case.tolerance_s + fraction * (following - fire),
        following - case.tolerance_s - 2.0**-20,
    ):
        assert schedule.slot_for(now) == fire, (case, now)
    assert schedule.slot_for(following - case.tolerance_s) == following


@PROPERTY_SETTINGS
@given(st.sampled_from(CASES), st.integers(10**8, 2**32), fractions)
def test_every_slot_is_a_fire_time(case: Case, second: int, fraction: float) -> None:
    schedule = Schedule.parse(case.expr, case.tz, case.tolerance_s)
    now = second + fraction
    slot = schedule.slot_for(now)
    assert slot % 60 == 0
    assert case.matches(datetime.fromtimestamp(slot, ZoneInfo(case.tz))), (case, now, slot)
    assert slot <= now + case.tolerance_s
    following = schedule.next_after(slot)
    assert following > now + case.tolerance_s
    assert case.matches(datetime.fromtimestamp(following, ZoneInfo(case.tz)))
    assert schedule.previous_at_or_before(following) == following
    assert schedule.min_gap_s <= following - slot <= schedule.max_gap_s


def test_threads_share_a_schedule() -> None:
    schedule = Schedule.parse("*/5 * * * *", "Europe/Berlin")
    start = int(at("2026-10-24T00:00Z"))
    times = [start + 7 * i for i in range(3000)]
    expected = [schedule.slot_for(t) for t in times]
    results: dict[int, list[int]] = {}

    def work(n: int) -> None:
        results[n] = [schedule.slot_for(t) for t in times]

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result == expected for result in results.values())
    assert len(results) == 4


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    expr=st.sampled_from(["*/5 * * * *", "30 2 * * *", "0 9 * * 1-5", "15,45 */3 * * *"]),
    tz=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
    times=st.lists(st.integers(1_700_000_000, 1_800_000_000), min_size=1, max_size=30),
)
def test_remembered_answers_equal_fresh_ones(expr: str, tz: str, times: list[int]) -> None:
    """next_after and previous_at_or_before remember recent answers (serve asks them of many
    tasks that share a schedule): interleaved queries answer as a fresh schedule would."""
    shared = Schedule.parse(expr, tz, 0.0)
    for t in times:
        for probe in (t, t + 1, t - 59):
            fresh = slots.Schedule._build(expr, tz, 0.0)
            assert shared.next_after(probe) == fresh.next_after(probe)
            assert shared.previous_at_or_before(probe) == fresh.previous_at_or_before(probe)
