"""The gateway's ``POST /embed_all`` (TEI) against a test double of its upstreams (no server).

``TokensPool`` serves the embedding ensemble of ``test_gateway_app`` and a multi-vector
ensemble ``colbert`` (alias ``colbert-ir/colbertv2.0``, ``max_batch_size`` 2, dimension 3):
a text's token ``j`` (of its words plus 2) has the vector ``[j, len(text), q]`` where ``q`` is
1 for ``input_type=query``, else 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from triton_embed.codec import encode_token_matrices, frame_bytes
from triton_embed.transport.catalog import Catalog, ModelKind, MultiVectorInfo, served_model

from tests.unit.test_gateway_app import MODEL, FakeUpstreamPool, make_client, post

COLBERT = MultiVectorInfo(
    name="colbert",
    max_batch_size=2,
    tokenizer="colbert_tokenizer",
    embedder="colbert_token_encoder",
    tokenizer_max_batch_size=2,
    embedder_max_batch_size=2,
    served_model_name="colbert-ir/colbertv2.0",
    dimension=3,
    max_length=16,
    query_length=8,
)
TEXTS = ["the cat sat", "a very long sentence here", "dog"]


def reference(text: str, query: bool = False) -> np.ndarray:
    rows = len(text.split()) + 2
    return np.array([[j, len(text), float(query)] for j in range(rows)], np.float32)


class TokensPool(FakeUpstreamPool):
    """``FakeUpstreamPool`` with a multi-vector ensemble ``colbert`` beside ``embed``."""

    def __init__(self, models=(MODEL, COLBERT), **kwargs):
        super().__init__(Catalog.build(models), **kwargs)

    async def infer(self, model, inputs, outputs, parameters=None):
        if model != "colbert":
            return await super().infer(model, inputs, outputs, parameters)
        texts = [bytes(t).decode() for t in inputs["TEXT"]]
        self.calls.append((model, len(texts), dict(parameters or {})))
        query = (parameters or {}).get("input_type") == "query"
        matrices = [reference(t, query) for t in texts]
        return {
            "TOKEN_EMBEDDINGS": frame_bytes(encode_token_matrices(matrices)),
            "NUM_TOKENS": np.array([len(m) for m in matrices], "<i4").tobytes(),
        }


@pytest.fixture
def client():
    test_client, pool, _ = make_client(TokensPool())
    return test_client, pool


def test_embed_all_answers_one_vector_per_token_in_input_order_over_pieces(client):
    c, pool = client
    r = post(c, "/embed_all", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    assert r.json() == [reference(t).tolist() for t in TEXTS]
    assert sorted(n for _, n, _ in pool.calls) == [1, 2]  # max_batch_size 2
    assert all(p == {"truncation": "NONE"} for _, _, p in pool.calls)  # TEI's truncate=false


def test_prompt_name_is_the_input_type_and_the_alias_names_the_model(client):
    c, pool = client
    fields = {"inputs": "the cat", "prompt_name": "query", "truncate": True,
              "model": "colbert-ir/colbertv2.0"}  # fmt: skip
    r = post(c, "/embed_all", fields)
    assert r.status_code == 200, r.text
    assert r.json() == [reference("the cat", query=True).tolist()]
    assert pool.calls == [("colbert", 1, {"truncation": "END", "input_type": "query"})]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"prompt_name": "passage"}, "prompt_name='passage' must be one of document, query"),
        ({"model": 3}, "'model' must be a string"),
        ({"top_k": 3}, "unknown field 'top_k'"),
    ],
)
def test_bad_fields_are_400_and_nothing_is_sent(client, fields, message):
    c, pool = client
    r = post(c, "/embed_all", {"inputs": TEXTS, **fields})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]
    assert pool.calls == []


def test_wrong_kinds_are_400_both_ways(client):
    c, pool = client
    r = post(c, "/embed_all", {"inputs": TEXTS, "model": "embed"})
    assert r.status_code == 400, r.text
    assert "the model 'embed' is an embedding model, not a multi-vector model" in r.json()["error"]
    r = post(c, "/v1/embeddings", {"input": "a cat", "model": "colbert"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "wrong_model_kind"
    assert "the model 'colbert' is a multi-vector model" in error["message"]
    assert "POST /embed_all" in error["message"]
    assert pool.calls == []


def test_the_catalog_reads_a_multivector_ensemble_and_its_cap():
    config = {
        "name": "colbert",
        "platform": "ensemble",
        "max_batch_size": 64,
        "output": [{"name": "TOKEN_EMBEDDINGS"}, {"name": "NUM_TOKENS"}],
        "ensemble_scheduling": {
            "step": [{"model_name": "colbert_tokenizer"}, {"model_name": "colbert_token_encoder"}]
        },
        "parameters": {
            "kind": {"string_value": "multivector"},
            "dimension": {"string_value": "384"},
            "max_length": {"string_value": "256"},
            "query_length": {"string_value": "32"},
            "max_response_bytes": {"string_value": str(16 * 2**20)},
        },
    }
    info = served_model(config, {})
    assert isinstance(info, MultiVectorInfo) and info.kind is ModelKind.MULTIVECTOR
    assert (info.dimension, info.max_length, info.query_length) == (384, 256, 32)
    # 16 MiB // (4 x 256 x 384) = 42 texts per call, within the 64 of max_batch_size
    assert info.piece_size(None) == 42
    models = {m["id"]: m for m in make_client(TokensPool())[0].get("/v1/models").json()["data"]}
    assert models["colbert"]["kind"] == "multivector"


def test_embed_all_refuses_more_inputs_than_one_response_may_carry_before_any_call():
    # 16 tokens x 3 values x 4 bytes = 192 bytes per input; a 1,000-byte cap holds 5 inputs
    small_cap = MultiVectorInfo(**{**COLBERT.__dict__, "max_response_bytes": 1000})
    c, pool, _ = make_client(TokensPool(models=(MODEL, small_cap)))
    r = post(c, "/embed_all", {"inputs": ["dog"] * 5})
    assert r.status_code == 200, r.text
    calls = len(pool.calls)
    r = post(c, "/embed_all", {"inputs": ["dog"] * 6})
    assert r.status_code == 413, r.text
    assert r.json()["error_type"] == "Validation"
    assert r.json()["error"] == (
        "/embed_all takes at most 5 inputs for model 'colbert', got 6: each may carry 16 "
        "tokens x 3 values x 4 bytes = 192 bytes and a response at most 1000 bytes (the "
        "model's max_response_bytes); send at most 5 inputs per request"
    )
    assert len(pool.calls) == calls  # refused before any upstream call


def test_token_id_pieces_fit_the_response_cap_as_text_pieces_do():
    # 192 bytes per input at full length (16 x 3 x 4): 5 under a 1,000-byte cap
    capped = MultiVectorInfo(
        **{**COLBERT.__dict__, "embedder_max_batch_size": 64, "max_response_bytes": 1000}
    )
    assert capped.token_ids_piece_size() == 5
    assert capped.piece_size(None) == min(capped.max_batch_size, 5)
    assert (
        MultiVectorInfo(
            **{**COLBERT.__dict__, "embedder_max_batch_size": 64}
        ).token_ids_piece_size()
        == 64
    )
