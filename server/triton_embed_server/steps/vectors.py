"""From pooled window vectors to the vectors a request asked for.

Everything after the engine, in numpy, on float32:

* :func:`pool_tokens`: pooling of per-token vectors with leading tokens left out, for models
  whose ``include_prompt`` is false (sentence-transformers' ``Pooling`` with its
  ``prompt_length`` mask: ``Pooling._exclude_prompt_from_mask``).
* :func:`text_vectors`: normalization as the model normalizes (its ``Normalize`` module: L2),
  and for a text cut into several windows (``truncation=CHUNK``) the weighted mean of its
  window vectors, normalized again. This is the method of OpenAI's cookbook "Embedding texts
  that are longer than the model's maximum context length" (chunk the tokens, embed each
  chunk, average weighted by chunk length, normalize to unit length). It differs from vLLM's
  chunked processing (``PoolerConfig.enable_chunked_processing``) in three ways: every
  window here carries the model's special tokens and the prompt (vLLM cuts the raw token
  sequence, so only the first chunk has the start token and only the last the end token a
  last-token model pools on); the mean is over the windows' final vectors for any pooling
  (vLLM averages mean-pooled hidden states and only supports mean pooling exactly); and the
  weights count only the text's tokens, not the repeated prompt and special tokens.
* :func:`cut_dimensions`: Matryoshka truncation, the first ``d`` values renormalized to L2
  norm 1 (what sentence-transformers' ``truncate_dim`` followed by normalization, vLLM's
  ``dimensions`` and OpenAI's ``dimensions`` return).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from triton_embed_server.models.spec import Pooling


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to L2 norm 1 (a zero row stays zero), as ``torch.nn.functional.normalize``.

    Args:
        vectors: float32 ``[n, d]``.
    """
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def pool_tokens(tokens: np.ndarray, pooling: Pooling, skip: int) -> np.ndarray:
    """One vector from per-token vectors, leaving the first ``skip`` tokens out.

    As sentence-transformers pools with an attention mask whose first ``skip`` positions
    are zero: ``mean`` averages the others, ``cls`` takes the first unmasked token,
    ``lasttoken`` the last token.

    Args:
        tokens: float32 ``[n_tokens, dim]``, the model's last hidden states.
        pooling: the model's pooling.
        skip: leading tokens left out (``0 <= skip < n_tokens``).

    Returns:
        float32 ``[dim]``.
    """
    if pooling is Pooling.MEAN:
        return tokens[skip:].mean(axis=0, dtype=np.float32)
    if pooling is Pooling.CLS:
        return tokens[skip]
    return tokens[-1]


def text_vectors(
    window_vectors: np.ndarray,
    windows: Sequence[Sequence[tuple[int, int, int]]],
    normalize: bool,
) -> np.ndarray:
    """Per text, its vector from its windows' pooled vectors.

    Args:
        window_vectors: float32 ``[total windows, dim]``, pooled and not normalized, in the
            order of ``windows`` flattened.
        windows: per text, its ``(tokens, skip, weight)`` windows.
        normalize: the model L2-normalizes its vectors.

    Returns:
        float32 ``[n texts, dim]``: a one-window text's vector is its window's (normalized
        when the model normalizes); a text of several windows gets the ``weight``-weighted
        mean of its window vectors (each normalized first when the model normalizes),
        normalized again when the model normalizes. All weights zero count equally.
    """
    vectors = l2_normalize(window_vectors) if normalize else window_vectors
    counts = [len(w) for w in windows]
    if all(c == 1 for c in counts):
        return vectors
    out = np.empty((len(windows), vectors.shape[1]), dtype=np.float32)
    start = 0
    for t, text_windows in enumerate(windows):
        k = len(text_windows)
        if k == 1:
            out[t] = vectors[start]
        else:
            weights = np.array([w for _, _, w in text_windows], dtype=np.float64)
            if weights.sum() <= 0:
                weights = np.ones(k)
            mean = np.average(
                vectors[start : start + k].astype(np.float64), axis=0, weights=weights
            )
            out[t] = l2_normalize(mean[None, :].astype(np.float32))[0] if normalize else mean
        start += k
    return out


def cut_dimensions(
    vectors: np.ndarray, dimensions: int | None, normalize: bool = True
) -> np.ndarray:
    """The first ``dimensions`` values of each row, L2-normalized again.

    Args:
        vectors: float32 ``[n, dim]``.
        dimensions: ``1..dim``; ``None`` or ``dim`` returns ``vectors`` unchanged.
        normalize: L2-normalize the cut rows (``False``: a request's ``normalize=false``,
            sentence-transformers' ``truncate_dim`` on a model without ``Normalize``).

    Returns:
        float32 ``[n, dimensions]``.
    """
    if dimensions is None or dimensions >= vectors.shape[1]:
        return vectors
    cut = np.ascontiguousarray(vectors[:, :dimensions])
    return l2_normalize(cut) if normalize else cut
