"""Scheduling policies in the chart (issue 17): a task's overlap, catch-up, pause and rate limit
reach its CronJob's environment (a task's value replacing jobDefaults'), the CronJob's own
concurrencyPolicy follows the overlap, and a bad or contradicting value is refused at render,
naming the task. The templates refuse without the schema too (`--skip-schema-validation`)."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
from helm_python.chart import Chart

from tests.chart.helpers import Manifest, ci_values, container, env_of, render
from tests.chart.test_refusals import refused

REDIS = {"host": "redis"}
TASK = {"schedule": "0 * * * *", "task": "report"}
POLICIES = "11-scheduling-policies-values.yaml"
VARIABLES = {
    "overlap": "CRON_RUNNER_OVERLAP",
    "overlapWait": "CRON_RUNNER_OVERLAP_WAIT",
    "catchup": "CRON_RUNNER_CATCHUP",
    "catchupWindow": "CRON_RUNNER_CATCHUP_WINDOW",
    "pauseOnFailures": "CRON_RUNNER_PAUSE_ON_FAILURES",
    "rateLimit": "CRON_RUNNER_RATE_LIMIT",
}
FOLLOWS = {"skip": "Forbid", "buffer-one": "Allow", "replace": "Replace",
           "allow-other-slots": "Allow"}  # fmt: skip


def task_values(task: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    return {"redis": REDIS, "tasks": {"report": {**TASK, **(task or {})}}, **top}


def policy_env(cronjob: Manifest) -> dict[str, str]:
    env = env_of(container(cronjob))
    return {name: env[name]["value"] for name in VARIABLES.values() if name in env}


def report(chart: Chart, values: dict[str, Any]) -> Manifest:
    return render(chart, values).cronjobs()["report"]


# --- The environment ------------------------------------------------------------------------


def test_each_policy_reaches_the_cronjobs_environment(chart: Chart) -> None:
    cronjobs = render(chart, ci_values(POLICIES)).cronjobs()
    assert policy_env(cronjobs["billing"]) == {
        "CRON_RUNNER_OVERLAP": "skip",
        "CRON_RUNNER_OVERLAP_WAIT": "10m",
        "CRON_RUNNER_CATCHUP": "all",
        "CRON_RUNNER_CATCHUP_WINDOW": "6h",
        "CRON_RUNNER_PAUSE_ON_FAILURES": "5",
    }
    assert policy_env(cronjobs["digest"]) == {
        "CRON_RUNNER_OVERLAP": "skip",
        "CRON_RUNNER_OVERLAP_WAIT": "10m",
        "CRON_RUNNER_CATCHUP": "latest",
        "CRON_RUNNER_CATCHUP_WINDOW": "36h",
        "CRON_RUNNER_PAUSE_ON_FAILURES": "5",
        "CRON_RUNNER_RATE_LIMIT": "10/1m",
    }
    # A command task (exec) gets them as a registered one does.
    assert policy_env(cronjobs["rebuild-index"]) == {
        "CRON_RUNNER_OVERLAP": "replace",
        "CRON_RUNNER_OVERLAP_WAIT": "2m",
        "CRON_RUNNER_PAUSE_ON_FAILURES": "5",
    }
    assert container(cronjobs["rebuild-index"])["args"][0] == "exec"


def test_a_tasks_value_replaces_the_default_and_an_explicit_default_is_written(
    chart: Chart,
) -> None:
    # jobDefaults as in the policies example; sync sets nothing, crawl replaces two, and an
    # explicit 0 or skip is written: it must win over the task's own @task(...) arguments.
    cronjobs = render(chart, ci_values(POLICIES)).cronjobs()
    assert policy_env(cronjobs["sync"]) == {
        "CRON_RUNNER_OVERLAP": "buffer-one",
        "CRON_RUNNER_OVERLAP_WAIT": "10m",
        "CRON_RUNNER_PAUSE_ON_FAILURES": "5",
    }
    assert policy_env(cronjobs["crawl"]) == {
        "CRON_RUNNER_OVERLAP": "allow-other-slots",
        "CRON_RUNNER_OVERLAP_WAIT": "10m",
        "CRON_RUNNER_PAUSE_ON_FAILURES": "0",
    }


@pytest.mark.parametrize(
    ("field", "value", "written"),
    [
        ("overlapWait", 90, "90"),
        ("overlapWait", 1_000_000, "1000000"),
        ("overlapWait", 1.5, "1.5"),
        ("overlapWait", "500ms", "500ms"),
        ("catchupWindow", 0, "0"),
        ("catchupWindow", 86_400, "86400"),
        ("pauseOnFailures", 3, "3"),
        ("pauseOnFailures", 1_000_000, "1000000"),
        ("pauseOnFailures", "7", "7"),
    ],
)
def test_numbers_are_written_as_the_runner_reads_them(
    chart: Chart, field: str, value: Any, written: str
) -> None:
    # YAML numbers reach the templates as float64: 1000000 must not become 1e+06.
    assert policy_env(report(chart, task_values({field: value})))[VARIABLES[field]] == written


def test_set_flags_give_the_same_variables(chart: Chart) -> None:
    values: dict[str, Any] = {"redis": REDIS}
    for expression in (
        "tasks.report.schedule=0 * * * *",
        "tasks.report.task=report",
        "tasks.report.overlap=buffer-one",
        "tasks.report.overlapWait=600",
        "tasks.report.pauseOnFailures=3",
    ):
        parsed = helm_python.parse_set_string(expression)
        values.setdefault("tasks", {}).setdefault("report", {}).update(parsed["tasks"]["report"])
    assert policy_env(report(chart, values)) == {
        "CRON_RUNNER_OVERLAP": "buffer-one",
        "CRON_RUNNER_OVERLAP_WAIT": "600",
        "CRON_RUNNER_PAUSE_ON_FAILURES": "3",
    }


def test_a_rate_limit_goes_to_enqueueing_cronjobs_only(chart: Chart) -> None:
    # The enqueueing CronJob sends it in each message, as queue, retries and timeLimit; a task
    # that runs in its pod has no workers to limit, and ignores the default.
    values = {
        "redis": REDIS,
        "jobDefaults": {"rateLimit": "5/30s"},
        "tasks": {
            "report": {**TASK, "mode": "enqueue"},
            "mail": {**TASK, "mode": "enqueue", "rateLimit": "100/1h"},
            "local": TASK,
        },
    }
    cronjobs = render(chart, values).cronjobs()
    assert policy_env(cronjobs["report"]) == {"CRON_RUNNER_RATE_LIMIT": "5/30s"}
    assert policy_env(cronjobs["mail"]) == {"CRON_RUNNER_RATE_LIMIT": "100/1h"}
    assert policy_env(cronjobs["local"]) == {}


def test_the_default_render_is_unchanged(chart: Chart) -> None:
    # No policy set: no variable, and Forbid as before. The same with every policy key given
    # its empty default explicitly, in jobDefaults and in the task (but rateLimit, for queue
    # mode only, as queue and retries: a run task that has the key is refused).
    for name in ("01-defaults-one-task-values.yaml", "03-command-task-values.yaml",
                 "08-queue-mode-workers-values.yaml"):  # fmt: skip
        for cj in render(chart, ci_values(name)).cronjobs().values():
            assert policy_env(cj) == {}
            assert cj["spec"]["concurrencyPolicy"] == "Forbid"
    empty = {"concurrencyPolicy": "", "overlap": "", "overlapWait": "", "catchup": "",
             "catchupWindow": "", "pauseOnFailures": None, "rateLimit": ""}  # fmt: skip
    plain = ci_values("01-defaults-one-task-values.yaml")
    explicit = ci_values("01-defaults-one-task-values.yaml")
    explicit["jobDefaults"] = {**explicit.get("jobDefaults", {}), **empty}
    for task in explicit["tasks"].values():
        task.update({k: v for k, v in empty.items() if v is not None and k != "rateLimit"})
    assert render(chart, explicit).docs == render(chart, plain).docs


# --- concurrencyPolicy ----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["task", "jobDefaults"])
@pytest.mark.parametrize(("overlap", "policy"), [*FOLLOWS.items(), (None, "Forbid")])
def test_concurrency_policy_follows_overlap(
    chart: Chart, where: str, overlap: str | None, policy: str
) -> None:
    # buffer-one and allow-other-slots need the next slot's pod to start (to wait, or to run
    # beside); with replace, Kubernetes stops the running pod of this cluster itself.
    setting = {} if overlap is None else {"overlap": overlap}
    values = task_values(setting) if where == "task" else task_values(jobDefaults=setting)
    assert report(chart, values)["spec"]["concurrencyPolicy"] == policy


@pytest.mark.parametrize(
    ("overlap", "policy"),
    [("skip", "Allow"), ("skip", "Forbid"), ("replace", "Allow"), ("replace", "Replace"),
     ("buffer-one", "Allow"), ("allow-other-slots", "Allow"), (None, "Allow"),
     (None, "Replace")],
)  # fmt: skip
def test_a_concurrency_policy_that_agrees_with_overlap_is_kept(
    chart: Chart, overlap: str | None, policy: str
) -> None:
    # With no overlap in the values the chart cannot know a registered task's @task(overlap=):
    # the user's concurrencyPolicy stands (NOTES warns about Replace).
    task: dict[str, Any] = {"concurrencyPolicy": policy}
    if overlap is not None:
        task["overlap"] = overlap
    assert report(chart, task_values(task))["spec"]["concurrencyPolicy"] == policy


CONTRADICTIONS = [
    ("skip", "Replace", "Kubernetes stops the running slot's pod"),
    ("buffer-one", "Forbid", "so no slot waits to run after it"),
    ("buffer-one", "Replace", "instead of letting the next one wait for it"),
    ("replace", "Forbid", "so nothing replaces it"),
    ("allow-other-slots", "Forbid", "so slots never run side by side"),
    ("allow-other-slots", "Replace", "so slots never run side by side"),
]


@pytest.mark.parametrize(("overlap", "policy", "why"), CONTRADICTIONS)
def test_a_concurrency_policy_that_contradicts_overlap_is_refused(
    chart: Chart, schemaless: Chart, overlap: str, policy: str, why: str
) -> None:
    values = task_values({"overlap": overlap, "concurrencyPolicy": policy})
    for engine in (chart, schemaless):
        message = refused(engine, values)
        assert (
            f'task "report": concurrencyPolicy {policy} contradicts overlap {overlap}: ' in message
        )
        assert why in message
        assert f'set the task\'s concurrencyPolicy to {FOLLOWS[overlap]}, or to ""' in message


def test_a_contradiction_names_jobdefaults_when_a_value_comes_from_there(chart: Chart) -> None:
    message = refused(
        chart, task_values({"overlap": "buffer-one"}, jobDefaults={"concurrencyPolicy": "Forbid"})
    )
    assert (
        'task "report": concurrencyPolicy Forbid (from jobDefaults) contradicts overlap buffer-one:'
        in message
    )
    message = refused(
        chart, task_values({"concurrencyPolicy": "Forbid"}, jobDefaults={"overlap": "replace"})
    )
    assert (
        'task "report": concurrencyPolicy Forbid contradicts overlap replace (from jobDefaults):'
        in message
    )
    # The task sets the policy that follows, or "" to follow: it renders.
    fixed = task_values(
        {"overlap": "buffer-one", "concurrencyPolicy": ""},
        jobDefaults={"concurrencyPolicy": "Forbid"},
    )
    assert report(chart, fixed)["spec"]["concurrencyPolicy"] == "Allow"


# --- Bad values -----------------------------------------------------------------------------

ENQUEUE = {"mode": "enqueue"}


@pytest.mark.parametrize(
    ("task", "schema_says", "template_says"),
    [
        ({"overlap": "cancel-other"}, "at '/tasks/report/overlap'",
         'task "report": overlap "cancel-other" is not valid: expected skip, buffer-one, '
         "replace, allow-other-slots"),
        ({"overlap": "Skip"}, "at '/tasks/report/overlap'", 'overlap "Skip" is not valid'),
        ({"catchup": "some"}, "at '/tasks/report/catchup'",
         'task "report": catchup "some" is not valid: expected none, latest, all'),
        ({"overlapWait": "-5s"}, "at '/tasks/report/overlapWait'",
         'task "report": overlapWait "-5s" is not valid (it is negative): expected a number of '
         "seconds, or a number with ms, s, m or h"),
        ({"overlapWait": -5}, "at '/tasks/report/overlapWait'",
         'task "report": overlapWait -5 is not valid (it is negative)'),
        ({"overlapWait": "5 minutes"}, "at '/tasks/report/overlapWait'",
         'task "report": overlapWait "5 minutes" is not valid (it is not a duration)'),
        ({"overlapWait": "1h30m"}, "at '/tasks/report/overlapWait'",
         'overlapWait "1h30m" is not valid (it is not a duration)'),
        ({"overlapWait": "0s"}, None, 'task "report": overlapWait "0s" must be above 0'),
        ({"catchupWindow": "-1h"}, "at '/tasks/report/catchupWindow'",
         'task "report": catchupWindow "-1h" is not valid (it is negative)'),
        ({"catchupWindow": "1d"}, "at '/tasks/report/catchupWindow'",
         'task "report": catchupWindow "1d" is not valid (it is not a duration)'),
        ({"catchup": "latest"}, None,
         'task "report": catchup latest needs a catchupWindow above 0'),
        ({"catchup": "all", "catchupWindow": "0s"}, None,
         'task "report": catchup all needs a catchupWindow above 0'),
        ({"catchup": "latest", "catchupWindow": "6h", "overlap": "allow-other-slots"}, None,
         'task "report": catchup latest and overlap allow-other-slots cannot go together'),
        ({"pauseOnFailures": -1}, "at '/tasks/report/pauseOnFailures'",
         'task "report": pauseOnFailures -1 is not valid: expected a whole number, 0 or more'),
        ({"pauseOnFailures": 2.5}, "at '/tasks/report/pauseOnFailures'",
         'task "report": pauseOnFailures 2.5 is not valid'),
        ({"pauseOnFailures": "three"}, "at '/tasks/report/pauseOnFailures'",
         'task "report": pauseOnFailures "three" is not valid'),
        ({"pauseOnFailures": True}, "at '/tasks/report/pauseOnFailures'",
         'task "report": pauseOnFailures true is not valid'),
        ({**ENQUEUE, "rateLimit": "10 per minute"}, "at '/tasks/report/rateLimit'",
         'task "report": rateLimit "10 per minute" is not valid: expected N/DURATION'),
        ({**ENQUEUE, "rateLimit": "0/1m"}, "at '/tasks/report/rateLimit'",
         'task "report": rateLimit "0/1m" is not valid'),
        ({**ENQUEUE, "rateLimit": "10/0s"}, None, 'task "report": rateLimit "10/0s" is not valid'),
        ({**ENQUEUE, "rateLimit": "10/-1m"}, "at '/tasks/report/rateLimit'",
         'task "report": rateLimit "10/-1m" is not valid'),
        ({"mode": "run", "rateLimit": "10/1m"}, "at '/tasks/report'",
         'task "report": rateLimit: for queue mode only'),
        ({"rateLimit": "10/1m"}, None, 'task "report": rateLimit: for queue mode only'),
    ],
    ids=["overlap", "overlap-case", "catchup", "wait-negative", "wait-negative-number",
         "wait-words", "wait-compound", "wait-zero", "window-negative", "window-days",
         "latest-no-window", "all-zero-window", "catchup-allow-other-slots", "pause-negative",
         "pause-fraction", "pause-word", "pause-bool", "rate-words", "rate-zero-count",
         "rate-zero-window", "rate-negative-window", "rate-run-mode", "rate-default-mode"],
)  # fmt: skip
def test_a_bad_policy_is_refused_naming_the_task(
    chart: Chart,
    schemaless: Chart,
    task: dict[str, Any],
    schema_says: str | None,
    template_says: str,
) -> None:
    values = task_values(task)
    if schema_says is not None:
        assert schema_says in refused(chart, values)
    else:
        assert template_says in refused(chart, values)
    assert template_says in refused(schemaless, values)


@pytest.mark.parametrize(
    ("defaults", "schema_says", "template_says"),
    [
        ({"overlap": "bogus"}, "at '/jobDefaults/overlap'",
         'task "report": overlap "bogus" (from jobDefaults) is not valid'),
        ({"catchup": "latest"}, None,
         'task "report": catchup latest (from jobDefaults) needs a catchupWindow above 0'),
        ({"pauseOnFailures": -2}, "at '/jobDefaults/pauseOnFailures'",
         'task "report": pauseOnFailures -2 (from jobDefaults) is not valid'),
        ({"overlap": "allow-other-slots", "catchup": "all", "catchupWindow": "1h"}, None,
         "catchup all (from jobDefaults) and overlap allow-other-slots (from jobDefaults)"),
    ],
    ids=["overlap", "catchup-no-window", "pause", "catchup-allow-other-slots"],
)  # fmt: skip
def test_a_bad_default_is_refused_naming_the_task_and_jobdefaults(
    chart: Chart,
    schemaless: Chart,
    defaults: dict[str, Any],
    schema_says: str | None,
    template_says: str,
) -> None:
    values = task_values(jobDefaults=defaults)
    assert (schema_says or template_says) in refused(chart, values)
    assert template_says in refused(schemaless, values)


@pytest.mark.parametrize(
    ("window", "top", "task_env", "says"),
    [
        ("2h", {"slotRetention": "1h"}, None, "runner.slotRetention: 1h"),
        ("1h", {"slotRetention": "3600"}, None, "runner.slotRetention: 3600"),
        ("2h", {"env": {"CRON_RUNNER_SLOT_RETENTION": "90m"}}, None,
         "CRON_RUNNER_SLOT_RETENTION in runner.env: 90m"),
        ("2h", {"slotRetention": "24h"}, {"CRON_RUNNER_SLOT_RETENTION": "30m"},
         "CRON_RUNNER_SLOT_RETENTION in the task's env: 30m"),
    ],
    ids=["shorter", "equal", "runner-env", "task-env"],
)  # fmt: skip
def test_a_catchup_window_longer_than_the_slot_markers_last_is_refused(
    chart: Chart, window: str, top: dict[str, Any], task_env: dict[str, str] | None, says: str
) -> None:
    # The runner refuses it too (78): a slot whose marker expired would look unrun, and run again.
    task: dict[str, Any] = {"catchup": "all", "catchupWindow": window}
    if task_env:
        task["env"] = task_env
    message = refused(chart, task_values(task, runner=top))
    assert (
        f'task "report": catchupWindow {window} reaches back further than slot markers are kept'
        in message
    )
    assert f"({says})" in message


def test_a_catchup_window_within_the_slot_retention_renders(chart: Chart) -> None:
    task = {"catchup": "latest", "catchupWindow": "6h"}
    cj = report(chart, task_values(task, runner={"slotRetention": "7h"}))
    assert policy_env(cj)["CRON_RUNNER_CATCHUP_WINDOW"] == "6h"
    # Empty: the runner keeps the markers for the window plus the schedule's shortest gap.
    assert policy_env(report(chart, task_values(task)))["CRON_RUNNER_CATCHUP"] == "latest"


# --- podFailurePolicy and NOTES -------------------------------------------------------------


def test_a_replaced_slot_fails_its_job_at_once(chart: Chart) -> None:
    # 79 (`replaced`): a retried pod would in turn replace the slot that replaced it.
    for cj in render(chart, ci_values(POLICIES)).cronjobs().values():
        rules = cj["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
        fail_job = next(r for r in rules if r["action"] == "FailJob")
        assert 79 in fail_job["onExitCodes"]["values"]


def test_notes_show_each_tasks_policies(chart: Chart) -> None:
    notes = render(chart, ci_values(POLICIES)).notes
    expected = {
        "sync": [
            "Overlap:    buffer-one, waiting at most 10m; concurrencyPolicy Allow",
            "Catch-up:   none (default)",
            "Pause:      after 5 failed runs in a row, everywhere; `cron-runner resume sync` ends it",
        ],
        "rebuild-index": ["Overlap:    replace, waiting at most 2m; concurrencyPolicy Replace"],
        "crawl": [
            "Overlap:    allow-other-slots, waiting at most 10m; concurrencyPolicy Allow",
            "Pause:      never\n",
        ],
        "billing": [
            "Overlap:    skip, waiting at most 10m; concurrencyPolicy Forbid",
            "Catch-up:   every missed slot within 6h, oldest first",
        ],
        "digest": [
            "Catch-up:   the latest missed slot within 36h",
            "Rate limit: at most 10 starts in any 1m, across every worker",
        ],
    }
    for task, lines in expected.items():
        block = notes.split(f"\n  {task}: ", 1)[1].split("\n\n", 1)[0] + "\n"
        for line in lines:
            assert f"    {line}" in block, (task, line, block)
    assert "WARNING" not in notes


def test_notes_show_the_defaults_and_no_rate_limit_for_a_task_run_in_its_pod(
    chart: Chart,
) -> None:
    notes = render(chart, task_values({"overlapWait": 90, "catchupWindow": 3600})).notes
    assert "Overlap:    skip (default), waiting at most 90s; concurrencyPolicy Forbid" in notes
    assert "Catch-up:   none (default), window 3600s" in notes
    assert "Pause:      never (default)" in notes
    assert "Rate limit" not in notes
    notes = render(chart, task_values(ENQUEUE)).notes
    assert "Rate limit: none (default)" in notes


def test_notes_warn_about_replace_without_overlap(chart: Chart) -> None:
    # Kubernetes stops the running pod and the new slot finds the lease held: neither finishes.
    notes = render(chart, task_values({"concurrencyPolicy": "Replace"})).notes
    assert (
        "WARNING: task report has concurrencyPolicy Replace and no overlap in the values" in notes
    )
    assert "(unless its @task(overlap=) says otherwise)" in notes
    assert "Set overlap:\nreplace" in notes
    command_task = {"schedule": "0 * * * *", "command": ["x"], "concurrencyPolicy": "Replace"}
    command = render(chart, {"redis": REDIS, "tasks": {"report": command_task}})
    assert "WARNING: task report has concurrencyPolicy Replace" in command.notes
    assert "@task(overlap=)" not in command.notes
    agreed = task_values({"overlap": "replace", "concurrencyPolicy": "Replace"})
    assert "WARNING" not in render(chart, agreed).notes
