"""What a new user meets in the first hour (issue 14): which cluster ran a slot, a status of a
task that does not exist, and text logs that read as text."""

from __future__ import annotations

import json
import re

import pytest

from runner.errors import ConfigError, UnknownTask
from runner.testing import RedisServer
from tests.helpers.proc import events, run, runner_env
from tests.helpers.wait import schedule_far_from_edges

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ERROR ")


def test_the_cluster_name_is_in_the_holder_logs_records_status_and_history(
    redis_server: RedisServer,
) -> None:
    env = runner_env(
        redis_server.url,
        CRON_RUNNER_CLUSTER_NAME="eu-west",
        CRON_RUNNER_SCHEDULE=schedule_far_from_edges(300),
    )
    ran = run(["exec", "--name", "report", "--holder", "pod-a", "--", "true"], env)
    assert ran.returncode == 0, ran.stderr
    lines = events(ran.stderr)
    assert lines and {e["holder"] for e in lines} == {"eu-west/pod-a"}

    status = json.loads(run(["status", "report", "-o", "json"], env).stdout)
    assert status["tasks"][0]["last_run"]["holder"] == "eu-west/pod-a"
    history = json.loads(run(["history", "report", "-o", "json"], env).stdout)
    assert history["runs"][0]["holder"] == "eu-west/pod-a"
    # The tables people read show it too.
    assert "eu-west/pod-a" in run(["status", "report"], env).stdout
    assert "eu-west/pod-a" in run(["history", "report"], env).stdout

    # A second cluster's run of the same slot skips, and says which cluster has it.
    other = run(
        ["exec", "--name", "report", "--holder", "pod-b", "--", "true"],
        {**env, "CRON_RUNNER_CLUSTER_NAME": "us-east"},
    )
    skipped = [e for e in events(other.stderr) if e["event"] == "skipped"]
    assert skipped[0]["holder"] == "us-east/pod-b"
    assert skipped[0]["run_holder"] == "eu-west/pod-a"


def test_a_bad_cluster_name_is_refused_naming_it() -> None:
    bad = run(["exec", "--name", "x", "--", "true"], {"CRON_RUNNER_CLUSTER_NAME": "eu west"})
    assert bad.returncode == ConfigError.exit_code
    assert "CRON_RUNNER_CLUSTER_NAME 'eu west' is not valid" in bad.stderr


def test_status_of_an_unknown_task_fails_naming_the_scope_and_the_known_ones(
    redis_server: RedisServer,
) -> None:
    env = runner_env(redis_server.url)
    assert run(["exec", "--name", "report", "--", "true"], env).returncode == 0
    status = run(["status", "reprot"], env)
    assert status.returncode == UnknownTask.exit_code
    message = events(status.stderr)[-1]["msg"]
    assert "no task 'reprot' in scope 'default' (key prefix 'cron-runner')" in message
    assert "known there: report" in message
    assert status.stdout == ""
    assert run(["status", "report"], env).returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        ["--schedule", "61 * * * *"],
        ["--lease-ttl", "5x"],
        ["--skew-tolerance", "soon"],
    ],
    ids=["cron", "ttl", "tolerance"],
)
@pytest.mark.parametrize("how", ["flag", "flag=", "env"])
def test_setting_errors_follow_the_log_format_asked_for(args: list[str], how: str) -> None:
    env = runner_env("redis://127.0.0.1:1/0")
    fmt = ["--log-format", "text"]
    if how == "flag=":
        fmt = ["--log-format=text"]
    elif how == "env":
        fmt, env = [], {**env, "CRON_RUNNER_LOG_FORMAT": "text"}
    bad = run(["exec", "--name", "x", *fmt, *args, "--", "true"], env)
    assert bad.returncode == ConfigError.exit_code
    assert TEXT_LINE.match(bad.stderr), bad.stderr
    assert not bad.stderr.startswith("{")


def test_text_logs_show_the_slot_as_a_time(redis_server: RedisServer) -> None:
    schedule = schedule_far_from_edges(300)
    env = runner_env(redis_server.url, CRON_RUNNER_LOG_FORMAT="text", CRON_RUNNER_SCHEDULE=schedule)
    ran = run(["exec", "--name", "report", "--", "true"], env)
    assert ran.returncode == 0, ran.stderr
    slots = set(re.findall(r"\bslot=(\S+)", ran.stderr))
    assert len(slots) == 1
    (slot,) = slots
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:00Z", slot), slot
    assert int(slot[14:16]) % 5 == int(schedule.split("-")[0])


def test_the_history_length_caps_each_task_s_run_stream(redis_server: RedisServer) -> None:
    # docs/operating.md sizes the stream at about 100 bytes a run: this is the knob that caps it.
    from runner.config.settings import load_settings  # noqa: PLC0415
    from runner.keys import TaskKeys  # noqa: PLC0415
    from runner.lease import store  # noqa: PLC0415
    from runner.run.execution import Execution  # noqa: PLC0415
    from runner.run.targets import CommandTarget  # noqa: PLC0415
    from runner.signals import Shutdown  # noqa: PLC0415

    settings = load_settings(
        {"CRON_RUNNER_REDIS_URL": redis_server.url, "CRON_RUNNER_HISTORY_LENGTH": "100"}
    )
    client = store.connect(settings.redis, settings.lease.ttl_s)
    try:
        for _ in range(350):
            run_ = Execution(settings, client, "capped", CommandTarget(["true"]), Shutdown())
            assert run_.run().exit_code == 0
        length = client.xlen(TaskKeys("cron-runner", "default", "capped").runs)
    finally:
        client.close()
    # MAXLEN ~ trims whole stream nodes (100 entries each): never more than one node over.
    assert 100 <= length < 200
