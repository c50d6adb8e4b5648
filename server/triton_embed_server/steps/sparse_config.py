"""Typed, validated configuration of a sparse model's engine step (the ``sparse_encoder``).

Parsed once, in ``initialize``, from the step's ``parameters`` (strings, as Triton passes
them); every error names the key, the value and what is allowed. The model's facts
(architecture, pooling, vocabulary, token budget) are the parameters
``triton-embed repository add`` writes; a config that leaves them empty is completed from
the model folder (:func:`~triton_embed_server.models.sparse_spec.read_sparse_spec`). The
tokenizer step is the embedding model's (:class:`~triton_embed_server.steps.config.
TokenizerConfig` with ``kind`` ``sparse``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from triton_embed_server.models.sparse_spec import (
    POOLINGS,
    SPEC_KEYS,
    SparseSpec,
    read_sparse_spec,
)
from triton_embed_server.steps.engine_config import MIN_MAX_LENGTH, KindEngineConfig, Params


def sparse_spec(p: Params, path: Path) -> SparseSpec:
    """The sparse model's spec: the parameters, the folder read for what they leave empty.

    Raises:
        ValueError: a bad parameter (names it), or a folder that is no sparse model
            triton-embed serves (names the file).
    """
    stated = [p.str(k, "") for k in SPEC_KEYS]
    if not all(stated):
        return read_sparse_spec(path)
    return SparseSpec(
        architecture=stated[0],
        pooling=p.choice("splade_pooling", "max", POOLINGS),
        vocab_size=p.int("vocab_size", 0, minimum=1),
        max_length=p.int("model_max_length", 0, minimum=MIN_MAX_LENGTH),
    )


@dataclass(frozen=True)
class SparseEncoderConfig(KindEngineConfig):
    """Configuration of a sparse model's engine step: one vLLM engine per instance.

    Attributes:
        spec: the model's facts (architecture, pooling, vocabulary, token budget).
        max_request_tokens: token IDs one request may carry (parameter
            ``max_request_tokens``; ``0``/absent: ``min(64 x max_length, 65,536)``, as the
            tokenizer step's budget for one window per text).

    The engine fields are :class:`~triton_embed_server.steps.engine_config.EngineConfig`'s.
    """

    spec: SparseSpec | None = None

    @classmethod
    def read_spec(cls, p: Params, path: Path) -> SparseSpec:
        """The sparse model's spec (:func:`sparse_spec`)."""
        return sparse_spec(p, path)
