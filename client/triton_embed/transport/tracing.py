"""W3C trace context on the gRPC calls to Triton, and their client spans.

Triton 2.51 started with ``--trace-config mode=opentelemetry`` reads a call's ``traceparent``
gRPC header (`W3C Trace Context <https://www.w3.org/TR/trace-context/>`_) and makes its
``InferRequest`` span, and below it the ensemble's and each step's spans, children of it
(docs/operations.md, "Traces"). Every call the client library and the gateway's upstream
pool make goes through :func:`call_span`, with the parent :func:`capture` found when the
call (``embed``, ``rerank``, a gateway request's upstream work) began:

* an explicit context: the method's ``traceparent=`` (``client.embed(texts,
  traceparent=...)``), else :func:`trace_context`'s (``with trace_context(tp): ...``);
* else the current OpenTelemetry span, when the application uses OpenTelemetry (the
  ``opentelemetry`` package is imported) and a span is current;
* else none: the call is sent without trace headers.

With OpenTelemetry in use each call gets a client span, ``triton.infer <model>``, made by
the global tracer provider (none configured: a non-recording span, and the parent's
context is still sent). Without it, an explicit context's headers are sent as they are.
When nothing is traced a call costs a ``None`` check: no ``opentelemetry`` import.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: The W3C headers, as gRPC metadata keys (lower case).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: ``version-trace_id-parent_id-flags``: 2, 32, 16 and 2 lower-case hex digits.
_TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
#: The instrumentation scope of the client spans.
TRACER_NAME = "triton_embed"
#: A call that is not traced: no span, no headers.
NOT_TRACED = contextlib.nullcontext(None)


@dataclass(frozen=True)
class TraceContext:
    """A W3C trace context: the ``traceparent`` and ``tracestate`` headers.

    Attributes:
        traceparent: ``00-<trace id: 32 hex>-<parent span id: 16 hex>-<flags: 2 hex>``.
        tracestate: vendor entries (``key=value,...``), sent as given; ``None``: none.

    Raises:
        ValueError: ``traceparent`` is not of that form, or its trace or span id is all
            zeros, or its version is ``ff`` (the W3C rules); the message shows the form.
    """

    traceparent: str
    tracestate: str | None = None

    def __post_init__(self) -> None:
        match = _TRACEPARENT_RE.match(self.traceparent)
        if match is None or match[1] == "ff" or set(match[2]) == {"0"} or set(match[3]) == {"0"}:
            raise ValueError(
                f"traceparent {self.traceparent[:80]!r} is not a W3C trace context: expected "
                "'00-<32 hex: trace id, not all 0>-<16 hex: span id, not all 0>-<2 hex: "
                "flags>', e.g. '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'"
            )

    @property
    def trace_id(self) -> str:
        """The trace id: 32 lower-case hex digits."""
        return self.traceparent[3:35]

    @property
    def span_id(self) -> str:
        """The parent span's id: 16 lower-case hex digits."""
        return self.traceparent[36:52]

    def headers(self) -> dict[str, str]:
        """The gRPC metadata (or HTTP headers) that carry it."""
        if self.tracestate:
            return {TRACEPARENT: self.traceparent, TRACESTATE: self.tracestate}
        return {TRACEPARENT: self.traceparent}


#: The explicit trace context of the calls made in this context (:func:`trace_context`).
TRACE_CONTEXT: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar(
    "triton_embed_trace_context", default=None
)


@contextlib.contextmanager
def trace_context(traceparent: str | TraceContext, tracestate: str | None = None) -> Iterator[None]:
    """Send the calls made inside the block as children of ``traceparent``.

    For :class:`~triton_embed.EmbeddingClient` calls (``embed``, ``rerank``, ...) and the
    gateway's upstream calls; it wins over the current OpenTelemetry span.

    Args:
        traceparent: the parent, a W3C ``traceparent`` value or a :class:`TraceContext`.
        tracestate: its ``tracestate`` (with a ``str`` ``traceparent`` only).

    Raises:
        ValueError: ``traceparent`` is not a W3C trace context (:class:`TraceContext`).
    """
    if not isinstance(traceparent, TraceContext):
        traceparent = TraceContext(traceparent, tracestate)
    token = TRACE_CONTEXT.set(traceparent)
    try:
        yield
    finally:
        TRACE_CONTEXT.reset(token)


def as_trace_context(traceparent: str | TraceContext | None) -> TraceContext | None:
    """A method's ``traceparent=`` argument as a :class:`TraceContext` (``None`` stays).

    Raises:
        ValueError: not a ``str`` or :class:`TraceContext`, or not a W3C ``traceparent``.
    """
    if traceparent is None or isinstance(traceparent, TraceContext):
        return traceparent
    if not isinstance(traceparent, str):
        raise ValueError(
            f"traceparent must be a W3C traceparent str or a TraceContext, "
            f"got {type(traceparent).__name__}"
        )
    return TraceContext(traceparent)


def capture(explicit: TraceContext | None = None) -> Any:
    """The parent of the calls about to be made here, or ``None``: not traced.

    Call it where the work begins (the caller's thread: the client's worker threads and
    the gateway's piece tasks see it through :func:`call_span`'s argument).

    Args:
        explicit: a method's own ``traceparent=`` (:func:`as_trace_context`); it wins over
            :func:`trace_context`'s and the current OpenTelemetry span.

    Returns:
        ``None`` (no explicit context, and no current OpenTelemetry span); a
        :class:`TraceContext` (explicit, OpenTelemetry not in use); else an OpenTelemetry
        ``Context`` whose current span is the parent.
    """
    explicit = explicit or TRACE_CONTEXT.get()
    if "opentelemetry.trace" not in sys.modules:  # the application does not use OpenTelemetry
        return explicit
    from opentelemetry import context, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if explicit is not None:
        return TraceContextTextMapPropagator().extract(explicit.headers())
    current = context.get_current()
    return current if trace.get_current_span(current).get_span_context().is_valid else None


def call_span(parent: Any, model: str, address: str) -> contextlib.AbstractContextManager:
    """The span of one gRPC call to ``model`` at ``address``; yields its headers.

    ``with call_span(parent, model, address) as headers:`` then send ``headers=headers``
    (``None``: not traced).

    Args:
        parent: what :func:`capture` returned.
        model: the model called (an ensemble or a step).
        address: the server's ``host:port``.
    """
    if parent is None:
        return NOT_TRACED
    if isinstance(parent, TraceContext):
        return contextlib.nullcontext(parent.headers())
    return _client_span(parent, model, address)


@contextlib.contextmanager
def _client_span(parent: Any, model: str, address: str) -> Iterator[dict[str, str]]:
    """A client span ``triton.infer <model>``, child of ``parent``; yields its headers."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    host, _, port = address.rpartition(":")
    attributes: dict[str, str | int] = {
        "rpc.system": "grpc",
        "rpc.service": "inference.GRPCInferenceService",
        "rpc.method": "ModelInfer",
        "server.address": host.strip("[]") if port.isdigit() else address,
        "triton.model_name": model,
    }
    if port.isdigit():
        attributes["server.port"] = int(port)
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        f"triton.infer {model}", context=parent, kind=trace.SpanKind.CLIENT, attributes=attributes
    ) as span:
        headers: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(headers, context=trace.set_span_in_context(span))
        yield headers
