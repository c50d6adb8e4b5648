"""The files of one sparse (SPLADE) model's three Triton models.

No sparse model ships in ``model_repository/``, so the ensemble and the engine step are
templates of this package (``templates/sparse/``: the ensemble ``TEXT`` -> ``SPARSE``,
``NUM_TOKENS``, docs/sparse.md; the sparse encoder step, CPU config plus its GPU variant, or
the GPU config alone). The tokenizer step is the shipped one (``templates/tokenizer.pbtxt``)
with ``kind`` ``sparse`` (its request parameters: :mod:`triton_embed.sparse_options`) and
one window per text (``max_chunks`` 1: ``truncation=CHUNK`` is refused).
:func:`render_sparse` sets, by key
(:func:`~triton_embed_server.models.repository.copies.edit_text`), the names, ``model_path``
and ``max_length`` of both steps, the model's spec in the engine step, its instance count,
dtype and ``kv_cache_bytes``, and the ensemble's served name, vocabulary and budget.
"""

from __future__ import annotations

from collections.abc import Callable

from triton_embed_server.models.repository.names import LEGACY_NAME
from triton_embed_server.models.repository.render import TEMPLATES as SHIPPED
from triton_embed_server.models.repository.render import ModelOptions
from triton_embed_server.models.repository.render_kind import (
    TEMPLATES as KIND_TEMPLATES,
)
from triton_embed_server.models.repository.render_kind import (
    KindParameters,
    KindTemplates,
    render_kind,
)
from triton_embed_server.models.sparse_spec import SparseSpec

#: The sparse templates, package data of this package.
TEMPLATES = KIND_TEMPLATES / "sparse"
#: The name the templates use for the ensemble (``splade``; steps ``splade_tokenizer``...).
TEMPLATE_NAME = "splade"
SPARSE_TEMPLATES = KindTemplates(
    kind="sparse",
    folder=TEMPLATES,
    template_name=TEMPLATE_NAME,
    engine="sparse_encoder",
    gpu_only_header=(
        "# Step 2 of the `{name}` ensemble: token IDs -> sparse vectors, vLLM pooling runner.\n"
        "# GPU variant (triton-embed repository add --device gpu); no CPU variant is written.\n"
    ),
    tokenizer=(SHIPPED / "tokenizer.pbtxt", SHIPPED / "tokenizer_model.py.tmpl", LEGACY_NAME),
)


def render_sparse(
    options: ModelOptions,
    model_path: str,
    spec: SparseSpec,
    *,
    served_model_name: str,
    resolved_max_length: int,
    kv_cache_bytes: Callable[[str], int] | None = None,
) -> dict[str, bytes]:
    """The files of a sparse model's three models, without checking anything.

    Args:
        options: names, device, instances, ``max_length`` (0: the model's own), dtype.
        model_path: the ``model_path`` parameter of both steps, as it is to be written.
        spec: the model's facts (:func:`~triton_embed_server.models.sparse_spec.
            read_sparse_spec`).
        served_model_name: the ensemble's ``served_model_name`` parameter.
        resolved_max_length: the token budget per text in force (the ensemble's ``max_length``).
        kv_cache_bytes: the engine step's ``kv_cache_bytes`` from its config text rendered
            with ``auto``; None: ``auto``.

    Returns:
        ``{path relative to the repository root, "/"-separated: UTF-8 bytes}``.
    """
    parameters = KindParameters(
        steps={"model_path": model_path, "max_length": str(options.max_length)},
        ensemble={
            "served_model_name": served_model_name,
            "vocab_size": str(spec.vocab_size),
            "max_length": str(resolved_max_length),
        },
        tokenizer={"max_chunks": "1", "kind": "sparse"},
        engine=spec.parameters(),
    )
    return render_kind(SPARSE_TEMPLATES, options, parameters, kv_cache_bytes)
