"""EmbeddingClient.embed_sparse without a server: vectors, pieces, options, errors.

The gRPC client is :class:`tests.fake_triton.FakeTriton`, which serves a sparse ensemble
``splade`` (``max_batch_size`` 4; word ``j`` of a text is index ``100 j + len(word)``, weight
``len(word)``).
"""

from __future__ import annotations

import numpy as np
import pytest
from triton_embed import EmbeddingClient, InvalidInputError, SparseResult

from tests import fake_triton as fake_server

TEXTS = ["the cat sat", "a considerably longer sentence", "dog", "x y", "last one"]


@pytest.fixture
def fake_triton(monkeypatch):
    return fake_server.install(monkeypatch)


def test_embed_sparse_returns_each_texts_vector_in_order_over_requests(fake_triton):
    with EmbeddingClient("h:1", model="splade") as client:
        result = client.embed_sparse(TEXTS)
    assert isinstance(result, SparseResult)
    for text, idx, val in zip(TEXTS, result.indices, result.weights, strict=True):
        want_idx, want_val = fake_server.sparse_vector(text.encode())
        assert idx.dtype == np.int32 and val.dtype == np.float32
        assert idx.tolist() == want_idx.tolist() and val.tolist() == want_val.tolist()
    assert result.num_tokens.tolist() == [len(t.split()) + 2 for t in TEXTS]
    assert [len(r) for r in fake_triton.requests] == [4, 1]  # max_batch_size 4
    assert fake_triton.parameters == [{}, {}]


def test_top_k_threshold_and_truncation_are_sent_and_dense_spreads_them(fake_triton):
    with EmbeddingClient("h:1") as client:  # an embedding client encodes with model=
        result = client.embed_sparse(
            [TEXTS[1]], model="splade", top_k=2, threshold=1.5, truncation="start"
        )
    assert fake_triton.parameters == [{"truncation": "START", "top_k": 2, "threshold": 1.5}]
    assert result.indices[0].tolist() == [112, 308]  # "considerably", "sentence"
    dense = result.dense(400)
    assert dense.shape == (1, 400) and dense[0, 112] == 12.0 and dense.sum() == 20.0
    with pytest.raises(ValueError, match="index 308 >= 300"):
        result.dense(300)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"top_k": 0}, "top_k"),
        ({"threshold": -0.5}, "threshold"),
        ({"truncation": "CHUNK"}, "not offered for sparse models"),
    ],
)
def test_bad_options_are_refused_before_sending(fake_triton, options, match):
    with EmbeddingClient("h:1", model="splade") as client:
        with pytest.raises(InvalidInputError, match=match):
            client.embed_sparse(TEXTS, **options)
    assert fake_triton.requests == []


def test_the_wrong_kind_is_refused_both_ways(fake_triton):
    with EmbeddingClient("h:1", model="embed") as client:
        with pytest.raises(InvalidInputError, match="'embed' is an embedding model"):
            client.embed_sparse(TEXTS)
        with pytest.raises(InvalidInputError, match="'splade' is a sparse model.*embed_sparse"):
            client.embed(TEXTS, model="splade")
    assert fake_triton.requests == []


def test_no_texts_is_an_empty_result_and_one_string_is_refused(fake_triton):
    with EmbeddingClient("h:1", model="splade") as client:
        assert client.embed_sparse([]).indices == []
        with pytest.raises(InvalidInputError, match="not a single str"):
            client.embed_sparse("one text")
