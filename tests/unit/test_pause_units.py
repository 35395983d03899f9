"""Pause's pure parts: --until's forms, the pause read from the meta hash and its window, the
missed-slot listing around a pause, and pause_on_failures from flags, variables and @task."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from runner.cli.main import with_task_options
from runner.config.settings import load_settings
from runner.config.sources import parse_time
from runner.errors import ConfigError
from runner.ops.pause import Pause, pause_of, pause_window
from runner.ops.report import overdue_text, pause_text
from runner.ops.state import Missed, TaskStatus, missed_slots
from runner.schedule.slots import Schedule
from runner.tasks import RunOptions, run_options, task


def t(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


# -- --until ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-02T06:00:00Z", t("2026-01-02T06:00:00")),
        ("2026-01-02T06:00:00z", t("2026-01-02T06:00:00")),
        ("2026-01-02T07:00:00+01:00", t("2026-01-02T06:00:00")),
        ("2026-01-02 06:00:00.5+00:00", t("2026-01-02T06:00:00") + 0.5),
        ("1767333600", 1_767_333_600),
        (" 1767333600.25 ", 1_767_333_600.25),
    ],
)
def test_until_reads_iso_8601_with_a_zone_or_epoch_seconds(text: str, expected: float) -> None:
    assert parse_time(text, "--until") == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2026-01-02T06:00:00", "names no time zone"),
        ("2026-01-02", "names no time zone"),
        ("next monday", "is not a time"),
        ("", "is not a time"),
        ("-5", "is not a time"),
        ("1e9", "is not a time"),
        ("١٧٦٧٣٣٣٦٠٠", "is not a time"),  # Arabic-Indic digits, which float() would read
        ("999999999999", "after the year 9999"),
    ],
)
def test_until_refuses_what_is_not_one_instant_everywhere(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_time(text, "--until")
    message = str(refused.value)
    assert message.startswith(f"--until={text!r}") and says in message
    assert "ISO 8601 with Z or an offset" in message


# -- the pause in force, and its window ------------------------------------------------------------


def test_the_pause_in_force_is_read_as_the_acquire_script_reads_it() -> None:
    fields = ["1", "ops", "100.5", "", "db"]
    assert pause_of(fields, 150) == Pause(by="ops", at=100.5, until=None, note="db")
    assert pause_of([b"1", b"ops", b"100.5", b"200", b""], 150) == Pause("ops", 100.5, 200, "")
    assert pause_of(["1", "ops", "100.5", "200", ""], 200) is None  # its end has come
    assert pause_of([None] * 5, 150) is None
    assert pause_of(["0", "ops", "100", "", ""], 150) is None


def test_the_window_of_the_last_pause() -> None:
    current = Pause(by="ops", at=100, until=None, note="")
    assert pause_window(current, {}, 500) == (100, 500)
    assert pause_window(None, {"paused_from": "100", "paused_to": "300"}, 500) == (100, 300)
    # An end still to come (a pause with --until, over by the clock of this reader).
    assert pause_window(None, {"paused_from": "100", "paused_to": "900"}, 500) == (100, 500)
    assert pause_window(None, {"paused_from": "100", "paused_to": ""}, 500) == (100, 500)
    assert pause_window(None, {}, 500) is None


@pytest.mark.parametrize(
    ("paused", "expected"),
    [
        (None, (t("2026-03-10T11:00"), t("2026-03-10T12:00"), t("2026-03-10T13:00"),
                t("2026-03-10T14:00"))),
        ((t("2026-03-10T10:30"), t("2026-03-10T12:30")),
         (t("2026-03-10T13:00"), t("2026-03-10T14:00"))),
        # A fire time at either end of the window was skipped as well.
        ((t("2026-03-10T11:00"), t("2026-03-10T13:00")), (t("2026-03-10T14:00"),)),
        # Still paused: nothing after its start is missed.
        ((t("2026-03-10T12:30"), t("2026-03-10T14:30")),
         (t("2026-03-10T11:00"), t("2026-03-10T12:00"))),
    ],
)  # fmt: skip
def test_the_fire_times_of_a_pause_are_not_missed(
    paused: tuple[float, float] | None, expected: tuple[int, ...]
) -> None:
    hourly = Schedule.parse("0 * * * *", "UTC", 0)
    got = missed_slots(hourly, now_s=t("2026-03-10T14:30"), tolerance_s=600,
                       covered_until_s=t("2026-03-10T10:00"), paused=paused)  # fmt: skip
    assert got.slots == expected


def test_a_long_pause_is_skipped_at_once_not_slot_by_slot() -> None:
    every_minute = Schedule.parse("* * * * *", "UTC", 0)
    year = 365 * 86_400
    got = missed_slots(every_minute, now_s=t("2026-03-10T00:00") + year, tolerance_s=0,
                       covered_until_s=t("2026-03-10T00:00"),
                       paused=(t("2026-03-10T00:00"), t("2026-03-10T00:00") + year))  # fmt: skip
    assert got.slots == ()


def _status(missed: Missed | None, paused: Pause | None) -> TaskStatus:
    return TaskStatus(
        task="t", holder=None, ttl_ms=None, fence=0, schedule="0 * * * *", timezone="UTC",
        last_slot=None, last_run_at=None, last_outcome=None, last_holder=None,
        last_success=None, last_failure=None, next_slot=None, missed=missed, paused=paused,
    )  # fmt: skip


def test_a_paused_task_is_not_overdue_and_says_what_it_missed_before() -> None:
    pause = Pause(by="ops", at=t("2026-03-10T10:30"), until=None, note="outage")
    before = Missed(0, (t("2026-03-10T10:00"),), False)
    assert _status(before, None).overdue is True
    assert _status(before, pause).overdue is False
    assert overdue_text(_status(before, pause)) == "no (paused; 1 missed before)"
    assert overdue_text(_status(Missed(0, (), False), pause)) == "no (paused)"
    assert _status(None, pause).overdue is None
    assert _status(None, pause).known
    assert pause_text(pause) == "by ops since 2026-03-10T10:30:00Z until resumed: outage"
    hostile = Pause(by="ops", at=None, until=t("2026-03-11T00:00"), note="\x1b[2Jgone")
    assert pause_text(hostile) == "by ops since ? until 2026-03-11T00:00:00Z: \\x1b[2Jgone"


# -- pause_on_failures ---------------------------------------------------------------------------


def test_pause_on_failures_from_the_variable_the_flag_and_the_task() -> None:
    assert load_settings({}).lease.pause_on_failures is None
    assert load_settings({}).lease.failures_before_pause == 0
    env = {"CRON_RUNNER_PAUSE_ON_FAILURES": "3"}
    assert load_settings(env).lease.failures_before_pause == 3
    assert load_settings(env, {"PAUSE_ON_FAILURES": "0"}).lease.pause_on_failures == 0

    @task("fragile-unit", pause_on_failures=5)
    def fragile(ctx: object) -> None: ...

    options = run_options(fragile)
    assert options == RunOptions(pause_on_failures=5)
    assert with_task_options(load_settings({}), options).lease.failures_before_pause == 5
    # A flag or a variable (the chart's per-task value) wins over @task, 0 included.
    assert with_task_options(load_settings(env), options).lease.failures_before_pause == 3
    off = load_settings({"CRON_RUNNER_PAUSE_ON_FAILURES": "0"})
    assert with_task_options(off, options).lease.failures_before_pause == 0
    assert run_options(lambda ctx: None) == RunOptions()


@pytest.mark.parametrize("value", ["-1", "1.5", "two", "10001", "³"])
def test_a_bad_pause_on_failures_names_the_setting(value: str) -> None:
    for env, flags, named in (({"CRON_RUNNER_PAUSE_ON_FAILURES": value}, {},
                               "CRON_RUNNER_PAUSE_ON_FAILURES"),
                              ({}, {"PAUSE_ON_FAILURES": value}, "--pause-on-failures")):  # fmt: skip
        with pytest.raises(ConfigError) as refused:
            load_settings(env, flags)
        assert f"{named}={value!r} is not valid" in str(refused.value)
        assert "0 for never" in str(refused.value)


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_a_bad_task_option_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="pause_on_failures="):
        task("bad-option", pause_on_failures=value)  # type: ignore[arg-type]
