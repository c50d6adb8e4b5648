"""Post-engine vector arithmetic: pooling with a skip, window means, Matryoshka cuts."""

from __future__ import annotations

import numpy as np
import pytest
from triton_embed_server.steps.vectors import (
    Pooling,
    cut_dimensions,
    l2_normalize,
    pool_tokens,
    text_vectors,
)

RNG = np.random.default_rng(0)


def test_pool_tokens_follows_sentence_transformers_masking():
    tokens = RNG.standard_normal((6, 4)).astype(np.float32)
    np.testing.assert_allclose(pool_tokens(tokens, Pooling.MEAN, 0), tokens.mean(0), rtol=1e-6)
    np.testing.assert_allclose(pool_tokens(tokens, Pooling.MEAN, 2), tokens[2:].mean(0), rtol=1e-6)
    assert np.array_equal(pool_tokens(tokens, Pooling.CLS, 0), tokens[0])
    assert np.array_equal(pool_tokens(tokens, Pooling.CLS, 3), tokens[3])  # first unmasked
    assert np.array_equal(pool_tokens(tokens, Pooling.LASTTOKEN, 2), tokens[-1])


def test_one_window_texts_are_normalized_when_the_model_normalizes():
    raw = RNG.standard_normal((3, 8)).astype(np.float32)
    windows = [[(5, 0, 5)]] * 3
    got = text_vectors(raw, windows, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(got, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-6)
    assert np.array_equal(text_vectors(raw, windows, normalize=False), raw)


def test_a_chunked_text_is_the_weighted_mean_of_its_normalized_windows():
    raw = RNG.standard_normal((4, 8)).astype(np.float32)
    windows = [[(5, 0, 3)], [(10, 0, 8), (10, 0, 8), (4, 0, 2)]]
    got = text_vectors(raw, windows, normalize=True)
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    mean = (8 * unit[1] + 8 * unit[2] + 2 * unit[3]) / 18
    np.testing.assert_allclose(got[0], unit[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], mean / np.linalg.norm(mean), rtol=1e-5)
    plain = text_vectors(raw, windows, normalize=False)
    np.testing.assert_allclose(plain[1], (8 * raw[1] + 8 * raw[2] + 2 * raw[3]) / 18, rtol=1e-5)


def test_zero_weights_count_equally():
    raw = RNG.standard_normal((2, 4)).astype(np.float32)
    got = text_vectors(raw, [[(3, 0, 0), (3, 0, 0)]], normalize=False)
    np.testing.assert_allclose(got[0], raw.mean(0), rtol=1e-6)


@pytest.mark.parametrize("d", [1, 3, 7])
def test_cut_dimensions_is_cut_then_renormalize(d):
    v = l2_normalize(RNG.standard_normal((5, 8)).astype(np.float32))
    got = cut_dimensions(v, d)
    want = v[:, :d] / np.linalg.norm(v[:, :d], axis=1, keepdims=True)
    assert got.shape == (5, d) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert cut_dimensions(v, None) is v and cut_dimensions(v, 8) is v


def test_normalize_false_keeps_the_pooled_vectors_and_cuts_without_renormalizing():
    pooled = np.array([[3.0, 4.0, 12.0], [1.0, 0.0, 0.0]], np.float32)
    raw = text_vectors(pooled, [[(5, 0, 3)], [(4, 0, 2)]], normalize=False)
    assert np.array_equal(raw, pooled)  # TEI's normalize=false: the pooled vectors as they are
    assert np.array_equal(cut_dimensions(raw, 2, normalize=False), pooled[:, :2])
    cut = cut_dimensions(text_vectors(pooled, [[(5, 0, 3)], [(4, 0, 2)]], True), 2)
    np.testing.assert_allclose(cut[0], [0.6, 0.8], rtol=1e-6)  # default: cut + renormalize
