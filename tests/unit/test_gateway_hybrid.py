"""The gateway's routes on a hybrid (BGE-M3) model against a test double of its upstreams.

``HybridPool`` serves the embedding ensemble of ``test_gateway_app`` and a hybrid ensemble
``m3`` (dimension 2, ColBERT dimension 3): for a text of ``w`` words (``w + 2`` tokens) the
dense vector is ``[w, 1]``, the sparse vector ``{w: 0.5}`` and the ColBERT matrix ``w + 1``
rows ``[j, w, 0]`` (the CLS token left out, as the server answers); an output the request's
``outputs`` parameter leaves out has empty elements, as the server's.
"""

from __future__ import annotations

import numpy as np
import pytest
from triton_embed.codec import (
    encode_embeddings,
    encode_sparse,
    encode_token_matrices,
    frame_bytes,
)
from triton_embed.transport.catalog import Catalog, ModelKind, served_model
from triton_embed.transport.hybrid_info import (
    HybridDense,
    HybridInfo,
    HybridTokens,
    any_served_model,
)

from tests.unit.test_gateway_app import MODEL, FakeUpstreamPool, make_client, post

M3 = HybridInfo(
    name="m3",
    max_batch_size=2,
    tokenizer="m3_tokenizer",
    embedder="m3_hybrid_encoder",
    tokenizer_max_batch_size=2,
    embedder_max_batch_size=2,
    served_model_name="BAAI/bge-m3",
    dimension=2,
    max_length=16,
    pooling="cls",
    normalize=True,  # as HybridInfo.from_configs states it: the gateway does not normalize
    colbert_dimension=3,
    vocab_size=100,
)
TEXTS = ["the cat sat", "a very long sentence here", "dog"]


def colbert(text: str) -> np.ndarray:
    words = len(text.split())
    return np.array([[j, words, 0] for j in range(words + 1)], np.float32)


class HybridPool(FakeUpstreamPool):
    """``FakeUpstreamPool`` with a hybrid ensemble ``m3`` beside ``embed``."""

    def __init__(self):
        super().__init__(Catalog.build([MODEL, M3]))

    async def infer(self, model, inputs, outputs, parameters=None):
        if model != "m3":
            return await super().infer(model, inputs, outputs, parameters)
        texts = [bytes(t).decode() for t in inputs["TEXT"]]
        self.calls.append((model, len(texts), dict(parameters or {})))
        heads = (parameters or {}).get("outputs", "dense,sparse,colbert").split(",")
        words = [len(t.split()) for t in texts]
        empty = frame_bytes([b""] * len(texts))
        return {
            "EMBEDDING": frame_bytes(encode_embeddings(np.array([[w, 1] for w in words],
                                                                np.float32)))
            if "dense" in heads else empty,
            "SPARSE": frame_bytes(encode_sparse([[w] for w in words], [[0.5]] * len(words)))
            if "sparse" in heads else empty,
            "TOKEN_EMBEDDINGS": frame_bytes(encode_token_matrices([colbert(t) for t in texts]))
            if "colbert" in heads else empty,
            "NUM_TOKENS": np.array([w + 2 for w in words], "<i4").tobytes(),
        }  # fmt: skip


@pytest.fixture
def client():
    test_client, pool, _ = make_client(HybridPool())
    return test_client, pool


def test_openai_embeddings_ask_for_the_dense_head_only(client):
    c, pool = client
    r = post(c, "/v1/embeddings", {"input": TEXTS, "model": "BAAI/bge-m3"})
    assert r.status_code == 200, r.text
    got = [d["embedding"] for d in r.json()["data"]]
    assert got == [[float(len(t.split())), 1.0] for t in TEXTS]
    assert pool.calls and all(p["outputs"] == "dense" for _, _, p in pool.calls)


