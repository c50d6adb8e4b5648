"""Request traces end to end: a W3C traceparent through the gateway into a real tritonserver.

The session ``server`` exports its traces (Triton 2.51's OpenTelemetry mode, OTLP/HTTP
JSON) to the session's OTLP receiver; a gateway started here with ``--otlp-endpoint``
exports its spans (OTLP/HTTP protobuf) to the same receiver. One request sent with a known
``traceparent`` must come back as one tree: the gateway's server span (child of the sent
span id, tenant and model attributes), its upstream client span, Triton's ``InferRequest``,
the ensemble's span, each step's span and their ``compute`` spans, all of the sent trace id.
"""

from __future__ import annotations

import secrets

import httpx
import numpy as np
import pytest
from triton_embed import EmbeddingClient
from triton_embed.transport.tracing import TraceContext, trace_context
from triton_embed_server.run.launcher import Gateway

pytestmark = [pytest.mark.integration]

API_KEY = "traces-test-key-0d41c9"
#: OpenTelemetry's span kinds, as OTLP numbers them.
SERVER, CLIENT = 2, 3
#: Triton's spans of one request to the ``embed`` ensemble (names as 2.51 exports them).
TRITON_SPANS = {"InferRequest", "embed", "tokenizer", "embedder"}
#: The steps' own spans (:mod:`triton_embed_server.steps.tracing`).
STEP_SPANS = {"tokenize", "engine"}


def new_traceparent() -> TraceContext:
    """A sampled W3C trace context with random ids."""
    return TraceContext(f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01", "vendor=abc")


@pytest.fixture(scope="module")
def traced_gateway(server, otlp_receiver):
    """A gateway exporting its spans to ``otlp_receiver`` (batch delay 100 ms)."""
    extra = ["--otlp-endpoint", otlp_receiver.url]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        gw = Gateway([server.grpc_url], server.admin_key, api_key=API_KEY, extra_args=extra)
        gw.start()
    try:
        yield gw
    finally:
        gw.stop()
        print(f"\ngateway log: {gw.log_path}")


def by_name(spans) -> dict:
    """``{name: [spans]}``."""
    named: dict = {}
    for s in spans:
        named.setdefault(s.name, []).append(s)
    return named


def assert_triton_tree(named: dict, parent_id: str) -> None:
    """Triton's spans: ``InferRequest`` under ``parent_id``, the ensemble under it, each step
    under the ensemble, a ``compute`` span under each step."""
    (request,) = named["InferRequest"]
    assert request.parent == parent_id
    (ensemble,) = named["embed"]
    assert ensemble.parent == request.span_id
    assert ensemble.attributes["triton.model_name"] == "embed"
    steps = {name: named[name][0] for name in ("tokenizer", "embedder")}
    for name, step in steps.items():
        assert step.parent == ensemble.span_id, name
        assert step.attributes["triton.model_name"] == name
        assert step.service == "triton-embed-server"
    computes = {c.parent for c in named["compute"]}
    assert {s.span_id for s in steps.values()} <= computes
    # The steps' own spans (steps/tracing.py), under Triton's span of their step.
    (tokenize,) = named["tokenize"]
    assert tokenize.parent == steps["tokenizer"].span_id
    assert tokenize.attributes["triton_embed.step"] == "tokenizer"
    (engine,) = named["engine"]
    assert engine.parent == steps["embedder"].span_id
    assert engine.attributes["triton_embed.batch_tokens"] > 0


def test_gateway_request_is_one_trace_from_the_gateway_to_each_step(
    traced_gateway, server, otlp_receiver
):
    sent = new_traceparent()
    texts = ["traces cross the gateway", "and reach every step"]
    r = httpx.post(
        f"{traced_gateway.base_url}/v1/embeddings",
        headers={"Authorization": f"Bearer {API_KEY}", **sent.headers()},
        json={"model": "embed", "input": texts, "encoding_format": "float"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key) as grpc:
        reference = grpc.embed(texts)  # the untraced gRPC path: the same vectors
    got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    assert np.array_equal(got, reference)

    names = {"POST /v1/embeddings", "triton.infer embed", *TRITON_SPANS, *STEP_SPANS}
    spans = otlp_receiver.wait_for(sent.trace_id, names, at_least={"compute": 2})
    named = by_name(spans)
    print(f"\ntrace {sent.trace_id}, sent span {sent.span_id}:")
    for s in spans:
        print(f"  {s.service:21} {s.name:20} {s.span_id} parent {s.parent}")
    assert all(s.trace_id == sent.trace_id for s in spans)
    (request,) = named["POST /v1/embeddings"]
    assert request.parent == sent.span_id
    assert request.kind == SERVER and request.service == "triton-embed-gateway"
    assert request.attributes["triton_embed.tenant"] == "default"  # the API key's tenant
    assert request.attributes["triton_embed.model"] == "embed"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["triton_embed.inputs"] == len(texts)
    assert request.attributes["triton_embed.tokens"] > 0
    (call,) = named["triton.infer embed"]
    assert call.parent == request.span_id and call.kind == CLIENT
    assert call.attributes["triton.model_name"] == "embed"
    assert_triton_tree(named, call.span_id)


def test_gateway_answers_a_bad_traceparent_and_starts_a_new_trace(traced_gateway):
    r = httpx.post(
        f"{traced_gateway.base_url}/v1/embeddings",
        headers={"Authorization": f"Bearer {API_KEY}", "traceparent": "00-zz-not-w3c"},
        json={"model": "embed", "input": ["a malformed traceparent is ignored"]},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def test_client_library_sends_its_trace_context_to_triton(server, otlp_receiver):
    sent, around = new_traceparent(), new_traceparent()
    text = ["a traced call from the client library"]
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key) as client:
        traced = client.embed(text, traceparent=sent.traceparent)
        with trace_context(around):  # every call in the block: here, rerank's path too
            in_block = client.embed(text)
        untraced = client.embed(text)
    np.testing.assert_array_equal(traced, untraced)
    np.testing.assert_array_equal(in_block, untraced)
    for context in (sent, around):
        named = by_name(
            otlp_receiver.wait_for(
                context.trace_id, TRITON_SPANS | STEP_SPANS, at_least={"compute": 2}
            )
        )
        assert_triton_tree(named, context.span_id)
