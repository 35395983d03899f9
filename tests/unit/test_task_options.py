"""``@task(overlap=, overlap_wait=)``: checked where the task is defined, and the defaults of the
settings that a flag or a CRON_RUNNER_* variable (the chart's per-task values) still overrides."""

from __future__ import annotations

import pytest

from runner.cli.main import with_task_options
from runner.config.settings import load_settings
from runner.errors import ConfigError
from runner.tasks import RunContext, RunOptions, run_options, task


def noop(ctx: RunContext) -> None:
    del ctx


def undecorated(ctx: RunContext) -> None:
    del ctx


def test_task_options_reach_the_settings_unless_a_variable_or_flag_set_them() -> None:
    fn = task("nightly", overlap="buffer-one", overlap_wait="2m")(noop)
    assert run_options(fn) == RunOptions("buffer-one", 120.0)
    from_task = with_task_options(load_settings({}), run_options(fn)).lease
    assert (from_task.overlap_policy, from_task.overlap_wait_s) == ("buffer-one", 120.0)
    env = {"CRON_RUNNER_OVERLAP": "replace", "CRON_RUNNER_OVERLAP_WAIT": "5s"}
    chart = with_task_options(load_settings(env), run_options(fn)).lease
    assert (chart.overlap_policy, chart.overlap_wait_s) == ("replace", 5.0)
    flag = with_task_options(load_settings(env, {"OVERLAP": "skip"}), run_options(fn)).lease
    assert flag.overlap_policy == "skip"


def test_an_undecorated_function_has_no_run_options() -> None:
    assert run_options(undecorated) == RunOptions()
    assert with_task_options(load_settings({}), RunOptions()).lease.overlap_policy == "skip"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"overlap": "Forbid"}, "overlap='Forbid' is not valid: expected one of skip, buffer-one"),
        ({"overlap_wait": "-1s"}, "overlap_wait='-1s' is not a duration"),
        ({"overlap_wait": 0}, "overlap_wait=0 must be positive"),
    ],
)
def test_bad_task_options_name_the_task_and_the_option(
    kwargs: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        task("nightly", **kwargs)  # type: ignore[arg-type]
    assert "task 'nightly'" in str(refused.value)
    assert named in str(refused.value)
