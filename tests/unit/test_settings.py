"""Settings parsing: flags, then CRON_RUNNER_* variables, then defaults; bad values name their source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.config.settings import load_settings
from runner.config.sources import parse_duration
from runner.config.urls import redact_url
from runner.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30.0), ("30s", 30.0), ("1m", 60.0), ("500ms", 0.5), ("1h", 3600.0), (" 2.5s ", 2.5)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "X") == seconds


@pytest.mark.parametrize("text", ["", "thirty", "30x", "-1s", "1m30s", "1e3", "s"])
def test_bad_durations_name_the_origin_and_the_form(text: str) -> None:
    with pytest.raises(ConfigError, match=r"CRON_RUNNER_LEASE_TTL=.*'30s', '1m', '500ms'"):
        parse_duration(text, "CRON_RUNNER_LEASE_TTL")


def test_defaults() -> None:
    s = load_settings({})
    assert s.redis.url == "redis://localhost:6379/0"
    assert s.lease.ttl_s == 30.0
    assert s.redis.connect_timeout_s == 10.0
    assert s.slots.skew_tolerance_s == 30.0
    assert s.run.shutdown_grace_s == 25.0
    assert s.lease.scope == "default"
    assert s.lease.prefix == "cron-runner"
    assert ":" in s.lease.holder


def test_flags_win_over_environment() -> None:
    s = load_settings({"CRON_RUNNER_LEASE_TTL": "10s"}, {"LEASE_TTL": "5s"})
    assert s.lease.ttl_s == 5.0
    assert load_settings({"CRON_RUNNER_LEASE_TTL": "10s"}, {"LEASE_TTL": None}).lease.ttl_s == 10.0


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        ({"CRON_RUNNER_REDIS_URL": "http://x"}, {}, "CRON_RUNNER_REDIS_URL"),
        ({"CRON_RUNNER_REDIS_URL": "redis://"}, {}, "has no host"),
        ({"CRON_RUNNER_REDIS_URL": "redis://h:99999"}, {}, "bad port"),
        ({"CRON_RUNNER_REDIS_URL": "redis://h/abc"}, {}, "bad database"),
        ({}, {"REDIS_URL": "ftp://h"}, "--redis-url"),
        ({"CRON_RUNNER_LEASE_TTL": "500ms"}, {}, "at least 1s"),
        ({"CRON_RUNNER_SLOT_RETENTION": "0s"}, {}, "CRON_RUNNER_SLOT_RETENTION"),
        ({"CRON_RUNNER_SLOT_RETENTION": "10s"}, {}, "at least 60s"),
        ({"CRON_RUNNER_TIMEZONE": "Nowhere/City"}, {}, "IANA"),
        ({"CRON_RUNNER_SCHEDULE": "* * *"}, {}, "CRON_RUNNER_SCHEDULE"),
        ({}, {"SCHEDULE": "0 0 * * * *"}, "--schedule"),
        (
            {"CRON_RUNNER_SCHEDULE": "* * * * *", "CRON_RUNNER_SKEW_TOLERANCE": "30s"},
            {},
            "CRON_RUNNER_SKEW_TOLERANCE",
        ),
        ({"CRON_RUNNER_REDIS_CLUSTER": "maybe"}, {}, "true or false"),
        ({"CRON_RUNNER_REDIS_SENTINELS": "host-without-port"}, {}, "host:port"),
        ({"CRON_RUNNER_REDIS_MIN_REPLICAS": "-1"}, {}, "whole number"),
        ({"CRON_RUNNER_MODE": "sometimes"}, {}, "run, enqueue"),
        ({"CRON_RUNNER_LOG_FORMAT": "xml"}, {}, "json, text"),
        ({"CRON_RUNNER_SCOPE": "a{b}"}, {}, "CRON_RUNNER_SCOPE"),
        ({"CRON_RUNNER_KEY_PREFIX": "x{y"}, {}, "no braces"),
        ({"CRON_RUNNER_HOLDER": "has space"}, {}, "CRON_RUNNER_HOLDER"),
        ({"CRON_RUNNER_REDIS_TLS_CA_FILE": "/no/such/ca.pem"}, {}, "no such file"),
        (
            {"CRON_RUNNER_REDIS_CLUSTER": "true", "CRON_RUNNER_REDIS_SENTINELS": "a:1"},
            {},
            "exclude each other",
        ),
    ],
)
def test_bad_values_are_refused_naming_their_source(
    env: dict[str, str], flags: dict[str, str | None], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(env, flags)


def test_every_minute_schedule_gets_a_tolerance_below_half_a_minute() -> None:
    s = load_settings({"CRON_RUNNER_SCHEDULE": "* * * * *"})
    assert s.slots.skew_tolerance_s == 29.0
    assert load_settings({"CRON_RUNNER_SCHEDULE": "*/5 * * * *"}).slots.skew_tolerance_s == 30.0


def test_password_from_env_wins_and_is_never_in_repr_or_display_url() -> None:
    s = load_settings(
        {"CRON_RUNNER_REDIS_URL": "redis://u:urlpw@h:6379/2", "CRON_RUNNER_REDIS_PASSWORD": "envpw"}
    )
    assert s.redis.password == "envpw"
    assert s.redis.username == "u"
    for text in (repr(s), s.redis.display_url):
        assert "envpw" not in text
        assert "urlpw" not in text
    assert load_settings({"CRON_RUNNER_REDIS_URL": "redis://:p%40ss@h/0"}).redis.password == "p@ss"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://u:pw@h:6379/0", "redis://u:***@h:6379/0"),
        ("rediss://:pw@h/1", "rediss://***@h/1"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_sentinels_and_modules_parse() -> None:
    s = load_settings(
        {
            "CRON_RUNNER_REDIS_SENTINELS": "s1:26379, s2:26380",
            "CRON_RUNNER_TASK_MODULES": "a.b, c",
            "CRON_RUNNER_REDIS_MIN_REPLICAS": "1",
        }
    )
    assert s.redis.sentinels == (("s1", 26379), ("s2", 26380))
    assert s.run.task_modules == ("a.b", "c")
    assert s.redis.min_replicas == 1


def test_exec_path_imports_no_optional_heavy_modules() -> None:
    # A CronJob pod starts cold every run: `exec` must not pay for what it does not use.
    code = (
        "import sys, runner.cli.main, runner.run.execution, runner.lease.store, runner.run.targets;"
        "heavy = ['croniter', 'runner.schedule.cron', 'runner.config.rates', 'opentelemetry', 'dramatiq', 'kubernetes', 'yaml',"
        " 'runner.cli.adopt'];"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cronjob_pod_start_path_needs_no_schedule_machinery() -> None:
    code = (
        "import os, sys;"
        "from runner.config.settings import load_settings;"
        "from runner.schedule.markers import resolve_slot, stale_slot_reason;"
        "s = load_settings({'CRON_RUNNER_JOB_NAME': 'x-29934000', 'CRON_RUNNER_CRONJOB_NAME': 'x',"
        " 'CRON_RUNNER_SCHEDULE': '* * * * *',"
        " 'CRON_RUNNER_SCHEDULED_TIMESTAMP': '2026-11-30T13:00:00+01:00'});"
        "now = 29934000 * 60 + 1200.0;"
        "print(resolve_slot(s, now), stale_slot_reason(s, resolve_slot(s, now), now),"
        " [m for m in ('croniter', 'runner.schedule.cron') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(29934000 * 60), "None", "[]"]


@pytest.mark.parametrize(
    "url",
    [
        # Unencoded '/', '#' and '?' end urlsplit's host part early: the password would be
        # taken for a path, fragment or query, and shown.
        "redis://:1234/Secr3t@127.0.0.1:6379/0",
        "redis://:p#Secr3t@127.0.0.1:6379/0",
        "redis://:p?Secr3t@127.0.0.1/0",
        "redis://user:Secr3t@127.0.0.1:abc/0",  # a bad port next to credentials
        "redis://user:Secr3t@127.0.0.1:70000/0",
        "redis://user:Secr3t@:6379/0",
    ],
)
def test_a_bad_url_with_credentials_is_refused_without_showing_them(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({"CRON_RUNNER_REDIS_URL": url})
    assert "Secr3t" not in str(refused.value)
    assert "CRON_RUNNER_REDIS_URL" in str(refused.value)
    assert "percent-encode" in str(refused.value)


def test_redact_url_masks_up_to_the_last_at_sign() -> None:
    assert redact_url("redis://u:p@ss/w#rd@h:1/0") == "redis://u:***@h:1/0"
    assert redact_url("unix:///run/redis.sock") == "unix:///run/redis.sock"


def test_tls_files_are_loaded_when_settings_are_built(tmp_path: Path) -> None:
    from tests.helpers.topologies import make_tls_files  # noqa: PLC0415 - runs openssl

    tls = make_tls_files(tmp_path)
    not_pem = tmp_path / "not-a-cert.pem"
    not_pem.write_text("hello\n")
    good = {"CRON_RUNNER_REDIS_TLS_CA_FILE": tls.ca_cert,
            "CRON_RUNNER_REDIS_TLS_CERT_FILE": tls.client_cert,
            "CRON_RUNNER_REDIS_TLS_KEY_FILE": tls.client_key}  # fmt: skip
    assert load_settings(good).redis.tls_ca_file == tls.ca_cert
    cases = [
        ({"CRON_RUNNER_REDIS_TLS_CA_FILE": str(not_pem)}, "CRON_RUNNER_REDIS_TLS_CA_FILE"),
        ({**good, "CRON_RUNNER_REDIS_TLS_KEY_FILE": tls.server_key}, "not a usable PEM"),
        (
            {**good, "CRON_RUNNER_REDIS_TLS_CERT_FILE": str(not_pem)},
            "CRON_RUNNER_REDIS_TLS_CERT_FILE",
        ),
        ({"CRON_RUNNER_REDIS_TLS_KEY_FILE": tls.client_key}, "a key needs its certificate"),
    ]
    for env, named in cases:
        with pytest.raises(ConfigError, match=named):
            load_settings(env)


def test_history_length() -> None:
    assert load_settings({}).lease.history_length == 1000
    assert load_settings({"CRON_RUNNER_HISTORY_LENGTH": "200"}).lease.history_length == 200
    for bad in ("99", "0", "-5", "lots", "1e3"):
        with pytest.raises(ConfigError, match=r"CRON_RUNNER_HISTORY_LENGTH=.*at least 100"):
            load_settings({"CRON_RUNNER_HISTORY_LENGTH": bad})


def test_the_cluster_name_goes_before_the_holder() -> None:
    env = {"CRON_RUNNER_HOLDER": "pod-a", "CRON_RUNNER_CLUSTER_NAME": "eu-west"}
    assert load_settings(env).lease.holder == "eu-west/pod-a"
    assert load_settings({"CRON_RUNNER_CLUSTER_NAME": "eu-west"}).lease.holder.startswith(
        "eu-west/"
    )
    assert load_settings({"CRON_RUNNER_HOLDER": "pod-a"}).lease.holder == "pod-a"


# -- overlap (issue 17) ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["skip", "buffer-one", "Replace", "allow-other-slots"])
def test_overlap_accepts_the_four_policies(value: str) -> None:
    settings = load_settings({"CRON_RUNNER_OVERLAP": value})
    assert settings.lease.overlap == value.lower()


def test_overlap_defaults_to_unset_which_is_skip() -> None:
    lease = load_settings({}).lease
    assert (lease.overlap, lease.overlap_policy, lease.overlap_wait_s) == (None, "skip", None)


@pytest.mark.parametrize(
    ("env", "flags", "named"),
    [
        ({"CRON_RUNNER_OVERLAP": "forbid"}, {}, "CRON_RUNNER_OVERLAP='forbid'"),
        ({}, {"OVERLAP": "allow"}, "--overlap='allow'"),
        ({"CRON_RUNNER_OVERLAP_WAIT": "-5s"}, {}, "CRON_RUNNER_OVERLAP_WAIT='-5s'"),
        ({}, {"OVERLAP_WAIT": "0"}, "--overlap-wait='0'"),
    ],
)
def test_a_bad_overlap_setting_names_itself_and_what_is_accepted(
    env: dict[str, str], flags: dict[str, str | None], named: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(env, flags)
    assert named in str(refused.value)
    if "WAIT" not in named.upper():
        assert "expected one of skip, buffer-one, replace, allow-other-slots" in str(refused.value)
