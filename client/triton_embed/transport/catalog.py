"""The embedding models the upstreams serve, read from their Triton model configs.

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

Pooling and normalization are often left empty in the embedder's config ("what the model
folder states"); the pool then asks a facts reader it was given (``facts_reader``): the
default, :func:`config_facts`, knows only what the config states; the HTTP gateway, which
may run next to the model folders, passes one that reads the folder too
(``triton_embed_server.gateway.folder_facts``).

Clients name a model by its ensemble name or its ``served_model_name`` (:meth:`Catalog.resolve`);
an ensemble name wins over another model's alias.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from triton_embed.options import OptionError, Truncation, parse_flag
from triton_embed.serving_limits import REQUEST_TEXTS, request_token_budget

EMBEDDING_OUTPUTS = frozenset({"EMBEDDING", "NUM_TOKENS"})


def parameter(config: Mapping[str, Any], key: str) -> str:
    """A model config parameter's string value ("" when absent)."""
    value = (config.get("parameters") or {}).get(key) or {}
    return str(value.get("string_value", "")).strip()


def _request_tokens(
    tokenizer_config: Mapping[str, Any], max_length: int | None, max_chunks: int
) -> int | None:
    """The tokenizer step's budget per request: its parameter, else the step's default."""
    stated = _int_parameter(tokenizer_config, "max_request_tokens")
    if stated:
        return stated
    if max_length is None:
        return None
    texts = _max_batch_size(tokenizer_config, REQUEST_TEXTS)
    return request_token_budget(texts, max_length, max_chunks)


def _int_parameter(config: Mapping[str, Any], key: str) -> int | None:
    """A whole-number parameter (``None`` when absent, empty, 0 or not a number)."""
    text = parameter(config, key)
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def _max_batch_size(config: Mapping[str, Any] | None, default: int) -> int:
    """``max_batch_size`` of a config (``default`` when absent or 0)."""
    if not config:
        return default
    return int(config.get("max_batch_size") or 0) or default


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
    """One embedding ensemble as the gateway serves it.

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
        if not EMBEDDING_OUTPUTS <= outputs or len(steps) < 2 or not all(steps):
            return None
        max_batch_size = _max_batch_size(config, 1)
        tokenizer_config = step_configs.get(steps[0]) or {}
        embedder_config = step_configs.get(steps[-1]) or {}
        facts = facts or FolderFacts()
        max_length = _int_parameter(config, "max_length")
        max_chunks = _int_parameter(tokenizer_config, "max_chunks") or 16
        return cls(
            name=str(config["name"]),
            max_batch_size=max_batch_size,
            tokenizer=steps[0],
            embedder=steps[-1],
            tokenizer_max_batch_size=_max_batch_size(tokenizer_config, max_batch_size),
            embedder_max_batch_size=_max_batch_size(embedder_config, max_batch_size),
            served_model_name=parameter(config, "served_model_name") or None,
            dimension=_int_parameter(config, "dimension"),
            max_length=max_length,
            pooling=facts.pooling,
            normalize=facts.normalize,
            dtype=parameter(embedder_config, "dtype") or "float32",
            max_batch_tokens=_int_parameter(embedder_config, "max_num_batched_tokens"),
            allow_empty=_allow_empty(tokenizer_config),
            max_chunks=max_chunks,
            max_request_tokens=_request_tokens(tokenizer_config, max_length, max_chunks),
        )


def _allow_empty(tokenizer_config: Mapping[str, Any]) -> bool:
    """The tokenizer step's ``allow_empty`` parameter (``false`` when absent or unreadable)."""
    try:
        return parse_flag(parameter(tokenizer_config, "allow_empty") or "false")
    except OptionError:
        return False


@dataclass(frozen=True)
class Catalog:
    """The embedding models the ready upstreams serve, by name and by alias.

    Attributes:
        models: ``{ensemble name: ModelInfo}``.
        aliases: ``{served_model_name: ensemble name}`` (names that are no ensemble's).
    """

    models: Mapping[str, ModelInfo] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, infos: Iterable[ModelInfo]) -> Catalog:
        """The catalog of ``infos``; the first of two models of one name is kept.

        An alias equal to an ensemble's name, or already taken by an earlier model (in name
        order), is left out.
        """
        models: dict[str, ModelInfo] = {}
        for info in infos:
            models.setdefault(info.name, info)
        aliases: dict[str, str] = {}
        for name in sorted(models):
            alias = models[name].served_model_name
            if alias and alias not in models and alias not in aliases:
                aliases[alias] = name
        return cls(models=dict(sorted(models.items())), aliases=aliases)

    def resolve(self, name: str) -> ModelInfo | None:
        """The model called ``name`` (ensemble name or alias), or ``None``."""
        info = self.models.get(name)
        if info is None and name in self.aliases:
            info = self.models.get(self.aliases[name])
        return info

    def names(self) -> list[str]:
        """Every name a client may use: the ensemble names, then the aliases."""
        return [*self.models, *self.aliases]
