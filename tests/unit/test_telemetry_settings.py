"""Telemetry is on only when an OTLP endpoint is set, per signal (settings.TelemetrySettings)."""

from __future__ import annotations

import pytest

from runner.config.settings import TelemetrySettings, load_settings
from runner.errors import ConfigError

EP = "http://collector:4318"


@pytest.mark.parametrize(
    ("env", "expected", "on"),
    [
        ({}, TelemetrySettings(), False),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
         TelemetrySettings(traces_protocol="grpc", metrics_protocol="grpc"), False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": EP}, TelemetrySettings(traces=True, metrics=True), True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, TelemetrySettings(), False),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": EP}, TelemetrySettings(traces=True), True),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": EP}, TelemetrySettings(metrics=True), True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": EP, "OTEL_METRICS_EXPORTER": "none"},
         TelemetrySettings(traces=True), True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": EP, "OTEL_TRACES_EXPORTER": "None"},
         TelemetrySettings(metrics=True), True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": EP, "OTEL_SDK_DISABLED": "true"}, TelemetrySettings(),
         False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": EP, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
          "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"},
         TelemetrySettings(traces=True, metrics=True, traces_protocol="grpc"), True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": EP, "OTEL_METRIC_EXPORT_INTERVAL": "5000"},
         TelemetrySettings(traces=True, metrics=True, periodic_metrics=True), True),
        ({"CRON_RUNNER_TELEMETRY_FLUSH_TIMEOUT": "500ms"}, TelemetrySettings(flush_timeout_s=0.5),
         False),
    ],
)  # fmt: skip
def test_telemetry_settings(env: dict[str, str], expected: TelemetrySettings, on: bool) -> None:
    """``on``: whether the CLI starts OpenTelemetry at all, stated per case rather than worked
    out again from the expected settings."""
    assert load_settings(env).telemetry == expected
    assert load_settings(env).telemetry.enabled is on


def test_bad_flush_timeout_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="CRON_RUNNER_TELEMETRY_FLUSH_TIMEOUT"):
        load_settings({"CRON_RUNNER_TELEMETRY_FLUSH_TIMEOUT": "soon"})
