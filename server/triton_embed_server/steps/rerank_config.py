"""Typed, validated configuration of a reranker's steps: the pair tokenizer and the scorer.

Parsed once, in ``initialize``, from the step's ``parameters`` (strings, as Triton passes
them); every error names the key, the value and what is allowed. The reranker's facts
(family, activation, segments, token budget) are the parameters ``triton-embed repository
add`` writes; a config that leaves them empty is completed from the model folder
(:func:`~triton_embed_server.models.reranker_spec.read_reranker_spec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_embed.serving_limits import PAIR_CHARS_PER_TOKEN, REQUEST_TEXTS, request_token_budget

from triton_embed_server.models.reranker_spec import (
    SPEC_KEYS,
    Activation,
    Family,
    RerankerSpec,
    decoder_hf_overrides,
    read_reranker_spec,
)
from triton_embed_server.steps.engine_config import (
    MIN_MAX_LENGTH,
    KindEngineConfig,
    Params,
    StepConfig,
    request_tokens,
    within_model_limit,
)


def reranker_spec(p: Params, path: Path) -> RerankerSpec:
    """The reranker's spec: the parameters, the folder read for what they leave empty.

    Raises:
        ValueError: a bad parameter (names it), or a folder that is no reranker of the
            stated family (names the file).
    """
    family = Family(p.choice("family", Family.CROSS_ENCODER.value, tuple(f.value for f in Family)))
    stated = [p.str(k, "") for k in SPEC_KEYS[1:]]
    if all(stated):
        activation = p.choice("activation", "", tuple(a.value for a in Activation))
        return RerankerSpec(
            family=family,
            architecture=stated[0],
            activation=Activation(activation),
            segments=p.bool("segments", False),
            max_length=p.int("model_max_length", 0, minimum=MIN_MAX_LENGTH),
        )
    return read_reranker_spec(path, decoder=family is Family.DECODER)


@dataclass(frozen=True)
class PairTokenizerConfig(StepConfig):
    """Configuration of a reranker's pair tokenizer step.

    Attributes:
        model_path: local model folder holding ``tokenizer.json``.
        max_length: token budget per pair, special tokens or template included (parameter
            ``max_length``; ``0``/absent: the model's own, :attr:`RerankerSpec.max_length`).
        spec: the reranker's facts (family, segments, template).
        max_chars: characters of a query or a document kept before tokenization (parameter
            ``max_chars``; default :data:`PAIR_CHARS_PER_TOKEN` ``* max_length``), bounding
            the cost of huge inputs.
        max_request_tokens: the token budget of one request, all its pairs together
            (parameter ``max_request_tokens``; ``0``/absent:
            ``min(max_batch_size x max_length, 65,536)``).
    """

    model_path: Path
    max_length: int
    spec: RerankerSpec
    max_chars: int = 0
    max_request_tokens: int = 0

    @classmethod
    def _parse(cls, model_config: dict[str, Any], repository_dir: Any, parts: Any):
        p, path, max_length, _ = parts
        pairs = int(model_config.get("max_batch_size") or 0) or REQUEST_TEXTS
        spec, max_length, budget = _spec_and_budgets(p, path, max_length, pairs)
        return cls(
            model_path=path,
            max_length=max_length,
            spec=spec,
            max_chars=p.int("max_chars", 0, minimum=0) or PAIR_CHARS_PER_TOKEN * max_length,
            max_request_tokens=budget,
        )


def _spec_and_budgets(
    p: Params, path: Path, given: int, pairs: int
) -> tuple[RerankerSpec, int, int]:
    """Both steps' ``(spec, max_length, max_request_tokens)``, parsed and checked.

    ``max_length``: ``given`` (0: the model's own); ``max_request_tokens``: the parameter,
    else ``min(pairs x max_length, 65,536)``.

    Raises:
        ValueError: a bad parameter, a folder that is no reranker, or a ``max_length``
            below :data:`MIN_MAX_LENGTH` or above the model's own.
    """
    spec = reranker_spec(p, path)
    max_length = within_model_limit(given, spec.max_length)
    return spec, max_length, request_tokens(p, request_token_budget(pairs, max_length, 1))


@dataclass(frozen=True)
class ScorerConfig(KindEngineConfig):
    """Configuration of a reranker's scorer step: one vLLM engine per instance.

    Attributes:
        spec: the reranker's facts (family, activation, architecture).
        max_request_tokens: token IDs one request may carry (parameter
            ``max_request_tokens``; ``0``/absent: ``min(64 x max_length, 65,536)``).
    The engine fields are :class:`~triton_embed_server.steps.config.EngineConfig`'s.
    """

    spec: RerankerSpec | None = None

    @classmethod
    def read_spec(cls, p: Params, path: Path) -> RerankerSpec:
        """The reranker's spec (:func:`reranker_spec`)."""
        return reranker_spec(p, path)

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM``: the engine's, plus a decoder's overrides."""
        kwargs = super().llm_kwargs()
        if self.spec is not None and self.spec.family is Family.DECODER:
            kwargs.setdefault("hf_overrides", decoder_hf_overrides(self.spec.architecture))
        return kwargs
