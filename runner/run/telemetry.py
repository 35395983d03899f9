"""OpenTelemetry for runs: one span tree and a few metrics per run, exported over OTLP.

Imported only when an OTLP endpoint is set (``settings.TelemetrySettings``, decided once at the
CLI edge): a CronJob pod starts cold every time, and the SDK with protobuf and requests is a
measurable part of a start. The SDK reads every other ``OTEL_*`` variable itself (service
name, resource attributes, headers, timeouts, batch sizes, temporality).

Spans: ``run <task>``, with children ``connect`` (opening the connection without sending a
command; on Cluster, to the node that holds the task's keys, from the slot table read when the
client was built, before the run), ``acquire``, ``task``, and ``complete`` or ``release``. A run
terminated before it reaches Redis has no ``connect``. The run's span carries task, slot,
fencing token, holder, outcome and exit code. The task span is the current span inside a Python
task's thread, so the task's own spans nest under it.

Metrics: ``cron_runner.runs`` by outcome, ``cron_runner.run.duration``,
``cron_runner.lock.wait`` (connect and acquire together, whatever acquire found), and
``cron_runner.lease.renewals`` / ``cron_runner.lease.renewals.failed``.

Everything is delivered when the run ends, within ``flush_timeout_s``: a dead or hung collector
costs at most that long and never changes the exit code.
"""

from __future__ import annotations

import importlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode

from runner import __version__
from runner.config.settings import TelemetrySettings

log = logging.getLogger("runner.telemetry")

TASK = "cron_runner.task"
SLOT = "cron_runner.slot"
FENCE = "cron_runner.fencing_token"
HOLDER = "cron_runner.holder"
OUTCOME = "cron_runner.outcome"
EXIT_CODE = "cron_runner.exit_code"

# Exporter packages by OTEL_EXPORTER_OTLP_PROTOCOL. The telemetry extra installs the HTTP one;
# grpc works once opentelemetry-exporter-otlp-proto-grpc is installed beside it.
_PACKAGES = {"http/protobuf": "http", "grpc": "grpc"}
_DURATION_BUCKETS_S = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600)
# The lock wait runs from the start of the first of these to the end of the last one reached.
_LOCK_WAIT_PHASES = ("connect", "acquire")
_WAIT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def _exporter(protocol: str, signal: str, class_name: str) -> Any:
    """An OTLP exporter for ``signal`` ('trace' or 'metric'), or None with a warning."""
    package = _PACKAGES.get(protocol)
    if package is None:
        log.warning(
            "telemetry: OTLP protocol %r is not supported (expected http/protobuf or grpc); "
            "%ss are not exported",
            protocol,
            signal,
            extra={"event": "telemetry_unavailable"},
        )
        return None
    module_name = f"opentelemetry.exporter.otlp.proto.{package}.{signal}_exporter"
    try:
        module = importlib.import_module(module_name)
        return getattr(module, class_name)()
    except ImportError as exc:
        hint = f"pip install opentelemetry-exporter-otlp-proto-{package}"
        reason = f"{exc}; {hint}"
    except Exception as exc:  # noqa: BLE001 - a bad OTEL_* value must not stop the run
        reason = f"{type(exc).__name__}: {exc}"
    log.warning(
        "telemetry: cannot create the OTLP %s exporter (%s); %ss are not exported",
        protocol,
        reason,
        signal,
        extra={"event": "telemetry_unavailable"},
    )
    return None


