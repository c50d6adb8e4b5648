"""The files of one hybrid (BGE-M3) model's three Triton models.

The ensemble (``TEXT`` -> ``EMBEDDING``, ``SPARSE``, ``TOKEN_EMBEDDINGS``, ``NUM_TOKENS``;
docs/sparse.md, "Hybrid models") and the hybrid encoder step are templates of this package
(``templates/hybrid/``); the tokenizer step is the shipped one with ``kind`` ``hybrid`` (its
request parameters: :mod:`triton_embed.hybrid_options`) and one window per text
(``max_chunks`` 1). :func:`render_hybrid` sets both steps' ``model_path`` and
``max_length``, the hybrid encoder's spec, instance count, dtype, step size,
``kv_cache_bytes`` and response cap, and the ensemble's served name, dimensions,
vocabulary, budget and cap, through
:func:`~triton_embed_server.models.repository.render_kind.render_kind`.
"""

from __future__ import annotations

from collections.abc import Callable

from triton_embed.serving_limits import TOKEN_MATRIX_BYTES, token_matrix_bytes

from triton_embed_server.models.hybrid_spec import HybridSpec
from triton_embed_server.models.repository.names import LEGACY_NAME
from triton_embed_server.models.repository.render import CPU_STEP_TOKENS, ModelOptions
from triton_embed_server.models.repository.render import TEMPLATES as SHIPPED
from triton_embed_server.models.repository.render_kind import (
    TEMPLATES as KIND_TEMPLATES,
)
from triton_embed_server.models.repository.render_kind import (
    KindParameters,
    KindTemplates,
    render_kind,
)

#: The hybrid templates, package data of this package.
TEMPLATES = KIND_TEMPLATES / "hybrid"
#: The name the templates use for the ensemble (``bge_m3``; steps ``bge_m3_tokenizer``...).
TEMPLATE_NAME = "bge_m3"
HYBRID_TEMPLATES = KindTemplates(
    kind="hybrid",
    folder=TEMPLATES,
    template_name=TEMPLATE_NAME,
    engine="hybrid_encoder",
    gpu_only_header=(
        "# Step 2 of the `{name}` ensemble: token IDs -> dense, sparse and ColBERT vectors.\n"
        "# GPU variant (triton-embed repository add --device gpu); no CPU variant is written.\n"
    ),
    tokenizer=(SHIPPED / "tokenizer.pbtxt", SHIPPED / "tokenizer_model.py.tmpl", LEGACY_NAME),
)
#: The hybrid encoder's ``max_num_batched_tokens`` per device (``max_length`` when larger).
STEP_TOKENS = {"cpu": CPU_STEP_TOKENS, "gpu": 16384}


def render_hybrid(
    options: ModelOptions,
    model_path: str,
    spec: HybridSpec,
    *,
    served_model_name: str,
    resolved_max_length: int,
    kv_cache_bytes: Callable[[str], int] | None = None,
    max_response_bytes: int = TOKEN_MATRIX_BYTES,
) -> dict[str, bytes]:
    """The files of a hybrid model's three models, without checking anything.

    Args:
        options: names, device, instances, ``max_length`` (0: the model's own), dtype.
        model_path: the ``model_path`` parameter of both steps, as it is to be written.
        spec: the model's facts (:func:`~triton_embed_server.models.hybrid_spec.
            read_hybrid_spec`).
        served_model_name: the ensemble's ``served_model_name`` parameter.
        resolved_max_length: the token budget per text in force (the ensemble's
            ``max_length``).
        kv_cache_bytes: the engine step's ``kv_cache_bytes`` from its config text rendered
            with ``auto``; None: ``auto``.
        max_response_bytes: the cap on one response's ColBERT matrices, bytes; raised to one
            full-length text's (``4 x (max_length - 1) x colbert_dim``: 33.5 MB for BGE-M3
            at 8,192 tokens) when below it, so that every text can be answered.

    Returns:
        ``{path relative to the repository root, "/"-separated: UTF-8 bytes}``.
    """
    max_response_bytes = max(
        max_response_bytes, token_matrix_bytes(resolved_max_length - 1, spec.colbert_dim)
    )
    parameters = KindParameters(
        steps={"model_path": model_path, "max_length": str(options.max_length)},
        ensemble={
            "served_model_name": served_model_name,
            "dimension": str(spec.dim),
            "colbert_dimension": str(spec.colbert_dim),
            "vocab_size": str(spec.vocab_size),
            "max_length": str(resolved_max_length),
            "max_response_bytes": str(max_response_bytes),
        },
        tokenizer={"max_chunks": "1", "kind": "hybrid"},
        engine={**spec.parameters(), "max_response_bytes": str(max_response_bytes)},
        step_tokens={d: max(t, resolved_max_length) for d, t in STEP_TOKENS.items()},
    )
    return render_kind(HYBRID_TEMPLATES, options, parameters, kv_cache_bytes)
