"""Catch-up's settings and pure parts: the values, their refusals (each naming its setting), the
window's candidates, the marker retention and the starting deadline it grows, and the choice
among the unrun slots (runner.schedule.catchup; docs/design.md, Catch-up, trigger and
backfill)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from runner.config.settings import Settings, load_settings
from runner.errors import ConfigError
from runner.schedule.catchup import candidates, check_catchup, chosen, starting_deadline_s
from runner.schedule.markers import retention_s
from runner.schedule.slots import Schedule
from runner.tasks import catchup_options, task

AT_13 = int(datetime(2026, 3, 4, 13, 0, tzinfo=UTC).timestamp())
HOUR = 3600


def settings(**env: str) -> Settings:
    return load_settings({f"CRON_RUNNER_{k}": v for k, v in env.items()})


def test_off_by_default_and_read_from_flags_before_variables() -> None:
    s = settings()
    assert (s.slots.catchup, s.slots.catchup_window_s, s.slots.catches_up) == (None, None, False)
    s = load_settings(
        {"CRON_RUNNER_CATCHUP": "latest", "CRON_RUNNER_CATCHUP_WINDOW": "1h"},
        {"CATCHUP": "ALL", "CATCHUP_WINDOW": "90m"},
    )
    assert (s.slots.catchup, s.slots.catchup_window_s, s.slots.catches_up) == ("all", 5400, True)
    assert not settings(CATCHUP="none").slots.catches_up


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        ({"CATCHUP": "some"}, {}, "CRON_RUNNER_CATCHUP='some' is not valid: expected one of none, latest, all"),
        ({}, {"CATCHUP": "every"}, "--catchup='every' is not valid"),
        ({"CATCHUP_WINDOW": "-1h"}, {}, "CRON_RUNNER_CATCHUP_WINDOW='-1h' is negative"),
        ({}, {"CATCHUP_WINDOW": "-5m"}, "--catchup-window='-5m' is negative"),
        ({"CATCHUP_WINDOW": "soon"}, {}, "CRON_RUNNER_CATCHUP_WINDOW='soon' is not a duration"),
    ],
)  # fmt: skip
def test_bad_values_name_their_setting(
    env: dict[str, str], flags: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings({f"CRON_RUNNER_{k}": v for k, v in env.items()}, flags)


@pytest.mark.parametrize(
    ("env", "overlap", "message"),
    [
        ({"CATCHUP": "all", "SCHEDULE": "0 * * * *"}, "skip", r"=all \(--catchup, @task\(catchup=\)\) needs a window"),
        ({"CATCHUP": "latest", "CATCHUP_WINDOW": "1h"}, "skip", r"CRON_RUNNER_CATCHUP=latest .* needs a schedule"),
        ({"CATCHUP": "all", "CATCHUP_WINDOW": "1h", "SCHEDULE": "0 * * * *"},
         "allow-other-slots", "cannot run with CRON_RUNNER_OVERLAP=allow-other-slots"),
        # 1,000 slots of a one-minute schedule is the most a window holds.
        ({"CATCHUP": "all", "CATCHUP_WINDOW": "1001m", "SCHEDULE": "* * * * *"}, "skip",
         r"=60060s \(--catchup-window, @task\(catchup_window=\)\) holds up to 1001 slots of '\* \* \* \* \*'.*at most 1000, a window of at "
         "most 60000s"),
        ({"CATCHUP": "all", "CATCHUP_WINDOW": "3h", "SCHEDULE": "0 * * * *",
          "SLOT_RETENTION": "4h"}, "skip",
         r"CRON_RUNNER_CATCHUP_WINDOW=10800s .* needs slot markers kept at least 14460s.*"
         "CRON_RUNNER_SLOT_RETENTION=14400s"),
        ({"CATCHUP": "all", "CATCHUP_WINDOW": "3h", "SCHEDULE": "@every 1h",
          "JOB_NAME": "x-29000000"}, "skip", "CRON_RUNNER_SCHEDULE: bad cron expression"),
    ],
)  # fmt: skip
def test_a_catchup_that_cannot_keep_its_promise_is_refused(
    env: dict[str, str], overlap: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_catchup(settings(**env), overlap)


def test_what_is_accepted() -> None:
    check_catchup(settings(CATCHUP="all", CATCHUP_WINDOW="1000m", SCHEDULE="* * * * *"), "skip")
    check_catchup(
        settings(CATCHUP="all", CATCHUP_WINDOW="3h", SCHEDULE="0 * * * *", SLOT_RETENTION="5h"),
        "replace",
    )
    # Off: nothing to check, whatever the rest says (a window alone, no schedule).
    check_catchup(settings(CATCHUP_WINDOW="3h"), "allow-other-slots")
    check_catchup(settings(CATCHUP="none"), "skip")


def test_candidates_are_the_windows_slots_before_the_own_oldest_first() -> None:
    s = settings(CATCHUP="all", CATCHUP_WINDOW="3h", SCHEDULE="0 * * * *")
    assert candidates(s, AT_13, AT_13 + 5) == [AT_13 - 3 * HOUR, AT_13 - 2 * HOUR, AT_13 - HOUR]
    assert candidates(s, None, AT_13 + 5) == []
    assert candidates(settings(SCHEDULE="0 * * * *"), AT_13, AT_13 + 5) == []
    half = settings(CATCHUP="all", CATCHUP_WINDOW="150m", SCHEDULE="0 * * * *")
    assert candidates(half, AT_13, AT_13 + 5) == [AT_13 - 2 * HOUR, AT_13 - HOUR]


def test_candidates_whose_markers_may_have_expired_are_left_out() -> None:
    # A CronJob pod of 13:00 retried at 15:30: markers are kept 3 h + 1 h + 2 * 30 s, so the
    # slots of 10:00 and 11:00 may have run and lost their markers since; at 17:30 every one.
    s = settings(CATCHUP="all", CATCHUP_WINDOW="3h", SCHEDULE="0 * * * *",
                 JOB_NAME=f"x-{AT_13 // 60}", CRONJOB_NAME="x")  # fmt: skip
    assert retention_s(s) == 4 * HOUR + 60
    assert candidates(s, AT_13, AT_13 + 2.5 * HOUR) == [AT_13 - HOUR]
    assert candidates(s, AT_13, AT_13 + 4.5 * HOUR) == []


def test_the_retention_grows_with_the_window_and_the_starting_deadline_too() -> None:
    hourly = settings(SCHEDULE="0 * * * *")
    assert retention_s(hourly) == 2 * HOUR
    assert retention_s(settings(SCHEDULE="0 * * * *", CATCHUP_WINDOW="10h")) == 2 * HOUR
    caught = settings(SCHEDULE="0 * * * *", CATCHUP="latest", CATCHUP_WINDOW="10h")
    assert retention_s(caught) == 11 * HOUR + 60
    # A daily schedule keeps its markers 2 days already: a 1 h window changes nothing.
    assert retention_s(settings(SCHEDULE="0 3 * * *", CATCHUP="all", CATCHUP_WINDOW="1h")) == (
        2 * 86_400
    )
    assert starting_deadline_s(hourly) == 300
    assert starting_deadline_s(caught) == 10 * HOUR
    assert starting_deadline_s(settings(CATCHUP="all", CATCHUP_WINDOW="1m")) == 300


@pytest.mark.parametrize(
    ("catchup", "expected"),
    [(None, ()), ("none", ()), ("latest", (3,)), ("all", (1, 2, 3))],
)
def test_latest_coalesces_all_runs_each(catchup: str | None, expected: tuple[int, ...]) -> None:
    assert chosen(catchup, (1, 2, 3)) == expected
    assert chosen(catchup, ()) == ()


def test_fire_times_between_two_instants_both_included() -> None:
    schedule = Schedule.parse("0 * * * *", "UTC", 0.0)
    assert schedule.fire_times(AT_13 - 2 * HOUR, AT_13, limit=10) == [
        AT_13 - 2 * HOUR, AT_13 - HOUR, AT_13
    ]  # fmt: skip
    assert schedule.fire_times(AT_13 - 2 * HOUR + 0.5, AT_13 - 1, limit=10) == [AT_13 - HOUR]
    assert schedule.fire_times(AT_13 + 1, AT_13 + 2, limit=10) == []
    assert len(schedule.fire_times(AT_13, AT_13 + 100 * HOUR, limit=7)) == 7
    # Across Berlin's fall-back the doubled hour is two slots, an hour apart.
    berlin = Schedule.parse("30 2 * * *", "Europe/Berlin", 0.0)
    day = int(datetime(2026, 10, 25, 0, 0, tzinfo=UTC).timestamp())
    assert [t - day for t in berlin.fire_times(day - 86_400, day + 86_400, limit=10)] == [
        30 * 60 - 86_400, 30 * 60, 90 * 60,
    ]  # fmt: skip


def test_task_options_are_checked_and_flags_win() -> None:
    @task("caught", catchup="latest", catchup_window="2h")
    def caught(ctx: object) -> None: ...

    assert catchup_options(caught) == (catchup_options(caught).__class__("latest", 7200.0))
    with pytest.raises(ConfigError, match=r"task 'x': catchup='most' is not valid"):
        task("x", catchup="most")
    with pytest.raises(ConfigError, match=r"task 'x': catchup_window=-1 is negative"):
        task("x", catchup_window=-1)

    from runner.cli.main import with_catchup  # noqa: PLC0415

    merged = with_catchup(settings(CATCHUP_WINDOW="5h"), catchup_options(caught))
    assert (merged.slots.catchup, merged.slots.catchup_window_s) == ("latest", 5 * HOUR)


def test_a_cronjob_pod_that_does_not_catch_up_needs_no_schedule_parser() -> None:
    code = (
        "import sys;"
        "from runner.config.settings import load_settings;"
        "from runner.run.execution import Execution;"
        "from runner.run.targets import PythonTarget;"
        "from runner.signals import Shutdown;"
        "s = load_settings({'CRON_RUNNER_JOB_NAME': 'x-29934000', 'CRON_RUNNER_CRONJOB_NAME': 'x',"
        " 'CRON_RUNNER_SCHEDULE': '* * * * *', 'CRON_RUNNER_CATCHUP_WINDOW': '1h'});"
        "Execution(s, None, 'x', PythonTarget(print), Shutdown());"
        "print([m for m in ('croniter', 'runner.schedule.cron') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]"]
