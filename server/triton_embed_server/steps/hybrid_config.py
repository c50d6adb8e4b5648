"""Typed, validated configuration of a hybrid (BGE-M3) model's engine step (``hybrid_encoder``).

Parsed once, in ``initialize``, from the step's ``parameters`` (strings, as Triton passes
them); every error names the key, the value and what is allowed. The model's facts (encoder,
dimensions, vocabulary, token budget, the token IDs the sparse output skips) are the
parameters ``triton-embed repository add`` writes; a config that leaves them empty is
completed from the model folder (:func:`~triton_embed_server.models.hybrid_spec.
read_hybrid_spec`). The tokenizer step is the embedding model's
(:class:`~triton_embed_server.steps.config.TokenizerConfig` with ``kind`` ``hybrid``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_embed.serving_limits import TOKEN_MATRIX_BYTES

from triton_embed_server.models.hybrid_spec import SPEC_KEYS, HybridSpec, read_hybrid_spec
from triton_embed_server.steps.engine_config import MIN_MAX_LENGTH, KindEngineConfig, Params


def hybrid_spec(p: Params, path: Path) -> HybridSpec:
    """The hybrid model's spec: the parameters, the folder read when they are empty.

    Raises:
        ValueError: a bad parameter (names it), or a folder that is no hybrid model
            triton-embed serves (names the file).
    """
    if not all(p.str(k, "") for k in SPEC_KEYS if k != "skipped_token_ids"):
        return read_hybrid_spec(path)
    return HybridSpec(
        architecture=p.str("architecture", ""),
        dim=p.int("dim", 0, minimum=1),
        colbert_dim=p.int("colbert_dim", 0, minimum=1),
        vocab_size=p.int("vocab_size", 0, minimum=1),
        max_length=p.int("model_max_length", 0, minimum=MIN_MAX_LENGTH),
        skipped_token_ids=p.token_ids("skipped_token_ids"),
    )


@dataclass(frozen=True)
class HybridEncoderConfig(KindEngineConfig):
    """Configuration of a hybrid model's engine step: one vLLM engine per instance.

    Attributes:
        spec: the model's facts (:class:`~triton_embed_server.models.hybrid_spec.HybridSpec`).
        max_request_tokens: token IDs one request may carry (parameter
            ``max_request_tokens``; ``0``/absent: ``min(64 x max_length, 65,536)``).
        max_response_bytes: the cap on one response's ColBERT matrices, ``4 x (tokens - 1)
            x colbert_dim`` over its texts (parameter ``max_response_bytes``; ``0``/absent:
            :data:`~triton_embed.serving_limits.TOKEN_MATRIX_BYTES`, 16 MiB); a request
            asking for ``colbert`` over it is refused before any engine work.

    The engine fields are :class:`~triton_embed_server.steps.engine_config.EngineConfig`'s.
    """

    spec: HybridSpec | None = None
    max_response_bytes: int = TOKEN_MATRIX_BYTES

    @classmethod
    def read_spec(cls, p: Params, path: Path) -> HybridSpec:
        """The hybrid model's spec (:func:`hybrid_spec`)."""
        return hybrid_spec(p, path)

    @classmethod
    def more_fields(cls, p: Params, spec: Any, max_length: int) -> dict[str, Any]:
        """``max_response_bytes``, which must hold one full-length text's ColBERT matrix.

        Raises:
            ValueError: a cap below ``4 x (max_length - 1) x colbert_dim`` (names it).
        """
        cap = p.int("max_response_bytes", 0, minimum=0) or TOKEN_MATRIX_BYTES
        least = 4 * (max_length - 1) * spec.colbert_dim
        if cap < least:
            raise ValueError(
                f"parameter max_response_bytes={cap} is less than one text of max_length="
                f"{max_length} tokens' ColBERT vectors ({max_length - 1} rows of "
                f"{spec.colbert_dim} float32 values, {least} bytes)"
            )
        return {"max_response_bytes": cap}
