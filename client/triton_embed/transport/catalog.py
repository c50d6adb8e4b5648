"""The models the upstreams serve, read from their Triton model configs (:class:`ModelKind`).

An **embedding ensemble** is a READY model whose config is ``platform: "ensemble"`` with the
outputs ``EMBEDDING`` and ``NUM_TOKENS`` and at least two steps: the first step is its
tokenizer (``TEXT`` -> ``TOKEN_IDS``), the last its embedder (``TOKEN_IDS`` -> ``EMBEDDING``,
which the gateway calls directly for token-ID input). What the catalog keeps of each
(:class:`ModelInfo`):

* from the ensemble's config: ``max_batch_size`` and the ``parameters`` that
  ``triton-embed repository add`` writes (``served_model_name``: another name clients may use
  as ``model``, e.g. ``sentence-transformers/all-MiniLM-L6-v2`` for the shipped ``embed``;
  ``dimension``; ``max_length``, the token budget per text);
* from its steps' configs: their ``max_batch_size``; the embedder's ``pooling``,
  ``normalize``, ``dtype`` and ``max_num_batched_tokens`` parameters.

Pooling and normalization left empty in the embedder's config ("what the model folder
states") are asked of the pool's facts reader (``facts_reader``): :func:`config_facts` by
default; the HTTP gateway's reads the folder too (``..gateway.folder_facts``).

A **reranker ensemble** (docs/rerank.md) is a READY model whose config is
``platform: "ensemble"`` with the inputs ``QUERY`` and ``DOCUMENT``, the outputs ``SCORE``
and ``NUM_TOKENS``, and at least two steps (its pair tokenizer ``NAME_tokenizer``, its scorer
``NAME_scorer``); a ``kind`` parameter, when the config states one, must be ``reranker``.
What the catalog keeps of each is :class:`RerankerInfo`: ``max_batch_size`` (pairs per
request), ``served_model_name``, ``max_length`` (the token budget per pair), ``family``
(``cross_encoder`` or ``decoder``) and the pair tokenizer's token budget per request.

A **sparse ensemble** (docs/sparse.md) answers ``SPARSE`` instead of ``EMBEDDING`` (per
text, its non-zero vocabulary indices and weights): a :class:`SparseInfo`. A **multi-vector
ensemble** answers ``TOKEN_EMBEDDINGS`` (one vector per token): a :class:`MultiVectorInfo`,
with its query length and response cap. A **hybrid ensemble** (BGE-M3) answers all three:
a :class:`~triton_embed.transport.hybrid_info.HybridInfo`.

Clients name a model by its ensemble name or ``served_model_name`` (:meth:`Catalog.resolve`;
an ensemble name wins over an alias); a model of another kind is told so (``kind``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from triton_embed.options import Truncation
from triton_embed.serving_limits import PAIR_CHARS_PER_TOKEN, TOKEN_MATRIX_BYTES
from triton_embed.serving_limits import texts_within_cap as fit_token_matrices
from triton_embed.transport.config_values import (
    allow_empty,
    batch_size_of,
    int_parameter,
    parameter,
    request_tokens,
)

EMBEDDING_OUTPUTS = frozenset({"EMBEDDING", "NUM_TOKENS"})
SPARSE_OUTPUTS = frozenset({"SPARSE", "NUM_TOKENS"})
MULTIVECTOR_OUTPUTS = frozenset({"TOKEN_EMBEDDINGS", "NUM_TOKENS"})
RERANKER_INPUTS = frozenset({"QUERY", "DOCUMENT"})
RERANKER_OUTPUTS = frozenset({"SCORE", "NUM_TOKENS"})


class ModelKind(str, enum.Enum):
    """What a served ensemble does: embed texts (dense, sparse, per token), or score pairs."""

    EMBEDDING = "embedding"
    RERANKER = "reranker"
    SPARSE = "sparse"
    MULTIVECTOR = "multivector"
    HYBRID = "hybrid"


@dataclass(frozen=True)
class FolderFacts:
    """What a model folder states about its vectors (``None``: not known)."""

    pooling: str | None = None
    normalize: bool | None = None


def config_facts(embedder_config: Mapping[str, Any]) -> FolderFacts:
    """Pooling and normalization of an embedder step, as its config states them.

    The ``pooling`` / ``normalize`` parameters (``true``/``1``/``false``/``0``); an empty
    or unknown one stays ``None``. Never raises.
    """
    pooling = parameter(embedder_config, "pooling").lower() or None
    normalize_text = parameter(embedder_config, "normalize").lower()
    normalize = {"true": True, "1": True, "false": False, "0": False}.get(normalize_text)
    return FolderFacts(pooling, normalize)


@dataclass(frozen=True)
class ModelInfo:
    """One embedding ensemble as the gateway serves it (:attr:`kind` ``embedding``).

    Attributes:
        name: the ensemble's name (what the gateway sends to Triton).
        max_batch_size: texts per request to the ensemble.
        tokenizer: its first step's model name (``TEXT`` -> ``TOKEN_IDS``).
        tokenizer_max_batch_size: texts per request to the tokenizer step.
        embedder: its last step's model name (``TOKEN_IDS`` -> ``EMBEDDING``).
        embedder_max_batch_size: token-ID lists per request to the embedder step.
        served_model_name: the other name clients may use, or ``None``.
        dimension: floats per vector, or ``None`` when the config does not say.
        max_length: the token budget per text, or ``None``.
        pooling: ``mean``, ``cls``, ``lasttoken``, or ``None`` when unknown.
        normalize: whether its vectors are L2-normalized, or ``None`` when unknown.
        dtype: the embedder's ``dtype`` parameter (``float32`` when not stated).
        max_batch_tokens: the embedder's ``max_num_batched_tokens``, or ``None``.
        allow_empty: the tokenizer step embeds empty texts by default (its ``allow_empty``
            parameter; the gateway refuses them otherwise, naming its own field).
        max_chunks: the tokenizer step's ``max_chunks`` (windows per text with
            ``truncation=CHUNK``).
        max_request_tokens: the tokenizer step's token budget per request (its
            ``max_request_tokens`` parameter, or the default of
            :func:`triton_embed.serving_limits.request_token_budget`), or ``None`` when the
            config does not give ``max_length``.
    """

    name: str
    max_batch_size: int
    tokenizer: str
    embedder: str
    tokenizer_max_batch_size: int
    embedder_max_batch_size: int
    served_model_name: str | None = None
    dimension: int | None = None
    max_length: int | None = None
    pooling: str | None = None
    normalize: bool | None = None
    dtype: str = "float32"
    max_batch_tokens: int | None = None
    allow_empty: bool = False
    max_chunks: int = 16
    max_request_tokens: int | None = None

    kind: ClassVar[ModelKind] = ModelKind.EMBEDDING
    #: The ensemble's output holding each text's vector.
    output: ClassVar[str] = "EMBEDDING"

    def piece_size(self, truncation: Truncation | str | None) -> int:
        """Texts per upstream call, so that no call can pass the step's token budget.

        ``max(1, min(max_batch_size, max_request_tokens // per_text))`` where ``per_text`` is
        ``max_length``, times ``max_chunks`` with ``truncation=CHUNK``: for the shipped model
        64 texts, and 16 with ``CHUNK`` (65,536 // (256 x 16)).

        Args:
            truncation: the request's ``truncation`` option (its value, e.g. ``"CHUNK"``, or
                the :class:`~triton_embed.options.Truncation`; ``None``: the server's).
        """
        if self.max_length is None or self.max_request_tokens is None:
            return self.max_batch_size
        per_text = self.max_length
        if truncation == Truncation.CHUNK:
            per_text *= self.max_chunks
        return max(1, min(self.max_batch_size, self.max_request_tokens // per_text))

    def token_ids_piece_size(self) -> int:
        """Token-ID lists per call of the token step (the embedder's ``max_batch_size``)."""
        return self.embedder_max_batch_size

    @classmethod
    def from_configs(
        cls,
        config: Mapping[str, Any],
        step_configs: Mapping[str, Mapping[str, Any]],
        facts: FolderFacts | None = None,
    ) -> ModelInfo | None:
        """The model an ensemble's config describes; ``None`` when it is no embedding ensemble.

        Args:
            config: the ensemble's config, as ``get_model_config(..., as_json=True)["config"]``.
            step_configs: configs of other models by name (its steps'; missing ones are
                read as ``max_batch_size`` equal to the ensemble's and no parameters).
            facts: the embedder's pooling and normalization (:func:`config_facts`, or the
                pool's facts reader).
        """
        if config.get("platform") != "ensemble":
            return None
        outputs = {o.get("name") for o in config.get("output", [])}
        steps = [s.get("model_name") for s in config.get("ensemble_scheduling", {}).get("step", [])]
        if not {cls.output, "NUM_TOKENS"} <= outputs or len(steps) < 2 or not all(steps):
            return None
        max_batch_size = batch_size_of(config, 1)
        tokenizer_config = step_configs.get(steps[0]) or {}
        embedder_config = step_configs.get(steps[-1]) or {}
        facts = facts or FolderFacts()
        max_length = int_parameter(config, "max_length")
        max_chunks = int_parameter(tokenizer_config, "max_chunks") or 16
        return cls(
            name=str(config["name"]),
            max_batch_size=max_batch_size,
            tokenizer=steps[0],
            embedder=steps[-1],
            tokenizer_max_batch_size=batch_size_of(tokenizer_config, max_batch_size),
            embedder_max_batch_size=batch_size_of(embedder_config, max_batch_size),
            served_model_name=parameter(config, "served_model_name") or None,
            dimension=int_parameter(config, "dimension") or int_parameter(config, "vocab_size"),
            max_length=max_length,
            pooling=facts.pooling,
            normalize=facts.normalize,
            dtype=parameter(embedder_config, "dtype") or "float32",
            max_batch_tokens=int_parameter(embedder_config, "max_num_batched_tokens"),
            allow_empty=allow_empty(tokenizer_config),
            max_chunks=max_chunks,
            max_request_tokens=request_tokens(tokenizer_config, max_length, max_chunks),
        )


@dataclass(frozen=True)
class SparseInfo(ModelInfo):
    """One sparse ensemble as the gateway serves it (:attr:`kind` ``sparse``; docs/sparse.md).

    The attributes of :class:`ModelInfo`; its vector step is :attr:`embedder` (the sparse
    encoder, ``TOKEN_IDS`` -> ``SPARSE``). ``dimension`` is the vocabulary size when the
    config states it; ``pooling`` and ``normalize`` do not apply (``None``).
    """

    kind: ClassVar[ModelKind] = ModelKind.SPARSE
    output: ClassVar[str] = "SPARSE"


def texts_within_cap(config: Mapping[str, Any], most: int) -> int:
    """Texts per request to a multi-vector ensemble so that no answer passes its cap.

    ``max(1, min(most, max_response_bytes // (4 x max_length x dimension)))`` (a hybrid's
    ``colbert_dimension``) from the ensemble's parameters (the cap: :data:`~triton_embed.
    serving_limits.TOKEN_MATRIX_BYTES` when not stated); ``most`` when the config does not
    state the lengths. Never raises.
    """
    dim = int_parameter(config, "colbert_dimension") or int_parameter(config, "dimension")
    max_length = int_parameter(config, "max_length")
    cap = int_parameter(config, "max_response_bytes") or TOKEN_MATRIX_BYTES
    return fit_token_matrices(most, max_length, dim, cap)


@dataclass(frozen=True)
class MultiVectorInfo(ModelInfo):
    """One multi-vector ensemble as the gateway serves it (:attr:`kind` ``multivector``).

    The attributes of :class:`ModelInfo` (``dimension``: values per token vector;
    ``max_length``: a document's token budget; its token step is :attr:`embedder`, the token
    encoder), and:

    Attributes:
        query_length: a query's tokens (ColBERT's, its ``[MASK]`` augmentation included), or
            ``None`` when not stated.
        max_response_bytes: the cap on one response's token matrices, bytes.
    """

    query_length: int | None = None
    max_response_bytes: int = TOKEN_MATRIX_BYTES

    kind: ClassVar[ModelKind] = ModelKind.MULTIVECTOR
    output: ClassVar[str] = "TOKEN_EMBEDDINGS"

    def piece_size(self, truncation: Truncation | str | None) -> int:
        """Texts per upstream call: within the token budget and the response cap."""
        most = super().piece_size(truncation)
        return fit_token_matrices(most, self.max_length, self.dimension, self.max_response_bytes)

    def token_ids_piece_size(self) -> int:
        """Token-ID lists per call of the token encoder, within the response cap."""
        most = super().token_ids_piece_size()
        return fit_token_matrices(most, self.max_length, self.dimension, self.max_response_bytes)

    @classmethod
    def from_configs(
        cls,
        config: Mapping[str, Any],
        step_configs: Mapping[str, Mapping[str, Any]],
        facts: FolderFacts | None = None,
    ) -> MultiVectorInfo | None:
        """The multi-vector model an ensemble's config describes (``None``: not one)."""
        base = super().from_configs(config, step_configs, facts)
        if base is None:
            return None
        return dataclasses.replace(
            base,
            query_length=int_parameter(config, "query_length"),
            max_response_bytes=int_parameter(config, "max_response_bytes") or TOKEN_MATRIX_BYTES,
        )


def _ensemble_steps(config: Mapping[str, Any]) -> list[str] | None:
    """The step model names of an ensemble config; ``None`` for no ensemble of 2+ steps."""
    if config.get("platform") != "ensemble":
        return None
    steps = [s.get("model_name") for s in config.get("ensemble_scheduling", {}).get("step", [])]
    return steps if len(steps) >= 2 and all(steps) else None


@dataclass(frozen=True)
class RerankerInfo:
    """One reranker ensemble as the gateway serves it (:attr:`kind` ``reranker``).

    Attributes:
        name: the ensemble's name (what the gateway sends to Triton).
        max_batch_size: query-document pairs per request to the ensemble.
        tokenizer: its first step's model name (the pair tokenizer).
        scorer: its last step's model name (``TOKEN_IDS`` -> ``SCORE``).
        served_model_name: the other name clients may use, or ``None``.
        max_length: the token budget per pair (special tokens or prompt template
            included), or ``None`` when the config does not say.
        family: ``cross_encoder`` or ``decoder`` (the ``family`` parameter), or ``None``.
        dtype: the scorer's ``dtype`` parameter (``float32`` when not stated).
        max_request_tokens: the pair tokenizer's token budget per request (its
            ``max_request_tokens`` parameter, or the default of
            :func:`triton_embed.serving_limits.request_token_budget` for one window per
            pair), or ``None`` when the config does not give ``max_length``.
        preferred_pairs: the scorer's preferred batch (:func:`preferred_pairs`), or ``None``.
        max_chars: characters of a query or document the pair tokenizer keeps with
            truncation on (its ``max_chars`` parameter, else
            :data:`~triton_embed.serving_limits.PAIR_CHARS_PER_TOKEN` x ``max_length``), or
            ``None`` when the config gives neither.
    """

    name: str
    max_batch_size: int
    tokenizer: str
    scorer: str
    served_model_name: str | None = None
    max_length: int | None = None
    family: str | None = None
    dtype: str = "float32"
    max_request_tokens: int | None = None
    preferred_pairs: int | None = None
    max_chars: int | None = None

    kind: ClassVar[ModelKind] = ModelKind.RERANKER

    def piece_size(self) -> int:
        """Pairs per upstream call: the scorer's preferred batch, within the token budget.

        ``max(1, min(max_batch_size, preferred_pairs, max_request_tokens // max_length))``:
        16 pairs for the shipped scorer template (so that the documents of one call are
        scored by every replica at once), 8 for a model that reads 8,192 tokens per pair.
        """
        size = min(self.max_batch_size, self.preferred_pairs or self.max_batch_size)
        if self.max_length is None or self.max_request_tokens is None:
            return size
        return max(1, min(size, self.max_request_tokens // self.max_length))

    @classmethod
    def from_configs(
        cls, config: Mapping[str, Any], step_configs: Mapping[str, Mapping[str, Any]]
    ) -> RerankerInfo | None:
        """The reranker an ensemble's config describes; ``None`` when it is no reranker ensemble.

        Args:
            config: the ensemble's config, as ``get_model_config(..., as_json=True)["config"]``.
            step_configs: configs of other models by name (its steps'; missing ones are
                read as ``max_batch_size`` equal to the ensemble's and no parameters).
        """
        steps = _ensemble_steps(config)
        if steps is None or not is_reranker_config(config):
            return None
        max_batch_size = batch_size_of(config, 1)
        tokenizer_config = dict(step_configs.get(steps[0]) or {})
        tokenizer_config.setdefault("max_batch_size", max_batch_size)
        scorer_config = step_configs.get(steps[-1]) or {}
        max_length = int_parameter(config, "max_length")
        return cls(
            name=str(config["name"]),
            max_batch_size=max_batch_size,
            tokenizer=steps[0],
            scorer=steps[-1],
            served_model_name=parameter(config, "served_model_name") or None,
            max_length=max_length,
            family=parameter(config, "family") or None,
            dtype=parameter(scorer_config, "dtype") or "float32",
            max_request_tokens=request_tokens(tokenizer_config, max_length, 1),
            preferred_pairs=preferred_pairs(scorer_config),
            max_chars=int_parameter(tokenizer_config, "max_chars")
            or (PAIR_CHARS_PER_TOKEN * max_length if max_length else None),
        )


def preferred_pairs(scorer_config: Mapping[str, Any]) -> int | None:
    """The smallest ``dynamic_batching.preferred_batch_size`` of a scorer's config, or ``None``.

    A reranker's scorer batches requests up to it before a free replica takes the rest
    (docs/rerank.md, "Throughput"); a call of more pairs is best sent in pieces of it, so
    every replica scores part of it. Never raises.
    """
    sizes = (scorer_config.get("dynamic_batching") or {}).get("preferred_batch_size") or []
    try:
        positive = [int(s) for s in sizes if int(s) > 0]
    except (TypeError, ValueError):
        return None
    return min(positive) if positive else None


def is_reranker_config(config: Mapping[str, Any]) -> bool:
    """Whether a model config is a reranker's (docs/rerank.md).

    Inputs ``QUERY`` and ``DOCUMENT``, outputs ``SCORE`` and ``NUM_TOKENS``, and a ``kind``
    parameter, if stated, ``reranker``. Reads the ensemble's config (or one of the client's
    ``get_model_config``); never raises.
    """
    inputs = {i.get("name") for i in config.get("input", [])}
    outputs = {o.get("name") for o in config.get("output", [])}
    stated = parameter(config, "kind").lower() in ("", ModelKind.RERANKER.value)
    return RERANKER_INPUTS <= inputs and RERANKER_OUTPUTS <= outputs and stated


def kind_of_config(config: Mapping[str, Any]) -> ModelKind | None:
    """A config's kind by its outputs (``EMBEDDING``, ``SPARSE``...) or ``kind``; else ``None``."""
    if is_reranker_config(config):
        return ModelKind.RERANKER
    if parameter(config, "kind").lower() == ModelKind.HYBRID.value:  # BGE-M3: 3 outputs
        return ModelKind.HYBRID
    outputs = {o.get("name") for o in config.get("output", [])}
    if SPARSE_OUTPUTS <= outputs:
        return ModelKind.SPARSE
    if MULTIVECTOR_OUTPUTS <= outputs:
        return ModelKind.MULTIVECTOR
    return ModelKind.EMBEDDING if EMBEDDING_OUTPUTS <= outputs else None


#: A model of the catalog (``.kind`` says which; a hybrid one is a MultiVectorInfo subclass).
ServedModel = ModelInfo | SparseInfo | MultiVectorInfo | RerankerInfo


def served_model(
    config: Mapping[str, Any],
    step_configs: Mapping[str, Mapping[str, Any]],
    facts: Callable[[], FolderFacts | None] = lambda: None,
) -> ServedModel | None:
    """The model an ensemble's config describes, of either kind; ``None`` for any other model.

    Args:
        config: the ensemble's config.
        step_configs: configs of other models by name.
        facts: the embedder's pooling and normalization, asked for an embedding ensemble only
            (reading a model folder is not free).
    """
    reranker = RerankerInfo.from_configs(config, step_configs)
    if reranker is not None:
        return reranker
    if config.get("platform") != "ensemble" or is_reranker_config(config):
        return None
    kind = kind_of_config(config)
    if kind is ModelKind.HYBRID:  # hybrid_info.any_served_model's
        return None
    if kind in (ModelKind.SPARSE, ModelKind.MULTIVECTOR):
        info = SparseInfo if kind is ModelKind.SPARSE else MultiVectorInfo
        return info.from_configs(config, step_configs)
    return ModelInfo.from_configs(config, step_configs, facts())


@dataclass(frozen=True)
class Catalog:
    """The models the ready upstreams serve, of both kinds, by name and by alias.

    Attributes:
        models: ``{ensemble name: ModelInfo, SparseInfo or RerankerInfo}``.
        aliases: ``{served_model_name: ensemble name}`` (names that are no ensemble's).
    """

    models: Mapping[str, ServedModel] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, infos: Iterable[ServedModel]) -> Catalog:
        """The catalog of ``infos``; the first of two models of one name is kept.

        An alias equal to an ensemble's name, or already taken by an earlier model (in name
        order), is left out.
        """
        models: dict[str, ServedModel] = {}
        for info in infos:
            models.setdefault(info.name, info)
        aliases: dict[str, str] = {}
        for name in sorted(models):
            alias = models[name].served_model_name
            if alias and alias not in models and alias not in aliases:
                aliases[alias] = name
        return cls(models=dict(sorted(models.items())), aliases=aliases)

    def resolve(self, name: str) -> ServedModel | None:
        """The model called ``name`` (ensemble name or alias), of either kind, or ``None``."""
        info = self.models.get(name)
        if info is None and name in self.aliases:
            info = self.models.get(self.aliases[name])
        return info

    def names(self) -> list[str]:
        """Every name a client may use: the ensemble names, then the aliases."""
        return [*self.models, *self.aliases]

    def of_kind(self, kind: ModelKind) -> list[str]:
        """The ensemble names of the models of ``kind``, in name order."""
        return [name for name, info in self.models.items() if info.kind is kind]
