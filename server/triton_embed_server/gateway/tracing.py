"""The gateway's request spans, exported over OTLP/HTTP when ``--otlp-endpoint`` is given.

Each request (but those of the health routes, ``/metrics`` and ``/admin/usage``: probes and
scrapes) gets a server span, ``<METHOD> <route>`` (``POST /v1/embeddings``), child of the
request's W3C ``traceparent`` (and ``tracestate``) header when it has a valid one, else the
root of a new trace. Its attributes: ``http.request.method``, ``http.route``,
``http.response.status_code``, ``triton_embed.tenant``, ``triton_embed.model``,
``triton_embed.inputs`` and ``triton_embed.tokens`` (those served); status ``ERROR`` for a
5xx answer. The upstream calls made while it is current are its children: one client span
per call, ``triton.infer <model>``, whose context goes to Triton as the call's
``traceparent`` (:mod:`triton_embed.transport.tracing`); Triton's own spans hang below.
With ``--merge-in-flight``, a call that merges several requests' texts is a child of the
request whose task sent it.

Every request is sampled (the SDK's default, parent-based always-on); OpenTelemetry's
``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` environment variables choose
another sampler, ``OTEL_BSP_*`` the batch processor's delays and sizes.

The exporter is OpenTelemetry's OTLP/HTTP protobuf exporter behind a batch span
processor, on a tracer provider that becomes the process's global one (so the transport's
client spans use it). Without ``--otlp-endpoint`` none of this exists: no provider, no
exporter, no ``opentelemetry`` import, and a request costs one ``None`` check
(:meth:`~triton_embed_server.gateway.app.Gateway.endpoint`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from triton_embed_server.run.trace_args import otlp_tracer_provider, otlp_traces_url

#: The ``service.name`` resource attribute of the gateway's spans.
SERVICE_NAME = "triton-embed-gateway"
#: The instrumentation scope of the request spans.
TRACER_NAME = "triton_embed_server.gateway"


#: The trace headers read, and the longest value of each passed on: a W3C ``traceparent`` is
#: 55 characters (version 00; later versions may append fields), and a ``tracestate`` must be
#: accepted up to 512 (W3C Trace Context, "tracestate Limits"). A longer value is dropped
#: before OpenTelemetry's propagator sees it: it logs the values it refuses, so a client could
#: otherwise write kilobytes of its own text into the gateway's log per request.
TRACE_HEADER_CHARS = {"traceparent": 128, "tracestate": 512}


class GatewayTracing:
    """The gateway's tracer provider, tracer and exporter.

    Args:
        endpoint: the OTLP/HTTP URL (:func:`~triton_embed_server.run.trace_args.otlp_traces_url`).
        exporter: the span exporter (default: OTLP/HTTP protobuf to ``endpoint``; tests pass
            an in-memory one).

    Raises:
        ValueError: ``endpoint`` is not an http(s) URL.
    """

    def __init__(self, endpoint: str, exporter: Any = None):
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.endpoint = otlp_traces_url(endpoint)
        self.provider = otlp_tracer_provider(endpoint, SERVICE_NAME, exporter)
        trace.set_tracer_provider(self.provider)  # the transport's client spans use it
        self.tracer = self.provider.get_tracer(TRACER_NAME)
        self._propagator = TraceContextTextMapPropagator()
        self._server = trace.SpanKind.SERVER
        self._error = trace.StatusCode.ERROR

    @contextlib.contextmanager
    def request_span(self, method: str, route: str, headers: Any) -> Iterator[Any]:
        """The server span of one request, current inside the block; yields it.

        Args:
            method: the HTTP method.
            route: the route's path (``/v1/embeddings``).
            headers: the request's headers (a mapping with lower-case ``get``); a
                ``traceparent`` that is not W3C is ignored (a new trace starts).
        """
        carrier = {
            name: value
            for name, most in TRACE_HEADER_CHARS.items()
            if (value := headers.get(name)) and len(value) <= most
        }
        parent = self._propagator.extract(carrier)
        attributes = {"http.request.method": method, "http.route": route}
        with self.tracer.start_as_current_span(
            f"{method} {route}", context=parent, kind=self._server, attributes=attributes
        ) as span:
            yield span

    def finish(
        self, span: Any, status: int, tenant: str, model: str, inputs: int, tokens: int
    ) -> None:
        """Set the answered request's attributes on its span; ``ERROR`` for a 5xx ``status``.

        Args:
            span: what :meth:`request_span` yielded.
            status: the HTTP status answered.
            tenant: the tenant's name (``""``: none, a public route or a refused key).
            model: the model the request resolved to (``""``: none).
            inputs: texts embedded or pairs scored (0 unless served).
            tokens: their tokens (0 unless served).
        """
        span.set_attributes(
            {
                "http.response.status_code": status,
                "triton_embed.tenant": tenant,
                "triton_embed.model": model,
                "triton_embed.inputs": inputs,
                "triton_embed.tokens": tokens,
            }
        )
        if status >= 500:
            span.set_status(self._error, f"answered {status}")

    def shutdown(self) -> None:
        """Export the spans still buffered, then stop the exporter."""
        self.provider.shutdown()


def tracing_of(otlp_endpoint: str | None) -> GatewayTracing | None:
    """The gateway's tracing for ``--otlp-endpoint``; ``None`` (nothing created) without one.

    Raises:
        ValueError: the endpoint is not an http(s) URL.
    """
    return None if otlp_endpoint is None else GatewayTracing(otlp_endpoint)
