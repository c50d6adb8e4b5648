"""Typed, validated configuration of a multi-vector model's engine step (the ``token_encoder``).

Parsed once, in ``initialize``, from the step's ``parameters`` (strings, as Triton passes
them); every error names the key, the value and what is allowed. The model's facts (layout,
dimension, normalization, lengths, marker tokens) are the parameters ``triton-embed
repository add`` writes into both steps; a config that leaves them empty is completed from
the model folder (:func:`~triton_embed_server.models.multivector_spec.read_multivector_spec`).
The tokenizer step is the embedding model's (:class:`~triton_embed_server.steps.config.
TokenizerConfig` with ``kind`` ``multivector``), which reads the same spec for the markers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_embed.serving_limits import TOKEN_MATRIX_BYTES

from triton_embed_server.models.multivector_spec import (
    SPEC_KEYS,
    Layout,
    MultiVectorSpec,
    read_multivector_spec,
)
from triton_embed_server.steps.engine_config import MIN_MAX_LENGTH, KindEngineConfig, Params


def multivector_spec(p: Params, path: Path) -> MultiVectorSpec:
    """The multi-vector model's spec: the parameters, the folder read when they are empty.

    Raises:
        ValueError: a bad parameter (names it), or a folder that is no multi-vector model
            triton-embed serves (names the file).
    """
    layout = p.str("multivector_layout", "")
    if not layout or not p.str("dim", "") or not p.str("model_max_length", ""):
        return read_multivector_spec(path, hidden=layout == Layout.HIDDEN.value)
    return MultiVectorSpec(
        layout=Layout(p.choice("multivector_layout", "", tuple(x.value for x in Layout))),
        architecture=p.str("architecture", ""),
        dim=p.int("dim", 0, minimum=1),
        normalize=p.bool("normalize", False),
        max_length=p.int("model_max_length", 0, minimum=MIN_MAX_LENGTH),
        query_length=p.int("query_length", 0, minimum=0),
        query_marker_id=_token(p, "query_marker_id"),
        document_marker_id=_token(p, "document_marker_id"),
        mask_id=_token(p, "mask_id"),
        attend_expansion=p.bool("attend_expansion", True),
        skiplist=p.token_ids("skiplist"),
    )


def _token(p: Params, key: str) -> int:
    """A token ID parameter: a whole number >= 0, or -1 (none; also when empty)."""
    raw = p.str(key, "-1")
    return -1 if raw == "-1" else p.int(key, -1, minimum=0)


__all__ = ["SPEC_KEYS", "TokenEncoderConfig", "multivector_spec"]


@dataclass(frozen=True)
class TokenEncoderConfig(KindEngineConfig):
    """Configuration of a multi-vector model's engine step: one vLLM engine per instance.

    Attributes:
        spec: the model's facts (layout, dimension, normalization, lengths, markers).
        max_request_tokens: token IDs one request may carry (parameter
            ``max_request_tokens``; ``0``/absent: ``min(64 x max_length, 65,536)``).
        max_response_bytes: the cap on one response's token matrices, ``4 x tokens x dim``
            over its texts (parameter ``max_response_bytes``; ``0``/absent:
            :data:`~triton_embed.serving_limits.TOKEN_MATRIX_BYTES`, 16 MiB); a request over
            it is refused before any engine work.

    The engine fields are :class:`~triton_embed_server.steps.engine_config.EngineConfig`'s.
    """

    spec: MultiVectorSpec | None = None
    max_response_bytes: int = TOKEN_MATRIX_BYTES

    @classmethod
    def read_spec(cls, p: Params, path: Path) -> MultiVectorSpec:
        """The multi-vector model's spec (:func:`multivector_spec`)."""
        return multivector_spec(p, path)

    @classmethod
    def more_fields(cls, p: Params, spec: Any, max_length: int) -> dict[str, Any]:
        """``max_response_bytes``, which must hold one full-length text's matrix.

        Raises:
            ValueError: a cap below ``4 x max_length x dim`` (names the parameter).
        """
        cap = p.int("max_response_bytes", 0, minimum=0) or TOKEN_MATRIX_BYTES
        least = 4 * max_length * spec.dim
        if cap < least:
            raise ValueError(
                f"parameter max_response_bytes={cap} is less than one text of max_length="
                f"{max_length} tokens of {spec.dim} float32 values ({least} bytes)"
            )
        if spec.query_length > max_length and spec.mask_id >= 0:
            raise ValueError(
                f"parameter max_length={max_length} is less than the model's query length "
                f"{spec.query_length} (queries are filled to it with [MASK])"
            )
        return {"max_response_bytes": cap}
