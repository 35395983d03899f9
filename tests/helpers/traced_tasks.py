"""Tasks that use OpenTelemetry themselves, for the telemetry tests."""

from __future__ import annotations

from opentelemetry import trace

from runner import RunContext, task


@task("traced")
def traced(ctx: RunContext) -> None:
    """Its own span must nest under the runner's task span."""
    tracer = trace.get_tracer("tests.traced")
    with tracer.start_as_current_span("user-work") as span:
        span.set_attribute("user.fencing_token", ctx.fencing_token)


@task("traced-boom")
def traced_boom(ctx: RunContext) -> None:
    raise RuntimeError("traced-boom: failed on purpose")
