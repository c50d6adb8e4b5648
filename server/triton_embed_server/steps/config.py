"""Typed, validated configuration of the ``tokenizer`` and ``embedder`` models.

Triton passes a model's ``parameters`` as strings inside the model config JSON
(``{"parameters": {"key": {"string_value": "..."}}}``). They are parsed once, in
``initialize``, by ``TokenizerConfig.from_model_config`` / ``EmbedderConfig.from_model_config``;
every error names the key, the value and what is allowed. What every step shares (the
typed getters, ``from_args``) and the engine settings of the embedder (precision, limits,
KV cache, placement, price) live in :mod:`triton_embed_server.steps.engine_config`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_embed.hybrid_options import parse_hybrid_truncation
from triton_embed.multivector_options import parse_multivector_truncation
from triton_embed.options import DEFAULT_ALLOW_EMPTY, DEFAULT_TRUNCATION, Truncation
from triton_embed.serving_limits import REQUEST_TEXTS, request_token_budget
from triton_embed.sparse_options import parse_sparse_truncation

from triton_embed_server.host.cpu_features import cpu_flags, engine_dtype
from triton_embed_server.models.instance_group import instance_kind, read_config_pbtxt
from triton_embed_server.models.model_spec import (
    embedding_dimension,
    model_max_length,
    read_model_spec,
)
from triton_embed_server.models.multivector_spec import MultiVectorSpec
from triton_embed_server.models.spec import ModelSpec, SpecParameters
from triton_embed_server.steps.engine_config import (
    CHARS_PER_TOKEN_CAP,
    DEFAULT_MAX_CHUNKS,
    DEFAULT_MODEL_PATH,
    MIN_MAX_LENGTH,
    EngineConfig,
    StepConfig,
    config_defaults,
    model_parameters,
    request_tokens,
    within_model_limit,
)

#: The model kinds a tokenizer step tokenizes for: which request options it reads.
TOKENIZER_KINDS = ("embedding", "sparse", "multivector", "hybrid")
#: How each kind parses the ``truncation`` parameter (``CHUNK`` is an embedding model's).
_TRUNCATIONS = {
    "embedding": Truncation.parse,
    "sparse": parse_sparse_truncation,
    "multivector": parse_multivector_truncation,
    "hybrid": parse_hybrid_truncation,
}

__all__ = [
    "CHARS_PER_TOKEN_CAP",
    "DEFAULT_MAX_CHUNKS",
    "DEFAULT_MODEL_PATH",
    "MIN_MAX_LENGTH",
    "TOKENIZER_KINDS",
    "EmbedderConfig",
    "TokenizerConfig",
    "model_parameters",
    "served_dtype",
]


@dataclass(frozen=True)
class TokenizerConfig(StepConfig):
    """Configuration of the ``tokenizer`` step.

    Attributes:
        model_path: local model folder holding ``tokenizer.json``.
        max_length: token budget per text, special tokens included (parameter
            ``max_length``; ``0``/absent means the model's own limit, see
            :func:`~triton_embed_server.models.model_files.model_max_length`).
        truncation: server default for over-long texts (parameter ``truncation``:
            ``NONE``, ``END`` or ``START``; default
            :data:`triton_embed.options.DEFAULT_TRUNCATION`, ``END``).
        max_chars: characters of a text kept before tokenization (parameter ``max_chars``;
            default ``64 * max_length``), bounding the cost of huge inputs.
        allow_empty: accept empty texts by default (parameter ``allow_empty``; default
            :data:`triton_embed.options.DEFAULT_ALLOW_EMPTY`, false).
        max_chunks: the most windows one text is cut into with ``truncation=CHUNK``
            (parameter ``max_chunks``, default 16); with ``CHUNK`` the character cap is
            ``max_chars * max_chunks``.
        max_request_tokens: the token budget of one request, all its texts and windows
            together (parameter ``max_request_tokens``; ``0``/absent:
            :func:`request_token_budget` of the model's ``max_batch_size``); a request over
            it is refused before any engine work.
        kind: the model kind the step tokenizes for (parameter ``kind``, :data:`TOKENIZER_KINDS`):
            ``embedding`` (the default; the request options of :mod:`triton_embed.options`) or
            ``sparse`` (those of :mod:`triton_embed.sparse_options`, ``CHUNK`` refused) or
            ``multivector`` (:mod:`triton_embed.multivector_options`: ``input_type`` is
            ``query`` or ``document``, which pick the markers of :attr:`multivector`) or
            ``hybrid`` (:mod:`triton_embed.hybrid_options`, ``CHUNK`` refused).
        multivector: a multi-vector model's spec (its markers, query length and
            augmentation), read from the same parameters as its engine step; ``None`` for
            the other kinds.
    """

    model_path: Path
    max_length: int
    truncation: Truncation = DEFAULT_TRUNCATION
    max_chars: int = 0
    allow_empty: bool = DEFAULT_ALLOW_EMPTY
    max_chunks: int = DEFAULT_MAX_CHUNKS
    max_request_tokens: int = 0
    kind: str = "embedding"
    multivector: MultiVectorSpec | None = None

    @classmethod
    def _parse(
        cls, model_config: dict[str, Any], repository_dir: Any, parts: Any
    ) -> TokenizerConfig:
        """The ``tokenizer`` model's config, from what the preamble read first."""
        from triton_embed_server.steps.multivector_config import multivector_spec

        p, path, max_length, max_chunks = parts
        kind = p.choice("kind", "embedding", TOKENIZER_KINDS)
        spec = multivector_spec(p, path) if kind == "multivector" else None
        if spec is not None:
            max_length = within_model_limit(max_length, spec.max_length)
        max_length = max_length or model_max_length(path)
        if max_length < MIN_MAX_LENGTH:
            raise ValueError(f"parameter max_length={max_length} must be >= {MIN_MAX_LENGTH}")
        texts = int(model_config.get("max_batch_size") or 0) or REQUEST_TEXTS
        truncation = p.str("truncation", DEFAULT_TRUNCATION.value)
        return cls(
            model_path=path,
            max_length=max_length,
            truncation=_TRUNCATIONS[kind](truncation, "parameter truncation"),
            max_chars=p.int("max_chars", 0, minimum=0) or CHARS_PER_TOKEN_CAP * max_length,
            allow_empty=p.bool("allow_empty", DEFAULT_ALLOW_EMPTY),
            max_chunks=max_chunks,
            max_request_tokens=request_tokens(
                p, request_token_budget(texts, max_length, max_chunks)
            ),
            kind=kind,
            multivector=spec,
        )


