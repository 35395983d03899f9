"""A real OTLP/HTTP receiver on loopback: decodes each request with opentelemetry-proto.

Also a collector that is up but never answers (a listening socket that never accepts), the
worst case for a runner that must flush at exit.
"""

from __future__ import annotations

import gzip
import socket
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def attributes(kvs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in kvs}


@dataclass
class ReceivedSpan:
    name: str
    span_id: bytes
    parent_span_id: bytes
    trace_id: bytes
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int
    events: list[str]
    start_ns: int
    end_ns: int
    # Everything a span carries as text: attributes, status message, events' attributes.
    text: str = ""


@dataclass
class Point:
    metric: str
    unit: str
    attributes: dict[str, Any]
    value: float  # a sum's value, or a histogram's sum
    count: int  # a histogram's count; 1 for a sum


class OtlpReceiver:
    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                reply: bytes
                with receiver._lock:
                    receiver.paths.append(self.path)
                    if self.path == "/v1/traces":
                        receiver.traces.append(ExportTraceServiceRequest.FromString(body))
                        reply = ExportTraceServiceResponse().SerializeToString()
                    elif self.path == "/v1/metrics":
                        receiver.metrics.append(ExportMetricsServiceRequest.FromString(body))
                        reply = ExportMetricsServiceResponse().SerializeToString()
                    else:
                        self.send_error(404)
                        return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def _scopes(
        self, received: list[Any], resources: str, scopes: str
    ) -> Iterator[tuple[Any, Any]]:
        """(resource, scope) of every export request received so far: the traces' (resource
        and scope spans) or the metrics' (resource and scope metrics)."""
        with self._lock:
            requests = list(received)
        for request in requests:
            for resource in getattr(request, resources):
                for scope in getattr(resource, scopes):
                    yield resource, scope

    def spans(self) -> list[ReceivedSpan]:
        out: list[ReceivedSpan] = []
        for rs, ss in self._scopes(self.traces, "resource_spans", "scope_spans"):
            resource = attributes(rs.resource.attributes)
            out.extend(
                ReceivedSpan(
                    name=s.name,
                    span_id=s.span_id,
                    parent_span_id=s.parent_span_id,
                    trace_id=s.trace_id,
                    attributes=attributes(s.attributes),
                    resource=resource,
                    status_code=int(s.status.code),
                    events=[e.name for e in s.events],
                    start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano,
                    text=str(s),
                )
                for s in ss.spans
            )
        return out

    def points(self) -> list[Point]:
        out: list[Point] = []
        for _, sm in self._scopes(self.metrics, "resource_metrics", "scope_metrics"):
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind == "sum":
                    out.extend(
                        Point(m.name, m.unit, attributes(p.attributes), _number(p), 1)
                        for p in m.sum.data_points
                    )
                elif kind == "histogram":
                    out.extend(
                        Point(m.name, m.unit, attributes(p.attributes), p.sum, p.count)
                        for p in m.histogram.data_points
                    )
        return out


def _number(point: Any) -> float:
    kind = point.WhichOneof("value")
    return float(getattr(point, kind))


class HungCollector:
    """Accepts TCP connections into its backlog and never reads or answers."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> HungCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