def test_embed_sparse_asks_for_the_sparse_head_with_its_cuts(client):
    c, pool = client
    r = post(c, "/embed_sparse", {"inputs": TEXTS, "model": "m3", "top_k": 4})
    assert r.status_code == 200, r.text
    assert r.json() == [[{"index": len(t.split()), "value": 0.5}] for t in TEXTS]
    assert all(p["outputs"] == "sparse" and p["top_k"] == 4 for _, _, p in pool.calls)


def test_a_hybrid_default_model_serves_the_tei_routes_without_a_model_field():
    c, pool, _ = make_client(HybridPool(), default_model="m3")
    r = post(c, "/embed_sparse", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    r = post(c, "/embed", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    assert r.json() == [[float(len(t.split())), 1.0] for t in TEXTS]
    assert [p["outputs"] for _, _, p in pool.calls] == ["sparse"] * 2 + ["dense"] * 2


def test_embed_all_reads_the_colbert_rows_without_the_cls_token(client):
    c, pool = client
    r = post(c, "/embed_all", {"inputs": TEXTS, "model": "m3"})
    assert r.status_code == 200, r.text
    assert r.json() == [colbert(t).tolist() for t in TEXTS]
    assert all(p["outputs"] == "colbert" for _, _, p in pool.calls)


@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        ("/v1/embeddings", {"input": "x", "model": "m3", "dimensions": 1},
         "dimensions=1 is not offered for hybrid models"),
        ("/v2/rerank", {"model": "m3", "query": "q", "documents": ["a"]},
         "the model 'm3' is a hybrid model (BGE-M3), not a reranker: hybrid models are "
         "served by POST /v1/embeddings, /embed_sparse and /embed_all"),
    ],
)  # fmt: skip
def test_what_a_hybrid_model_does_not_do_is_400_and_nothing_is_sent(client, route, body, message):
    c, pool = client
    r = post(c, route, body)
    assert r.status_code == 400, r.text
    assert message in r.text
    assert pool.calls == []


def test_the_catalog_reads_a_hybrid_ensemble_and_views_it_as_each_kind():
    config = {
        "name": "m3",
        "platform": "ensemble",
        "max_batch_size": 64,
        "output": [{"name": n} for n in ("EMBEDDING", "SPARSE", "TOKEN_EMBEDDINGS", "NUM_TOKENS")],
        "ensemble_scheduling": {
            "step": [{"model_name": "m3_tokenizer"}, {"model_name": "m3_hybrid_encoder"}]
        },
        "parameters": {
            "kind": {"string_value": "hybrid"},
            "dimension": {"string_value": "1024"},
            "colbert_dimension": {"string_value": "1024"},
            "vocab_size": {"string_value": "250002"},
            "max_length": {"string_value": "8192"},
            "max_response_bytes": {"string_value": str(16 * 2**20)},
        },
    }
    assert served_model(config, {}) is None  # the catalog's own kinds only
    info = any_served_model(config, {})
    assert isinstance(info, HybridInfo) and info.kind is ModelKind.HYBRID
    assert (info.dimension, info.colbert_dimension, info.vocab_size) == (1024, 1024, 250002)
    dense, tokens = info.view(ModelKind.EMBEDDING), info.view(ModelKind.MULTIVECTOR)
    assert isinstance(dense, HybridDense) and dense.kind is ModelKind.EMBEDDING
    assert (dense.pooling, dense.normalize, dense.output) == ("cls", True, "EMBEDDING")
    assert isinstance(tokens, HybridTokens) and tokens.output == "TOKEN_EMBEDDINGS"
    # 16 MiB // (4 x 8192 x 1024) = 0 texts: one text per call, its ColBERT rows fit
    assert tokens.piece_size(None) == 1
    assert info.view(ModelKind.SPARSE).dimension == 250002
    with pytest.raises(ValueError, match="not served as reranker"):
        info.view(ModelKind.RERANKER)
    models = {m["id"]: m for m in make_client(HybridPool())[0].get("/v1/models").json()["data"]}
    assert models["m3"]["kind"] == "hybrid"