@dataclass(frozen=True)
class EmbedderConfig(EngineConfig):
    """Configuration of the ``embedder`` step (one vLLM engine per model instance).

    The engine's fields (``model_path``, ``max_length``, ``dtype``, limits, KV cache,
    placement, price) are :class:`~triton_embed_server.steps.engine_config.EngineConfig`'s.

    Attributes:
        spec_parameters: the model's embedding spec as the config states it (pooling,
            normalize, dimension, dimensions, include_prompt, model_max_length: the
            parameters ``repository add`` writes), parsed; :attr:`spec` completes it.
        max_chunks: the most windows of one text (parameter ``max_chunks``, default 16;
            keep it equal to the tokenizer's): token IDs sent to this step directly are held
            to what the tokenizer step would emit.
        max_request_tokens: the token budget of one request (parameter
            ``max_request_tokens``; ``0``/absent: :func:`request_token_budget` of
            :data:`REQUEST_TEXTS` texts).
    """

    spec_parameters: SpecParameters = SpecParameters()
    max_chunks: int = DEFAULT_MAX_CHUNKS
    max_request_tokens: int = 0

    @functools.cached_property
    def spec(self) -> ModelSpec:
        """The model's embedding spec: the config's, the folder read only for what it leaves empty.

        A config that ``repository add`` wrote states the whole spec: the folder is not read.
        Computed once per config.

        Raises:
            ValueError: a folder that does not state what serving needs (names the file).
        """
        given = self.spec_parameters
        if given.complete:
            return given.spec(self.model_path)
        return read_model_spec(self.model_path, given)

    @property
    def dimension(self) -> int:
        """The full vector length: the ``dimension`` parameter, else the folder's.

        Raises:
            ValueError: the folder does not tell it (names the file).
        """
        return self.spec_parameters.dimension or embedding_dimension(self.model_path)

    @classmethod
    def _parse(
        cls, model_config: dict[str, Any], repository_dir: Any, parts: Any
    ) -> EmbedderConfig:
        """The ``embedder`` model's config, from what the preamble read first."""
        p, path, max_length, max_chunks = parts
        given = SpecParameters.parse(p.raw, "parameter ")
        max_length = max_length or given.model_max_length or model_max_length(path)
        budget = request_token_budget(REQUEST_TEXTS, max_length, max_chunks)
        return cls(
            **cls.engine_fields(p, model_config, path, max_length, repository_dir),
            spec_parameters=given,
            max_chunks=max_chunks,
            max_request_tokens=request_tokens(p, budget),
        )


def served_dtype(embedder_dir: str | Path) -> str:
    """The dtype the engine of an embedder folder runs on this host.

    Args:
        embedder_dir: a repository's embedder folder (the one holding ``config.pbtxt``).

    Returns:
        its ``dtype`` parameter (:class:`EmbedderConfig`'s default where absent); on a
        ``KIND_CPU`` instance group, float32 where the CPUs lack bfloat16 instructions, as
        the embedder decides at start (:func:`~triton_embed_server.host.cpu_features.engine_dtype`).
    """
    model_config = read_config_pbtxt(Path(embedder_dir) / "config.pbtxt")
    dtype = model_parameters(model_config).get("dtype", config_defaults(EmbedderConfig)["dtype"])
    if instance_kind(model_config) == "KIND_CPU":
        dtype = engine_dtype(dtype, cpu_flags())[0]
    return dtype
