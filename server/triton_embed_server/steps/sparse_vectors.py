"""Where a text's full-vocabulary SPLADE weights become its sparse vector: threshold, top-k.

Plain numpy, no Triton: the sparse engine step calls :func:`sparsify` on each text's weights
(float32 ``[vocab_size]``, every value >= 0: ``log1p(relu(...))`` pooled) and encodes the
result with :func:`triton_embed.codec.encode_sparse`.
"""

from __future__ import annotations

import numpy as np


def sparsify(
    weights: np.ndarray, top_k: int | None = None, threshold: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """The non-zero entries of one text's weights that a request keeps, by ascending index.

    Args:
        weights: float32 ``[vocab_size]``, the text's weight per vocabulary entry.
        top_k: keep at most this many entries, the largest weights (ties: the lower index
            first); ``None``: all of them.
        threshold: keep only weights strictly above it (``0``: every non-zero weight).

    Returns:
        ``(indices, values)``: int32 ``[k]`` ascending, and float32 ``[k]`` their weights,
        ``k <= min(top_k, vocab_size)``.

    Raises:
        ValueError: ``weights`` is not one-dimensional, ``top_k`` is below 1 or
            ``threshold`` below 0.
    """
    weights = np.asarray(weights, dtype=np.float32)
    if weights.ndim != 1:
        raise ValueError(f"weights must be one-dimensional, got shape {weights.shape}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    indices = np.flatnonzero(weights > threshold)
    return keep(indices, weights[indices], top_k)


def keep(
    indices: np.ndarray, values: np.ndarray, top_k: int | None = None, threshold: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """The entries of a sparse vector that a request keeps: above ``threshold``, ``top_k``.

    The one rule of both sparse kinds (:func:`sparsify` for SPLADE's full-vocabulary
    weights; the hybrid kind's weights per token ID, already sparse).

    Args:
        indices: int ``[m]`` ascending vocabulary indices.
        values: float32 ``[m]`` their weights.
        top_k: keep at most this many, the largest weights (ties: the lower index first);
            ``None``: all of them.
        threshold: keep only weights strictly above it.

    Returns:
        ``(indices, values)``: int32 ``[k]`` ascending and float32 ``[k]``.
    """
    values = np.asarray(values, dtype=np.float32)
    above = values > threshold
    indices, values = np.asarray(indices)[above], values[above]
    if top_k is not None and indices.size > top_k:
        # A stable sort of the negated weights: the largest first, ties by lower index.
        order = np.sort(np.argsort(-values, kind="stable")[:top_k])
        indices, values = indices[order], values[order]
    return indices.astype(np.int32), values


def sparsify_all(
    weights: np.ndarray, top_k: int | None = None, threshold: float = 0.0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """:func:`sparsify` of each row of float32 ``[n, vocab_size]``; ``(indices, values)`` lists."""
    pairs = [sparsify(row, top_k, threshold) for row in np.asarray(weights)]
    return [i for i, _ in pairs], [v for _, v in pairs]
