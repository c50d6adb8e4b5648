"""An OTLP/HTTP trace receiver on 127.0.0.1 for the tests: what a collector would get.

It decodes ``ExportTraceServiceRequest`` bodies of both encodings OTLP/HTTP allows:
protobuf (``application/x-protobuf``: OpenTelemetry's Python exporter, the gateway) and
JSON (``application/json``, ids as hex: Triton 2.51's C++ exporter), with the
``opentelemetry-proto`` package's message (JSON through ``json_format`` after the ids are
turned into the base64 that protobuf's JSON mapping expects).
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

#: The OTLP JSON fields that hold ids as hex (the protobuf JSON mapping wants base64).
_HEX_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received: ids as lower-case hex (``parent`` ``""`` for a root span)."""

    name: str
    trace_id: str
    span_id: str
    parent: str
    kind: int
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[str, ...] = ()


def _json_to_proto_ids(node: Any) -> Any:
    """OTLP JSON with hex ids -> the protobuf JSON mapping (base64 bytes), recursively."""
    if isinstance(node, list):
        return [_json_to_proto_ids(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _HEX_ID_FIELDS and isinstance(value, str):
            value = base64.b64encode(bytes.fromhex(value)).decode()
        out[key] = _json_to_proto_ids(value)
    return out


def decode_spans(body: bytes, content_type: str) -> list[ReceivedSpan]:
    """The spans of one OTLP/HTTP export request (protobuf or JSON)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    if "json" in content_type:
        message = json_format.ParseDict(
            _json_to_proto_ids(json.loads(body)), ExportTraceServiceRequest()
        )
    else:
        message = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in message.resource_spans:
        resource = {a.key: a.value for a in resource_spans.resource.attributes}
        service = resource["service.name"].string_value if "service.name" in resource else ""
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                attributes = {
                    a.key: getattr(a.value, a.value.WhichOneof("value")) for a in s.attributes
                }
                spans.append(
                    ReceivedSpan(
                        s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                        s.kind, service, attributes, tuple(e.name for e in s.events),
                    )
                )  # fmt: skip
    return spans


class OtlpReceiver:
    """``POST /v1/traces`` on a free port of 127.0.0.1; keeps every span it decodes.

    Use as a context manager; :attr:`url` is the endpoint to configure.
    """

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    spans = decode_spans(body, self.headers.get("Content-Type", ""))
                except Exception as exc:  # a test failure to show, not a crash
                    with receiver._lock:
                        receiver.errors.append(f"{self.headers.get('Content-Type')}: {exc}")
                    self.send_response(400)
                else:
                    with receiver._lock:
                        receiver.spans.extend(spans)
                    self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The OTLP/HTTP traces URL."""
        return f"http://127.0.0.1:{self._server.server_port}/v1/traces"

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans received so far of ``trace_id``."""
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(
        self,
        trace_id: str,
        names: set[str],
        timeout_s: float = 30.0,
        at_least: dict[str, int] | None = None,
    ) -> list:
        """The spans of ``trace_id`` once every name in ``names`` is among them.

        ``at_least``: names that must also arrive that many times (Triton's ``compute``
        span, one per step; exporters send spans in batches, so one may come later).

        Raises:
            AssertionError: not within ``timeout_s`` (lists what came, and decode errors).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            got = [s.name for s in spans]
            if names <= set(got) and all(got.count(n) >= k for n, k in (at_least or {}).items()):
                return spans
            time.sleep(0.1)
        raise AssertionError(
            f"spans {sorted(names)} of trace {trace_id} not all received in {timeout_s} s; "
            f"got {sorted(s.name for s in self.trace(trace_id))}; errors: {self.errors}"
        )

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
