"""Traces to an OTLP/HTTP endpoint: its URL, the ``tritonserver`` flags, the span exporter.

One URL serves every end (docs/operations.md, "Traces"): the gateway's
``--otlp-endpoint`` (its spans, :mod:`~triton_embed_server.gateway.tracing`), Triton's
OpenTelemetry trace mode (:func:`tritonserver_trace_args`) and the steps' own spans
(:func:`tritonserver_trace_env`, :mod:`~triton_embed_server.steps.tracing`); the server's
are set by ``scripts/serve.sh``'s ``OTLP_ENDPOINT`` and
:class:`~triton_embed_server.run.launcher.TritonServer`'s ``otlp_endpoint``.
``python -m triton_embed_server.run.trace_args URL [RATE]`` prints the flags one per line,
for ``scripts/serve.sh``.

What Triton 2.51 (the PyPI wheel's ``tritonserver``) does with them, measured: it exports
OTLP/HTTP **JSON** (``Content-Type: application/json``, ids in hex) to the URL; a request
whose gRPC metadata holds a ``traceparent`` is traced whatever the rate (at rate 1000 the
untraced request before it was not), with that trace id, its ``InferRequest`` span a
child of the sent span id, then the ensemble's span (named after the model), each step's
span under it, and a ``compute`` span under each step. At ``rate=1`` every request without
a ``traceparent`` starts a trace of its own too.
"""

from __future__ import annotations

import random
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: The environment variable that gives the steps (Python-backend stubs) the OTLP/HTTP URL
#: of their own spans (:mod:`triton_embed_server.steps.tracing`); unset: no step spans.
STEP_ENDPOINT_ENV = "TRITON_EMBED_OTLP_ENDPOINT"
#: OTLP/HTTP's path for traces (the OTLP specification's default).
OTLP_TRACES_PATH = "/v1/traces"
#: Triton's sampling rate by default: 1 in this many requests without a ``traceparent``
#: starts a trace of its own (a request with one is always traced, see above). 1: every
#: request, as Triton's own examples; set a large rate to trace only what clients trace.
DEFAULT_TRACE_RATE = 1


def otlp_traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of ``endpoint``.

    As given, or with ``/v1/traces`` when it has no path (``http://collector:4318`` ->
    ``http://collector:4318/v1/traces``).

    Raises:
        ValueError: not an ``http://`` or ``https://`` URL with a host; names it.
    """
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"OTLP endpoint {endpoint!r} is not an http(s) URL: give the collector's OTLP/HTTP "
            "URL, e.g. http://otel-collector:4318 (/v1/traces is added when no path is given)"
        )
    if parts.path in ("", "/"):
        parts = parts._replace(path=OTLP_TRACES_PATH)
    return urlunsplit(parts)


def tritonserver_trace_args(endpoint: str, rate: int = DEFAULT_TRACE_RATE) -> list[str]:
    """The ``tritonserver`` flags that export its traces to ``endpoint``.

    OpenTelemetry mode, sampling ``rate`` (1 in ``rate`` requests without a
    ``traceparent``), level ``TIMESTAMPS``, the service name ``triton-embed-server``.

    Raises:
        ValueError: ``endpoint`` is not an http(s) URL; ``rate`` < 1.
    """
    if rate < 1:
        raise ValueError(f"trace rate must be >= 1 (1 in rate requests), got {rate}")
    return [
        "--trace-config", "mode=opentelemetry",
        "--trace-config", f"rate={rate}",
        "--trace-config", "level=TIMESTAMPS",
        "--trace-config", f"opentelemetry,url={otlp_traces_url(endpoint)}",
        "--trace-config", "opentelemetry,resource=service.name=triton-embed-server",
    ]  # fmt: skip


def tritonserver_trace_env(endpoint: str) -> dict[str, str]:
    """The environment that gives the steps their spans' endpoint (:data:`STEP_ENDPOINT_ENV`).

    Raises:
        ValueError: ``endpoint`` is not an http(s) URL.
    """
    return {STEP_ENDPOINT_ENV: otlp_traces_url(endpoint)}


def otlp_tracer_provider(endpoint: str, service_name: str, exporter: Any = None) -> Any:
    """An OpenTelemetry SDK ``TracerProvider`` exporting to ``endpoint`` in batches.

    The gateway's and each step's (:mod:`~triton_embed_server.gateway.tracing`,
    :mod:`~triton_embed_server.steps.tracing`). Ids come from the operating system's
    random source: the SDK's default draws them from Python's ``random``, which vLLM seeds
    with a fixed seed in every engine step, so every replica would make the same span ids
    (measured: the same ``engine`` span id in two runs).

    Args:
        endpoint: the OTLP/HTTP URL (:func:`otlp_traces_url`).
        service_name: the ``service.name`` resource attribute.
        exporter: the span exporter (default: OTLP/HTTP protobuf to ``endpoint``; tests pass
            an in-memory one).

    Raises:
        ValueError: ``endpoint`` is not an http(s) URL.
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class SystemRandomIds(IdGenerator):
        """Trace and span ids from ``random.SystemRandom`` (never 0: the invalid id)."""

        source = random.SystemRandom()

        def generate_span_id(self) -> int:
            return self.source.randrange(1, 2**64)

        def generate_trace_id(self) -> int:
            return self.source.randrange(1, 2**128)

    url = otlp_traces_url(endpoint)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=url)
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}), id_generator=SystemRandomIds()
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def main(argv: list[str] | None = None) -> int:
    """Print :func:`tritonserver_trace_args` of ``URL [RATE]``, one per line; 2 on a bad one."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) not in (1, 2):
            raise ValueError("usage: python -m triton_embed_server.run.trace_args URL [RATE]")
        rate = int(args[1]) if len(args) == 2 else DEFAULT_TRACE_RATE
        print("\n".join(tritonserver_trace_args(args[0], rate)))
    except ValueError as exc:
        print(f"trace_args: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
