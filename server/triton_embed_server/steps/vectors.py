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

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from triton_embed.options import quote

#: Dimensions option meaning "any value from 1 to the full dimension".
ANY_DIMENSIONS = "any"


class Pooling(str, enum.Enum):
    """How token vectors become one vector, in sentence-transformers' names.

    ``mean``: the mean of the token vectors (BERT-family sentence encoders); ``cls``: the first
    token's vector (bge, arctic-embed); ``lasttoken``: the last token's vector, the end-of-text
    token the tokenizer appends (decoder embedders: Qwen3-Embedding, gte-Qwen2, e5-mistral).
    """

    MEAN = "mean"
    CLS = "cls"
    LASTTOKEN = "lasttoken"

    @property
    def vllm(self) -> str:
        """VLLM's ``PoolerConfig.seq_pooling_type`` for this pooling."""
        return {"mean": "MEAN", "cls": "CLS", "lasttoken": "LAST"}[self.value]

    @classmethod
    def parse(cls, value: str, what: str = "pooling") -> Pooling:
        """Parse ``mean`` / ``cls`` / ``lasttoken`` (also ``last``, case-insensitive).

        Raises:
            ValueError: another value (names ``what`` and the allowed values).
        """
        text = str(value).strip().lower()
        text = {"last": "lasttoken", "last_token": "lasttoken", "cls_token": "cls"}.get(text, text)
        try:
            return cls(text)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise ValueError(f"{what}={value!r} is not one of {allowed}") from None


@dataclass(frozen=True)
class Dimensions:
    """The dimensions a request may cut a model's vectors to (``dimensions``).

    Attributes:
        full: length of the full vector (float32 values); always allowed.
        matryoshka: the shorter dimensions the model was trained for (ascending, each in
            ``1..full - 1``); empty when it declares none.
        any_length: every dimension from 1 to ``full`` is allowed.
    """

    full: int
    matryoshka: tuple[int, ...] = ()
    any_length: bool = False

    @classmethod
    def of(cls, full: int, allowed: tuple[int, ...] | None, what: str) -> Dimensions:
        """The rule for a list of allowed dimensions (``None``: :data:`ANY_DIMENSIONS`).

        Raises:
            ValueError: a dimension outside ``1..full`` (names ``what``).
        """
        if allowed is None:
            return cls(full, (), True)
        for value in allowed:
            if not 1 <= value <= full:
                raise ValueError(f"{what}: {value} is outside 1..{full} (the full dimension)")
        return cls(full, tuple(sorted({d for d in allowed if d != full})))

    def allows(self, dimensions: int) -> bool:
        """Whether a request may cut vectors to ``dimensions`` values."""
        if self.any_length:
            return 1 <= dimensions <= self.full
        return dimensions == self.full or dimensions in self.matryoshka

    def check(self, dimensions: int) -> int:
        """``dimensions`` if a request may cut vectors to that many values.

        Raises:
            ValueError: it may not (names the value and the allowed dimensions).
        """
        if not self.allows(dimensions):
            raise ValueError(
                f"request parameter dimensions={quote(dimensions)} is not a dimension of this "
                f"model; allowed: {self.describe()}"
            )
        return dimensions

    def describe(self) -> str:
        """The allowed dimensions in words (for error messages)."""
        if self.any_length:
            return f"any value from 1 to {self.full}"
        return ", ".join(str(d) for d in (*self.matryoshka, self.full))

    def render(self) -> str:
        """The ``dimensions`` parameter: ``any``, or every allowed dimension (``64,128,384``)."""
        if self.any_length:
            return ANY_DIMENSIONS
        return ",".join(str(d) for d in (*self.matryoshka, self.full))


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
