"""A text's SPLADE weights to its sparse vector (``steps.sparse_vectors``), against references.

References: a plain mask (weights above the threshold) and sentence-transformers' own top-k
(``select_max_active_dims``, what ``SparseEncoder.encode(max_active_dims=k)`` applies); the
result round-trips through the wire codec.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from triton_embed import codec
from triton_embed_server.steps.sparse_vectors import sparsify, sparsify_all

# Non-negative float32 weights with many exact zeros, as log1p(relu(.)) pooling gives them.
weights_strategy = hnp.arrays(
    np.float32,
    st.integers(1, 300),
    elements=st.one_of(st.just(0.0), st.floats(0, 20, width=32)),
)


@given(weights=weights_strategy, threshold=st.sampled_from([0.0, 0.5, 3.0]))
def test_every_weight_above_the_threshold_is_kept_in_index_order(weights, threshold):
    indices, values = sparsify(weights, threshold=threshold)
    want = np.flatnonzero(weights > threshold)
    np.testing.assert_array_equal(indices, want)
    np.testing.assert_array_equal(values, weights[want])
    assert indices.dtype == np.int32 and values.dtype == np.float32


@given(weights=weights_strategy, top_k=st.integers(1, 40))
def test_top_k_keeps_the_largest_weights_as_sentence_transformers_does(weights, top_k):
    import torch
    from sentence_transformers.util import select_max_active_dims

    indices, values = sparsify(weights, top_k=top_k)
    assert len(indices) == min(top_k, int((weights > 0).sum()))
    assert np.all(np.diff(indices) > 0)
    dense = np.zeros_like(weights)
    dense[indices] = values
    reference = select_max_active_dims(torch.tensor(weights[None]), top_k)[0].numpy()
    # The same multiset of kept weights (ties may pick other indices of an equal weight).
    np.testing.assert_array_equal(np.sort(dense), np.sort(reference))
    if len(np.unique(weights[weights > 0])) == int((weights > 0).sum()):  # no ties
        np.testing.assert_array_equal(dense, reference)


def test_ties_keep_the_lower_index_and_the_threshold_is_strict():
    weights = np.array([0.0, 2.0, 1.0, 2.0, 2.0, 0.5], dtype=np.float32)
    indices, values = sparsify(weights, top_k=2)
    assert indices.tolist() == [1, 3] and values.tolist() == [2.0, 2.0]
    indices, _ = sparsify(weights, threshold=1.0)
    assert indices.tolist() == [1, 3, 4]
    indices, _ = sparsify(weights, top_k=10, threshold=0.5)
    assert indices.tolist() == [1, 2, 3, 4]


def test_a_text_with_no_weight_left_is_an_empty_element():
    (indices,), (values,) = sparsify_all(np.zeros((1, 50), dtype=np.float32), 5, 0.0)
    assert indices.size == values.size == 0
    element = codec.encode_sparse([indices], [values])[0]
    assert element == b""


def test_a_batch_round_trips_through_the_codec():
    rng = np.random.default_rng(3)
    weights = np.maximum(rng.normal(-1.0, 1.0, size=(4, 1000)), 0).astype(np.float32)
    indices, values = sparsify_all(weights, top_k=30, threshold=0.1)
    for row, element, idx in zip(
        weights, codec.encode_sparse(indices, values), indices, strict=True
    ):
        got_idx, got_val = codec.decode_sparse(element)
        np.testing.assert_array_equal(got_idx, idx)
        np.testing.assert_array_equal(got_val, row[idx])
        assert len(element) == 8 * len(idx) <= 8 * 30


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": 0}, "top_k must be >= 1"),
        ({"threshold": -1.0}, "threshold must be >= 0"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sparsify(np.ones(3, dtype=np.float32), **kwargs)
    with pytest.raises(ValueError, match="one-dimensional"):
        sparsify(np.ones((2, 3), dtype=np.float32))
