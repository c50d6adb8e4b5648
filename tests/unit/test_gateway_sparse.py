"""The gateway's ``POST /embed_sparse`` (TEI) against a test double of its upstreams (no server).

``SparsePool`` serves the embedding ensemble of ``test_gateway_app`` and a sparse ensemble
``splade`` (alias ``naver/splade-v3``, ``max_batch_size`` 2): a text's vector has one entry per
distinct word, index ``1000 + 10 x its position + len(word)``, weight ``len(word) / 10``;
``top_k`` keeps the largest weights, ``threshold`` those above it, as the sparse encoder step
does (docs/sparse.md); its tokens are its words plus 2.
"""

from __future__ import annotations

import numpy as np
import pytest
from triton_embed.codec import encode_sparse, frame_bytes
from triton_embed.transport.catalog import Catalog, ModelKind, SparseInfo, served_model

from tests.unit.gateway_fakes import rerank_info
from tests.unit.test_gateway_app import MODEL, FakeUpstreamPool, make_client, post

SPARSE = SparseInfo(
    name="splade",
    max_batch_size=2,
    tokenizer="splade_tokenizer",
    embedder="splade_sparse_encoder",
    tokenizer_max_batch_size=2,
    embedder_max_batch_size=2,
    served_model_name="naver/splade-v3",
    max_length=16,
)
TEXTS = ["the cat sat", "a very long sentence here", "dog"]


def reference(text: str, top_k: int | None = None, threshold: float = 0.0):
    """The double's sparse vector of ``text``: (indices ascending, float32 weights)."""
    entries = {1000 + 10 * i + len(w): np.float32(len(w) / 10) for i, w in enumerate(text.split())}
    kept = sorted(entries.items(), key=lambda kv: -kv[1])[:top_k]
    kept = sorted((i, w) for i, w in kept if w > threshold)
    return [i for i, _ in kept], np.array([w for _, w in kept], np.float32)


class SparsePool(FakeUpstreamPool):
    """``FakeUpstreamPool`` with a sparse ensemble ``splade`` beside ``embed``."""

    def __init__(self, models=(MODEL, SPARSE), **kwargs):
        super().__init__(Catalog.build(models), **kwargs)

    async def infer(self, model, inputs, outputs, parameters=None):
        if model != "splade":
            return await super().infer(model, inputs, outputs, parameters)
        texts = [bytes(t).decode() for t in inputs["TEXT"]]
        self.calls.append((model, len(texts), dict(parameters or {})))
        p = parameters or {}
        vectors = [reference(t, p.get("top_k"), p.get("threshold", 0.0)) for t in texts]
        counts = np.array([len(t.split()) + 2 for t in texts], "<i4")
        return {
            "SPARSE": frame_bytes(encode_sparse(*zip(*vectors, strict=True))),
            "NUM_TOKENS": counts.tobytes(),
        }


@pytest.fixture
def client():
    test_client, pool, _ = make_client(SparsePool())
    return test_client, pool


def as_tei(indices, weights):
    """TEI's entries; a weight as the shortest decimal of its float32 (what TEI writes)."""
    return [{"index": i, "value": float(str(w))} for i, w in zip(indices, weights, strict=True)]


