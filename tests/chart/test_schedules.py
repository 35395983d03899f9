"""The chart refuses at render the schedules the API server would refuse (issue 13 item 4):
robfig/cron's ParseStandard and TZ in a schedule, with a message that names the task. Checked
against runner/cronexpr.py, which tests/schedule/test_robfig_oracle.py checks against robfig."""

from __future__ import annotations

import random

import pytest
from helm_python import HelmRenderError, HelmValuesError
from helm_python.chart import Chart

from runner.schedule import cron as cronexpr
from tests.chart.helpers import render
from tests.schedule.test_robfig_oracle import expression

REDIS = {"host": "redis"}


def values(schedules: dict[str, str]) -> dict[str, object]:
    return {
        "redis": REDIS,
        "tasks": {n: {"schedule": s, "task": "x"} for n, s in schedules.items()},
    }


def refusal(chart: Chart, schedule: str) -> str | None:
    try:
        render(chart, values({"report": schedule}))
    except (HelmRenderError, HelmValuesError) as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    ("schedule", "reason"),
    [
        ("0 2 * * 7", 'day-of-week field "7": out of range 0-6'),
        ("0 2 * * 5-7", 'day-of-week field "5-7": out of range 0-6'),
        ("TZ=Europe/Berlin 0 2 * * *", "a time zone (TZ= or CRON_TZ=) inside the schedule"),
        ("CRON_TZ=UTC 0 2 * * *", "a time zone (TZ= or CRON_TZ=) inside the schedule"),
        ("0 2 * *", "it has 4 fields: expected 5"),
        ("0 0 2 * * *", "it has 6 fields: expected 5"),
        ("@DAILY", 'unknown macro "@DAILY"'),
        ("@daily ", 'unknown macro "@daily "'),
        ("@reboot", 'unknown macro "@reboot"'),
        ("@every soon", '"soon" is not a Go duration'),
        ("60 * * * *", 'minute field "60": out of range 0-59'),
        ("0 0 0 * *", 'day-of-month field "0": out of range 1-31'),
        ("0 0 * 13 *", 'month field "13": out of range 1-12'),
        ("5-1 * * * *", 'minute field "5-1": the range runs backwards'),
        ("*/0 * * * *", 'the step "0" is not a positive number'),
        ("1-2-3 * * * *", "too many hyphens"),
        ("1/2/3 * * * *", "too many slashes"),
        ("0 0 L * *", '"L" is not a number'),
        ("0 0 * * mon#2", '"mon#2" is not a number or a name'),
    ],
)
def test_a_schedule_the_api_server_refuses_is_refused_naming_the_task(
    chart: Chart, schedule: str, reason: str
) -> None:
    message = refusal(chart, schedule)
    assert message is not None, schedule
    assert f'task "report": schedule "{schedule}" would be refused by Kubernetes: ' in message
    assert reason in message
    assert cronexpr_refuses(schedule)


def cronexpr_refuses(schedule: str) -> bool:
    try:
        cronexpr.parse(schedule)
    except cronexpr.CronSyntaxError:
        return True
    return False


def test_the_chart_accepts_what_kubernetes_accepts(chart: Chart) -> None:
    accepted = ["*,45 * * * *", "0 9 * * 1-1", "0 9 * * mon-MON", "0 0 1 jan-1 *",
                "*/19 * 18 * MON-5,*/1", "5/15 * * * *", "? * * * ?", "*-x * * * *",
                "+5 005 * * *", "1,,2 * * * mon,", "@every 1h30m", "@every 500ms", "@hourly",
                " 0 0 * * * ", "0\t0 * * *", "0 0 30 2 *"]  # fmt: skip
    rendered = render(chart, values({f"t{i}": s for i, s in enumerate(accepted)}))
    assert sorted(cj["spec"]["schedule"] for cj in rendered.of_kind("CronJob")) == sorted(accepted)


def test_the_chart_and_the_runner_agree_on_random_schedules(chart: Chart) -> None:
    rng = random.Random(7)
    schedules = [expression(rng, valid=rng.random() < 0.2) for _ in range(400)]
    # JSON and YAML cannot carry every character; the API server would get what they carry.
    schedules = [s for s in schedules if s.strip() and "\x1f" not in s]
    good = {f"t{i}": s for i, s in enumerate(schedules) if not cronexpr_refuses(s)}
    render(chart, values(good))  # all at once: none refused
    # The chart checks an @every duration's form, not Go's overflow past 292 years.
    overflows = {"@every 3000000h", "@every 2562047h47m16.854775808s"}
    bad = [s for s in schedules if cronexpr_refuses(s) and s not in overflows]
    assert len(good) > 60 and len(bad) > 60
    wrongly_accepted = [s for s in bad if refusal(chart, s) is None]
    assert wrongly_accepted == []


def test_the_watchdog_does_not_expect_an_every_task(chart: Chart) -> None:
    """Kubernetes accepts @every, whose fire times only the controller knows: the watchdog
    ignores such a task instead of failing on it every run."""
    rendered = render(
        chart,
        {**values({"hourly": "@every 1h", "nightly": "0 2 * * *"}), "watchdog": {"enabled": True}},
    )
    (watchdog,) = [c for c in rendered.of_kind("CronJob") if "watchdog" in c["metadata"]["name"]]
    args = watchdog["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--ignore" in args and args[args.index("--ignore") + 1] == "hourly"
    assert "nightly=0 2 * * *;UTC" in args
