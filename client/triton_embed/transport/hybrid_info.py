"""A hybrid (BGE-M3) ensemble as the gateway serves it, and its view as each kind it serves.

A **hybrid ensemble** (docs/sparse.md, "Hybrid models") is an ensemble whose config's
``kind`` parameter is ``hybrid``: one forward pass, three outputs (``EMBEDDING``,
``SPARSE``, ``TOKEN_EMBEDDINGS``), the request's ``outputs`` parameter picking the heads run.
The catalog keeps it as a :class:`HybridInfo`; a route of one kind of vectors (OpenAI's
``/v1/embeddings``, TEI's ``/embed_sparse``, ``/embed_all``) takes its :meth:`HybridInfo.view`:
an info of that kind whose :attr:`head` the calls ask for (:func:`head_options`) and whose
``output`` they read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from triton_embed.hybrid_options import HYBRID_NAMES, OUTPUTS, HybridOptions
from triton_embed.options import OptionError
from triton_embed.transport.catalog import (
    FolderFacts,
    ModelInfo,
    ModelKind,
    MultiVectorInfo,
    ServedModel,
    SparseInfo,
    kind_of_config,
    served_model,
)
from triton_embed.transport.config_values import int_parameter


class HybridDense(ModelInfo):
    """A hybrid model seen as an embedding model: its CLS vectors, L2-normalized."""

    head: ClassVar[str] = "dense"
    rows_skipped: ClassVar[int] = 0


class HybridSparse(SparseInfo):
    """A hybrid model seen as a sparse model: its lexical weights."""

    head: ClassVar[str] = "sparse"
    rows_skipped: ClassVar[int] = 0


class HybridTokens(MultiVectorInfo):
    """A hybrid model seen as a multi-vector model: its ColBERT vectors (CLS left out)."""

    head: ClassVar[str] = "colbert"
    rows_skipped: ClassVar[int] = 1


@dataclass(frozen=True)
class HybridInfo(MultiVectorInfo):
    """One hybrid ensemble (:attr:`kind` ``hybrid``).

    The attributes of :class:`~triton_embed.transport.catalog.MultiVectorInfo`
    (``dimension``: the dense vector's values; ``max_response_bytes``: the cap on one
    response's ColBERT matrices), and:

    Attributes:
        colbert_dimension: values per ColBERT vector, or ``None`` when not stated.
        vocab_size: the sparse vectors' length, or ``None`` when not stated.
    """

    colbert_dimension: int | None = None
    vocab_size: int | None = None

    kind: ClassVar[ModelKind] = ModelKind.HYBRID
    output: ClassVar[str] = "EMBEDDING"

    @classmethod
    def from_configs(
        cls,
        config: Mapping[str, Any],
        step_configs: Mapping[str, Mapping[str, Any]],
        facts: FolderFacts | None = None,
    ) -> HybridInfo | None:
        """The hybrid model an ensemble's config describes (``None``: not one)."""
        base = super().from_configs(config, step_configs, FolderFacts("cls", True))
        if base is None:
            return None
        return dataclasses.replace(
            base,
            colbert_dimension=int_parameter(config, "colbert_dimension") or base.dimension,
            vocab_size=int_parameter(config, "vocab_size"),
        )

    def view(self, kind: ModelKind) -> ModelInfo:
        """The model as one ``kind`` of ``embedding``, ``sparse``, ``multivector``.

        Raises:
            ValueError: another kind.
        """
        common = {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelInfo)}
        if kind is ModelKind.EMBEDDING:
            return HybridDense(**common)
        if kind is ModelKind.SPARSE:
            return HybridSparse(**{**common, "dimension": self.vocab_size, "pooling": None,
                                   "normalize": None})  # fmt: skip
        if kind is ModelKind.MULTIVECTOR:
            return HybridTokens(
                **{**common, "dimension": self.colbert_dimension, "normalize": True},
                max_response_bytes=self.max_response_bytes,
            )
        raise ValueError(f"a hybrid model is not served as {kind.value}")


#: The kinds of vectors a hybrid model serves.
VIEWS = (ModelKind.EMBEDDING, ModelKind.SPARSE, ModelKind.MULTIVECTOR)


def head_options(options: Any, head: str) -> HybridOptions:
    """A route's request options, as a hybrid model's asking for ``head`` only.

    Args:
        options: the route's options (:class:`~triton_embed.options.RequestOptions`,
            ``SparseOptions`` or ``MultiVectorOptions``): the hybrid model's names are kept.
        head: ``dense``, ``sparse`` or ``colbert``.

    Raises:
        OptionError: an option set that a hybrid model does not take (``dimensions``,
            ``normalize``, ``embedding_type``...; names it).
    """
    values = options.to_parameters() if options is not None else {}
    other = sorted(set(values) - set(HYBRID_NAMES))
    if other:
        name = other[0]
        raise OptionError(
            name,
            values[name],
            ", ".join(HYBRID_NAMES),
            "is not offered for hybrid models (BGE-M3's dense vectors are CLS, L2-normalized, "
            "float32, full dimension); leave it out",
        )
    return HybridOptions(**{**values, OUTPUTS: head})


def any_served_model(
    config: Mapping[str, Any],
    step_configs: Mapping[str, Mapping[str, Any]],
    facts: Callable[[], FolderFacts | None] = lambda: None,
) -> ServedModel | HybridInfo | None:
    """:func:`~triton_embed.transport.catalog.served_model`, a hybrid ensemble included.

    Args:
        config: the ensemble's config.
        step_configs: configs of other models by name.
        facts: the embedder's pooling and normalization (an embedding ensemble only).
    """
    if kind_of_config(config) is ModelKind.HYBRID:
        return HybridInfo.from_configs(config, step_configs)
    return served_model(config, step_configs, facts)
