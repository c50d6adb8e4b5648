"""Traces without a server: the W3C context, the call spans, the gateway's spans, no cost off.

The end-to-end tree (gateway, upstream call, Triton's ensemble and steps) is
tests/integration/test_traces.py.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import textwrap

import pytest
from triton_embed.transport.tracing import (
    NOT_TRACED,
    TraceContext,
    call_span,
    capture,
    trace_context,
)
from triton_embed_server.gateway.tracing import GatewayTracing, tracing_of
from triton_embed_server.run.launcher import TritonServer
from triton_embed_server.run.trace_args import (
    STEP_ENDPOINT_ENV,
    main,
    otlp_traces_url,
    tritonserver_trace_args,
)
from triton_embed_server.steps.tracing import StepTracing, step_tracing

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_w3c_traceparent_is_read_and_carried_as_headers():
    ctx = TraceContext(PARENT, "vendor=abc")
    assert (ctx.trace_id, ctx.span_id) == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    assert ctx.headers() == {"traceparent": PARENT, "tracestate": "vendor=abc"}
    assert TraceContext(PARENT).headers() == {"traceparent": PARENT}


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  # upper case
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero span id
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # forbidden version
    ],
)
def test_a_malformed_traceparent_is_refused_with_the_form_it_must_have(bad):
    with pytest.raises(ValueError, match="is not a W3C trace context: expected '00-<32 hex"):
        TraceContext(bad)


def test_an_explicit_context_is_the_calls_parent_only_inside_its_block():
    assert "opentelemetry.trace" not in sys.modules or capture() is None
    with trace_context(PARENT, "vendor=abc"):
        parent = capture()
        with call_span(parent, "embed", "127.0.0.1:8001") as headers:
            # Without OpenTelemetry in use the headers go as given; with it (another test
            # imported it), a client span child of PARENT: same trace, parent's flags.
            assert headers["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
    assert capture() is None
    assert call_span(None, "embed", "127.0.0.1:8001") is NOT_TRACED
    with NOT_TRACED as headers:
        assert headers is None


def traceparent_of(parent) -> str | None:
    """The ``traceparent`` a captured parent stands for (``None``: not traced)."""
    if parent is None or isinstance(parent, TraceContext):
        return None if parent is None else parent.traceparent
    from opentelemetry import trace  # a Context: OpenTelemetry is in use in this process

    c = trace.get_current_span(parent).get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


def test_a_methods_traceparent_is_its_calls_parent_and_a_bad_one_is_refused():
    from triton_embed import InvalidInputError
    from triton_embed.retry import RetryPolicy
    from triton_embed.transport.calls import send_all, trace_argument

    seen = []

    def send(start, stop, calls):
        seen.append(calls.trace)
        return stop - start

    other = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"
    with trace_context(other):
        send_all(4, 2, send, RetryPolicy(retries=0), 2, trace=trace_argument(PARENT))
        send_all(2, 2, send, RetryPolicy(retries=0), 1)
    assert send_all(2, 2, send, RetryPolicy(retries=0), 1).results == [2]
    assert [traceparent_of(p) for p in seen] == [PARENT, PARENT, other, None]
    assert trace_argument(None) is None
    with pytest.raises(InvalidInputError, match="is not a W3C trace context"):
        trace_argument("00-abc")
    with pytest.raises(InvalidInputError, match="got int"):
        trace_argument(17)


def test_nothing_configured_creates_no_tracer_and_imports_no_opentelemetry():
    # A fresh process: the gateway app of default settings, an upstream call's trace
    # capture, and the client library's call setup; nothing imports opentelemetry.
    code = textwrap.dedent(
        """
        import sys
        from triton_embed.transport.tracing import call_span, capture, NOT_TRACED
        from triton_embed_server.gateway.routes import create_app
        from triton_embed_server.gateway.settings import GatewaySettings
        from triton_embed_server.gateway.tracing import tracing_of
        import triton_embed.client

        app = create_app(GatewaySettings(upstreams=("127.0.0.1:1",)))
        assert tracing_of(None) is None
        assert capture() is None and call_span(capture(), "embed", "h:1") is NOT_TRACED
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        assert not loaded, loaded
        print("ok")
        """
    )
    env = {**os.environ, "TRITON_EMBED_ADMIN_KEY": "k" * 32}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_gateway_span_is_the_child_of_the_incoming_traceparent_and_the_calls_parent():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing = GatewayTracing("http://127.0.0.1:4318", exporter=exporter)
    assert tracing.endpoint == "http://127.0.0.1:4318/v1/traces"
    with tracing.request_span("POST", "/v1/embeddings", {"traceparent": PARENT}) as span:
        with call_span(capture(), "embed", "[::1]:8001") as headers:
            pass
        tracing.finish(span, 200, "team-a", "embed", 2, 17)
    with tracing.request_span("POST", "/embed", {"traceparent": "00-bad"}) as span:
        tracing.finish(span, 503, "", "", 0, 0)
    tracing.shutdown()
    request, failed = (s for s in exporter.get_finished_spans() if s.name.startswith("POST"))
    (call,) = (s for s in exporter.get_finished_spans() if s.name == "triton.infer embed")
    assert format(request.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert format(request.parent.span_id, "016x") == "b7ad6b7169203331"
    assert request.attributes["triton_embed.tenant"] == "team-a"
    assert request.attributes["triton_embed.model"] == "embed"
    assert request.attributes["triton_embed.tokens"] == 17
    assert request.status.is_ok
    assert call.parent.span_id == request.context.span_id
    assert call.attributes["server.address"] == "::1" and call.attributes["server.port"] == 8001
    assert (
        headers["traceparent"]
        == f"00-{request.context.trace_id:032x}-{call.context.span_id:016x}-01"
    )
    assert failed.parent is None  # a malformed traceparent starts a new trace
    assert not failed.status.is_ok and failed.attributes["http.response.status_code"] == 503


def test_the_otlp_endpoint_and_tritonservers_trace_flags(capsys):
    assert otlp_traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert otlp_traces_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"
    with pytest.raises(ValueError, match="is not an http\\(s\\) URL"):
        otlp_traces_url("collector:4318")
    with pytest.raises(ValueError, match="trace rate must be >= 1"):
        tritonserver_trace_args("http://c:4318", 0)
    args = tritonserver_trace_args("http://c:4318", 100)
    pairs = [args[i + 1] for i in range(0, len(args), 2)]
    assert set(args[::2]) == {"--trace-config"}
    assert {"mode=opentelemetry", "rate=100", "opentelemetry,url=http://c:4318/v1/traces"} <= set(
        pairs
    )
    assert main(["http://c:4318"]) == 0
    assert capsys.readouterr().out.split("\n")[:4] == args[:2] + ["--trace-config", "rate=1"]
    assert main(["c:4318"]) == 2
    assert tracing_of(None) is None


class StepRequest:
    """A Python-backend request as the steps' tracing reads it: ``trace().get_context()``."""

    def __init__(self, context: str | None):
        self.context = context

    def trace(self) -> StepRequest:
        return self

    def get_context(self) -> str | None:
        return self.context