def _resource() -> Resource:
    """The SDK's resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), named cron-runner
    unless those name it."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "cron-runner"}))
    return resource


class RunTelemetry:
    """A ``RunObserver`` (runner.run.observer) that records spans and metrics for one run."""

    def __init__(self, settings: TelemetrySettings, task: str, holder: str) -> None:
        self.task = task
        self.holder = holder
        self.flush_timeout_s = settings.flush_timeout_s
        resource = _resource()
        self._tracer_provider: TracerProvider | None = None
        self._meter_provider: MeterProvider | None = None
        span_exporter = (
            _exporter(settings.traces_protocol, "trace", "OTLPSpanExporter")
            if settings.traces
            else None
        )
        if span_exporter is not None:
            # shutdown_on_exit=False: an atexit flush would not be bounded; close() is.
            self._tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
            self._tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
            # Global, so that a task's own tracer records into the same provider.
            trace.set_tracer_provider(self._tracer_provider)
        metric_exporter = (
            _exporter(settings.metrics_protocol, "metric", "OTLPMetricExporter")
            if settings.metrics
            else None
        )
        if metric_exporter is not None:
            reader = PeriodicExportingMetricReader(
                metric_exporter,
                export_interval_millis=None if settings.periodic_metrics else math.inf,
            )
            self._meter_provider = MeterProvider(
                resource=resource, metric_readers=[reader], shutdown_on_exit=False
            )
            metrics.set_meter_provider(self._meter_provider)

        tracer_provider = self._tracer_provider or trace.NoOpTracerProvider()
        self._tracer = tracer_provider.get_tracer("cron-runner", __version__)
        meter_provider = self._meter_provider or metrics.NoOpMeterProvider()
        meter = meter_provider.get_meter("cron-runner", __version__)
        self._runs = meter.create_counter(
            "cron_runner.runs", unit="{run}", description="Runs, by outcome"
        )
        self._duration = meter.create_histogram(
            "cron_runner.run.duration",
            unit="s",
            description="From start to exit, by outcome",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS_S,
        )
        self._lock_wait = meter.create_histogram(
            "cron_runner.lock.wait",
            unit="s",
            description="Time to connect and acquire (or find the lease held or the slot done)",
            explicit_bucket_boundaries_advisory=_WAIT_BUCKETS_S,
        )
        self._renewals = meter.create_counter(
            "cron_runner.lease.renewals", unit="{renewal}", description="Confirmed renewals"
        )
        self._failed_renewals = meter.create_counter(
            "cron_runner.lease.renewals.failed",
            unit="{renewal}",
            description="Renewals refused or not answered",
        )
        self._root: Span | None = None
        self._root_token: Token[Context] | None = None
        self._started_at = time.monotonic()
        self._wait_started: float | None = None
        self._lock_wait_s: float | None = None
        self._finished = False
        self._closed = False

    # -- RunObserver ----------------------------------------------------------------------

    def started(self, slot: int | None) -> None:
        self._started_at = time.monotonic()
        attributes: dict[str, str | int] = {TASK: self.task, HOLDER: self.holder}
        if slot is not None:
            attributes[SLOT] = slot
        self._root = self._tracer.start_span(f"run {self.task}", attributes=attributes)
        self._root_token = otel_context.attach(trace.set_span_in_context(self._root))

    @contextmanager
    def phase(self, name: str) -> Iterator[object]:
        started = time.monotonic()
        if name in _LOCK_WAIT_PHASES and self._wait_started is None:
            self._wait_started = started
        try:
            with self._tracer.start_as_current_span(name) as span:
                yield span
        finally:
            if name in _LOCK_WAIT_PHASES:
                self._lock_wait_s = time.monotonic() - (self._wait_started or started)

    def acquired(self, fence: int) -> None:
        if self._root is not None:
            self._root.set_attribute(FENCE, fence)

    def finished(
        self, outcome: str, exit_code: int, *, renewals: int, failed_renewals: int
    ) -> None:
        if self._finished:
            return
        self._finished = True
        if self._root is not None:
            self._root.set_attributes({OUTCOME: outcome, EXIT_CODE: exit_code})
            if exit_code != 0:
                self._root.set_status(Status(StatusCode.ERROR, outcome))
            self._root.end()
        if self._root_token is not None:
            otel_context.detach(self._root_token)
            self._root_token = None
        by_outcome = {TASK: self.task, OUTCOME: outcome}
        self._runs.add(1, by_outcome)
        self._duration.record(time.monotonic() - self._started_at, by_outcome)
        if self._lock_wait_s is not None:
            self._lock_wait.record(self._lock_wait_s, by_outcome)
        self._renewals.add(renewals, {TASK: self.task})
        self._failed_renewals.add(failed_renewals, {TASK: self.task})

    def close(self) -> None:
        """Export everything, waiting at most ``flush_timeout_s``; then move on regardless."""
        if self._closed:
            return
        self._closed = True
        if self._root is not None and not self._finished:
            self._root.end()
        providers: list[TracerProvider | MeterProvider] = [
            p for p in (self._tracer_provider, self._meter_provider) if p is not None
        ]
        if not providers:
            return

        def deliver() -> None:
            try:
                for provider in providers:
                    provider.force_flush()
                for provider in providers:
                    provider.shutdown()
            except Exception as exc:  # noqa: BLE001 - telemetry never fails a run
                log.warning(
                    "telemetry: export failed: %s", exc, extra={"event": "telemetry_dropped"}
                )

        # A daemon thread: if the collector hangs, the process exits without waiting for it.
        thread = threading.Thread(target=deliver, name="telemetry-flush", daemon=True)
        thread.start()
        thread.join(self.flush_timeout_s)
        if thread.is_alive():
            log.warning(
                "telemetry: not delivered within %gs (CRON_RUNNER_TELEMETRY_FLUSH_TIMEOUT); "
                "dropped",
                self.flush_timeout_s,
                extra={"event": "telemetry_dropped"},
            )
