"""What one model's embeddings are, as typed values: pooling, normalization, dimensions, prompts.

:func:`triton_embed_server.models.model_spec.read_model_spec` reads them from a model folder
(the one reader); ``triton-embed repository add`` renders them into the embedder step's
``parameters`` once (:meth:`ModelSpec.parameters`), and the embedder step parses them back
once at load (:meth:`SpecParameters.parse`), so the engine is handed the spec without a
second read of the folder. An empty parameter means "what the folder states" (configs written
by hand, or before ``repository add`` wrote the spec): then the folder is read, in that one
reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from triton_embed.options import parse_flag, quote

from triton_embed_server.steps.vectors import ANY_DIMENSIONS, Dimensions, Pooling

#: The embedder parameters that hold the spec (:meth:`ModelSpec.parameters`).
SPEC_KEYS = (
    "pooling",
    "normalize",
    "dimension",
    "dimensions",
    "include_prompt",
    "model_max_length",
)


class ModelFolderError(ValueError):
    """A model folder lacks what serving it needs (one line: the file and what is missing)."""


def render_flag(value: bool) -> str:
    """A bool as a config parameter: ``true`` / ``false``."""
    return "true" if value else "false"


@dataclass(frozen=True)
class PromptSpec:
    """A model's instruction prompts: what the tokenizer step needs to know.

    Attributes:
        prompts: prompt name -> text prepended to the input (may be empty strings).
        default_prompt_name: the prompt applied when a request names none, or ``None``.
        include_prompt: pool over the prompt's tokens too (sentence-transformers'
            ``include_prompt``; false excludes the prompt from mean pooling).
    """

    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    include_prompt: bool = True

    def names(self) -> list[str]:
        """The ``input_type`` values this model accepts (``document`` always)."""
        return sorted({*self.prompts, "document"})

    def prompt(self, input_type: str | None) -> str:
        """The text prepended to an input of this ``input_type`` (``None``: the default).

        Raises:
            ValueError: a name the model has no prompt for (lists the names it has).
        """
        name = input_type if input_type is not None else self.default_prompt_name
        if name is None:
            return ""
        if name in self.prompts:
            return self.prompts[name]
        if name == "document":  # a model without a document prompt embeds documents as is
            return ""
        raise ValueError(
            f"request parameter input_type={quote(name)} is not a prompt of this model; "
            f"its input types are {', '.join(self.names())}"
        )


def parse_dimension_list(text: str, what: str = "dimensions") -> tuple[int, ...] | None:
    """Parse a ``dimensions`` option: :data:`ANY_DIMENSIONS` (``None``) or ``64,128,...``.

    Raises:
        ValueError: an element that is not an integer (names ``what``).
    """
    if text.strip().lower() == ANY_DIMENSIONS:
        return None
    return int_list(text.split(","), what)


def int_list(values: list[Any], what: str) -> tuple[int, ...]:
    """Whole numbers from a list of ints or their strings, ascending, unique.

    Raises:
        ValueError: an element that is not an integer (names ``what``).
    """
    dims = set()
    for raw in values:
        try:
            dims.add(int(str(raw).strip()))
        except ValueError:
            raise ValueError(f"{what}: {raw!r} is not an integer") from None
    return tuple(sorted(dims))


@dataclass(frozen=True)
class ModelSpec:
    """What one model folder's embeddings are.

    Attributes:
        path: the model folder.
        pooling: how token vectors are pooled.
        prompting: the prompts and whether pooling includes them (the prompts themselves
            are empty in a spec built from an embedder's parameters: only the tokenizer
            step applies them, and it reads them from the folder).
        normalize: the model ends with a ``Normalize`` module (L2 norm 1 vectors).
        dimensions: the full vector length and the shorter ones a request may ask for.
        max_length: the model's own token budget, special tokens included.
    """

    path: Path
    pooling: Pooling
    prompting: PromptSpec
    normalize: bool
    dimensions: Dimensions
    max_length: int

    @property
    def dimension(self) -> int:
        """Length of the full vector (float32 values)."""
        return self.dimensions.full

    def allowed_dimensions(self) -> str:
        """The dimensions a request may ask for, in words (for error messages)."""
        return self.dimensions.describe()

    def parameters(self) -> dict[str, str]:
        """The spec as the embedder step's parameters (:data:`SPEC_KEYS`), rendered once."""
        return {
            "pooling": self.pooling.value,
            "normalize": render_flag(self.normalize),
            "dimension": str(self.dimension),
            "dimensions": self.dimensions.render(),
            "include_prompt": render_flag(self.prompting.include_prompt),
            "model_max_length": str(self.max_length),
        }

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary (``repository list``, the gateway's model list)."""
        return {
            "model_path": str(self.path),
            "pooling": self.pooling.value,
            "include_prompt": self.prompting.include_prompt,
            "normalize": self.normalize,
            "dimension": self.dimension,
            "max_length": self.max_length,
            "prompts": sorted(self.prompting.prompts),
            "default_prompt_name": self.prompting.default_prompt_name,
            "dimensions": ANY_DIMENSIONS
            if self.dimensions.any_length
            else list(self.dimensions.matryoshka),
        }


@dataclass(frozen=True)
class SpecParameters:
    """The spec parameters of an embedder config, parsed; ``None``: empty (the folder's).

    Attributes:
        pooling: parameter ``pooling``.
        normalize: parameter ``normalize``.
        dimension: parameter ``dimension`` (the full vector length).
        dimensions: parameter ``dimensions``: the allowed dimensions, ``None`` when empty;
            :attr:`any_dimensions` for ``any``.
        any_dimensions: the parameter ``dimensions`` is ``any``.
        include_prompt: parameter ``include_prompt``.
        model_max_length: parameter ``model_max_length`` (the model's own token budget).
    """

    pooling: Pooling | None = None
    normalize: bool | None = None
    dimension: int | None = None
    dimensions: tuple[int, ...] | None = None
    any_dimensions: bool = False
    include_prompt: bool | None = None
    model_max_length: int | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str], prefix: str = "") -> SpecParameters:
        """Parse the spec keys of ``{key: string_value}`` (missing or blank: ``None``).

        Args:
            params: a config's parameters.
            prefix: put before each key in error messages (``"parameter "``).

        Raises:
            ValueError: a malformed value (names the key).
        """

        def text(key: str) -> str:
            return str(params.get(key) or "").strip()

        def count(key: str) -> int | None:
            if not text(key):
                return None
            (value,) = int_list([text(key)], f"{prefix}{key}")
            if value < 1:
                raise ValueError(f"{prefix}{key}={value} must be >= 1")
            return value

        dims = text("dimensions")
        allowed = parse_dimension_list(dims, f"{prefix}dimensions") if dims else ()
        return cls(
            pooling=Pooling.parse(text("pooling"), f"{prefix}pooling") if text("pooling") else None,
            normalize=_flag_or_none(text("normalize"), f"{prefix}normalize"),
            dimension=count("dimension"),
            dimensions=allowed if allowed else None,
            any_dimensions=bool(dims) and allowed is None,
            include_prompt=_flag_or_none(text("include_prompt"), f"{prefix}include_prompt"),
            model_max_length=count("model_max_length"),
        )

    @property
    def complete(self) -> bool:
        """Every spec parameter is set: the spec needs no read of the folder."""
        return None not in (
            self.pooling,
            self.normalize,
            self.dimension,
            self.include_prompt,
            self.model_max_length,
        ) and (self.any_dimensions or self.dimensions is not None)

    def spec(self, path: Path) -> ModelSpec:
        """The spec these parameters state (only when :attr:`complete`).

        Raises:
            ValueError: not :attr:`complete`, or a ``dimensions`` value outside
                ``1..dimension``.
        """
        if not self.complete:
            raise ValueError(f"the spec parameters {', '.join(SPEC_KEYS)} are not all set")
        full = int(self.dimension or 0)
        return ModelSpec(
            path=path,
            pooling=Pooling(self.pooling),
            prompting=PromptSpec(include_prompt=bool(self.include_prompt)),
            normalize=bool(self.normalize),
            dimensions=self.dimensions_rule(full),
            max_length=int(self.model_max_length or 0),
        )

    def dimensions_rule(self, full: int) -> Dimensions | None:
        """The ``dimensions`` rule for a vector of ``full`` values (``None``: not set).

        Raises:
            ValueError: a dimension outside ``1..full``.
        """
        if self.any_dimensions:
            return Dimensions(full, (), True)
        if self.dimensions is None:
            return None
        return Dimensions.of(full, self.dimensions, "dimensions")

    def over(self, spec: ModelSpec) -> ModelSpec:
        """``spec`` (what the folder states) with the parameters that are set in its place.

        Raises:
            ValueError: a ``dimensions`` value outside ``1..dimension``.
        """
        full = self.dimension or spec.dimension
        rule = self.dimensions_rule(full) or replace(spec.dimensions, full=full)
        prompting = spec.prompting
        if self.include_prompt is not None:
            prompting = replace(prompting, include_prompt=self.include_prompt)
        return replace(
            spec,
            pooling=self.pooling or spec.pooling,
            normalize=spec.normalize if self.normalize is None else self.normalize,
            dimensions=rule,
            prompting=prompting,
            max_length=self.model_max_length or spec.max_length,
        )


def _flag_or_none(text: str, what: str) -> bool | None:
    return parse_flag(text, what) if text else None
