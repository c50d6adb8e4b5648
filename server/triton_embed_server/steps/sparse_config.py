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
from typing import Any

from triton_embed.serving_limits import REQUEST_TEXTS, request_token_budget

from triton_embed_server.models.sparse_spec import (
    POOLINGS,
    SPEC_KEYS,
    SparseSpec,
    read_sparse_spec,
)
from triton_embed_server.steps.engine_config import (
    MIN_MAX_LENGTH,
    EngineConfig,
    Params,
    request_tokens,
)


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
class SparseEncoderConfig(EngineConfig):
    """Configuration of a sparse model's engine step: one vLLM engine per instance.

    Attributes:
        spec: the model's facts (architecture, pooling, vocabulary, token budget).
        max_request_tokens: token IDs one request may carry (parameter
            ``max_request_tokens``; ``0``/absent: ``min(64 x max_length, 65,536)``, as the
            tokenizer step's budget for one window per text).

    The engine fields are :class:`~triton_embed_server.steps.engine_config.EngineConfig`'s.
    """

    spec: SparseSpec | None = None
    max_request_tokens: int = 0

    @classmethod
    def _parse(cls, model_config: dict[str, Any], repository_dir: Any, parts: Any):
        p, path, max_length, _ = parts
        spec = sparse_spec(p, path)
        max_length = max_length or spec.max_length
        if not MIN_MAX_LENGTH <= max_length <= spec.max_length:
            raise ValueError(
                f"parameter max_length={max_length} must be in [{MIN_MAX_LENGTH}, "
                f"{spec.max_length}] (the model's own limit); 0 = the model's own"
            )
        budget = request_tokens(p, request_token_budget(REQUEST_TEXTS, max_length, 1))
        engine = cls.engine_fields(p, model_config, path, max_length, repository_dir)
        return cls(**engine, spec=spec, max_request_tokens=budget)