def test_embed_sparse_answers_teis_shape_in_input_order_over_pieces(client):
    c, pool = client
    r = post(c, "/embed_sparse", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    assert r.json() == [as_tei(*reference(t)) for t in TEXTS]
    assert sorted(n for _, n, _ in pool.calls) == [1, 2]  # max_batch_size 2
    assert all(p == {"truncation": "NONE"} for _, _, p in pool.calls)  # TEI's truncate=false


def test_weights_are_written_as_float32_not_widened(client):
    c, _ = client
    r = post(c, "/embed_sparse", {"inputs": "abc"})
    assert r.status_code == 200, r.text
    assert b'"value":0.3}' in r.content  # float32(0.3), not 0.30000001192092896


def test_top_k_threshold_truncation_and_model_reach_the_ensemble(client):
    c, pool = client
    fields = {"inputs": [TEXTS[1]], "top_k": 2, "threshold": 0.15, "truncate": True,
              "truncation_direction": "Left", "model": "naver/splade-v3"}  # fmt: skip
    r = post(c, "/embed_sparse", fields)
    assert r.status_code == 200, r.text
    assert r.json() == [as_tei(*reference(TEXTS[1], 2, 0.15))]
    assert pool.calls == [("splade", 1, {"truncation": "START", "top_k": 2, "threshold": 0.15})]


@pytest.mark.parametrize(
    "fields, message, param",
    [
        ({"top_k": 0}, "top_k", "top_k"),
        ({"top_k": "many"}, "top_k", "top_k"),
        ({"threshold": -1}, "threshold", "threshold"),
        ({"threshold": "NaN"}, "threshold", "threshold"),
        ({"model": 3}, "'model' must be a string", "model"),
        ({"normalize": True}, "unknown field 'normalize'", None),
        ({"inputs": ["fine", ""]}, "inputs[1] is an empty string", "inputs"),
    ],
)
def test_bad_fields_are_400_naming_the_field_and_nothing_is_sent(client, fields, message, param):
    c, pool = client
    r = post(c, "/embed_sparse", {"inputs": TEXTS, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error_type"] == "Validation"
    assert message in r.json()["error"]
    assert pool.calls == []


def test_a_dense_model_asked_for_sparse_and_a_sparse_one_asked_for_dense_are_400(client):
    c, pool = client
    r = post(c, "/embed_sparse", {"inputs": TEXTS, "model": "embed"})
    assert r.status_code == 400, r.text
    assert "the model 'embed' is an embedding model, not a sparse model" in r.json()["error"]
    assert "sparse models by POST /embed_sparse" in r.json()["error"]
    r = post(c, "/v1/embeddings", {"input": "a cat", "model": "splade"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("wrong_model_kind", "model")
    assert "the model 'splade' is a sparse model" in error["message"]
    assert "POST /embed_sparse" in error["message"]
    assert pool.calls == []


def test_without_a_model_the_only_sparse_one_serves_and_several_must_be_named():
    c, _, _ = make_client(SparsePool(models=(MODEL,)))
    r = post(c, "/embed_sparse", {"inputs": TEXTS})
    assert r.status_code == 404 and "no sparse model is served" in r.json()["error"]
    other = SparseInfo(**{**SPARSE.__dict__, "name": "splade2", "served_model_name": None})
    c, _, _ = make_client(SparsePool(models=(MODEL, SPARSE, other)))
    r = post(c, "/embed_sparse", {"inputs": TEXTS})
    assert r.status_code == 400
    assert "several sparse models are served (splade, splade2)" in r.json()["error"]
    r = post(c, "/embed_sparse", {"inputs": TEXTS, "model": "splade"})
    assert r.status_code == 200


def test_the_catalog_reads_a_sparse_ensemble_by_its_outputs():
    config = {
        "name": "splade",
        "platform": "ensemble",
        "max_batch_size": 64,
        "output": [{"name": "SPARSE"}, {"name": "NUM_TOKENS"}],
        "ensemble_scheduling": {
            "step": [{"model_name": "splade_tokenizer"}, {"model_name": "splade_sparse_encoder"}]
        },
        "parameters": {"kind": {"string_value": "sparse"}, "max_length": {"string_value": "512"}},
    }
    info = served_model(config, {"splade_sparse_encoder": {"max_batch_size": 32}})
    assert isinstance(info, SparseInfo) and info.kind is ModelKind.SPARSE
    assert (info.output, info.embedder, info.embedder_max_batch_size) == (
        "SPARSE",
        "splade_sparse_encoder",
        32,
    )
    assert info.max_length == 512
    rerank = served_model({**config, "output": [{"name": "SCORE"}]}, {})
    assert rerank is None and rerank_info(4).kind is ModelKind.RERANKER


def test_models_and_info_name_the_sparse_kind():
    c, _, _ = make_client(SparsePool(), default_model="splade")
    models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert models["splade"]["kind"] == "sparse" and models["naver/splade-v3"]["root"] == "splade"
    info = c.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}
    assert (info["model_id"], info["max_input_length"]) == ("naver/splade-v3", 16)
    r = post(c, "/embed", {"inputs": "a cat"})  # the default model is sparse: not /embed's
    assert r.status_code == 400 and "POST /embed_sparse" in r.json()["error"]
    assert post(c, "/embed_sparse", {"inputs": "a cat"}).status_code == 200