def test_a_step_spans_each_traced_request_of_its_batch_under_its_step_span(monkeypatch):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing = StepTracing("http://c:4318", "tokenizer", exporter=exporter)
    # Triton 2.51 hands a traced request's context as JSON, an untraced one's as None.
    batch = [StepRequest(json.dumps({"traceparent": PARENT})), StepRequest(None)]
    figures = {"requests": 2, "texts": 3, "tokens": 40}
    assert tracing.record("tokenize", batch, 1_000_000, 3_500_000, figures) == 1
    tracing.shutdown()
    (span,) = exporter.get_finished_spans()
    assert span.name == "tokenize"
    assert format(span.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    assert (span.start_time, span.end_time) == (1_000_000, 3_500_000)
    assert span.attributes["triton_embed.step"] == "tokenizer"
    assert span.attributes["triton_embed.batch_tokens"] == 40
    assert span.resource.attributes["service.name"] == "triton-embed-server"
    monkeypatch.delenv(STEP_ENDPOINT_ENV, raising=False)
    assert step_tracing("tokenizer") is None  # no endpoint: nothing created


def test_span_ids_do_not_follow_pythons_random_which_vllm_seeds():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    batch = [StepRequest(json.dumps({"traceparent": PARENT}))]
    ids = []
    for _ in range(2):  # two replicas, each seeded as vLLM seeds it
        random.seed(0)
        exporter = InMemorySpanExporter()
        tracing = StepTracing("http://c:4318", "embedder", exporter=exporter)
        tracing.record("engine", batch, 1, 2, {"tokens": 1})
        tracing.shutdown()
        ids += [s.context.span_id for s in exporter.get_finished_spans()]
    assert len(ids) == 2 and ids[0] != ids[1]


def test_the_launcher_turns_on_tritons_tracing_and_the_steps_spans_only_with_an_endpoint():
    off = TritonServer(extra_args=["--log-verbose", "0"])
    assert "--trace-config" not in off.command() and off.trace_env() == {}
    on = TritonServer(
        extra_args=["--log-verbose", "0"], otlp_endpoint="http://c:4318", trace_rate=7
    )
    command = on.command()
    assert "rate=7" in command and "opentelemetry,url=http://c:4318/v1/traces" in command
    assert on.trace_env() == {STEP_ENDPOINT_ENV: "http://c:4318/v1/traces"}


def test_the_gateway_refuses_a_bad_otlp_endpoint_before_it_listens(capsys):
    from triton_embed_server.gateway import command

    assert command.main(["--upstream", "127.0.0.1:1", "--otlp-endpoint", "collector:4318"]) == 1
    assert "OTLP endpoint 'collector:4318' is not an http(s) URL" in capsys.readouterr().err


def test_each_gateway_request_is_one_server_span_with_its_tenant_model_and_status():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from starlette.testclient import TestClient
    from triton_embed_server.gateway.app import Gateway
    from triton_embed_server.gateway.metrics import GatewayMetrics
    from triton_embed_server.gateway.routes import build_app
    from triton_embed_server.gateway.settings import GatewaySettings

    from tests.unit.test_gateway_app import KEY, FakeUpstreamPool, upstream_error

    exporter = InMemorySpanExporter()
    tracing = GatewayTracing("http://127.0.0.1:4318", exporter=exporter)
    pool = FakeUpstreamPool()
    settings = GatewaySettings(upstreams=("127.0.0.1:1",))
    gateway = Gateway(settings, pool, GatewayMetrics(), KEY, tracing=tracing)
    client = TestClient(build_app(gateway), raise_server_exceptions=False)
    headers = {"Authorization": f"Bearer {KEY}", "traceparent": PARENT}
    body = {"model": "org/model", "input": ["one text", "two texts here"]}
    assert client.post("/v1/embeddings", json=body, headers=headers).status_code == 200
    assert client.get("/health").status_code == 200  # a probe: no span
    pool.fail = upstream_error("UNAVAILABLE", "failed to connect to all addresses")
    assert client.post("/v1/embeddings", json=body, headers=headers).status_code == 503
    tracing.shutdown()
    served, failed = exporter.get_finished_spans()
    assert served.name == failed.name == "POST /v1/embeddings"
    assert format(served.parent.span_id, "016x") == "b7ad6b7169203331"
    assert served.attributes["triton_embed.tenant"] == "default"
    assert served.attributes["triton_embed.model"] == "embed"  # the alias resolved
    assert served.attributes["triton_embed.inputs"] == 2
    assert served.attributes["triton_embed.tokens"] == 2 + 2 + 3 + 2  # the fake's counts
    assert served.status.is_ok and served.attributes["http.response.status_code"] == 200
    assert not failed.status.is_ok and failed.attributes["http.response.status_code"] == 503
    assert failed.attributes["triton_embed.tokens"] == 0


def test_an_oversized_tracestate_is_dropped_before_the_propagator_logs_it(caplog):
    """A client's 5 KB tracestate was written into the gateway's log by OpenTelemetry."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing = GatewayTracing("http://127.0.0.1:4318", exporter=exporter)
    junk = "x" * 5000
    with caplog.at_level(logging.DEBUG):
        headers = {"traceparent": PARENT, "tracestate": f"k={junk}"}
        with tracing.request_span("POST", "/v1/embeddings", headers) as span:
            tracing.finish(span, 200, "", "embed", 1, 1)
        with tracing.request_span("POST", "/embed", {"traceparent": PARENT + junk}) as span:
            tracing.finish(span, 200, "", "embed", 1, 1)
    tracing.shutdown()
    kept, dropped = exporter.get_finished_spans()
    assert format(kept.parent.span_id, "016x") == "b7ad6b7169203331"  # traceparent still read
    assert dropped.parent is None  # an over-long traceparent: a new trace
    assert junk not in caplog.text
