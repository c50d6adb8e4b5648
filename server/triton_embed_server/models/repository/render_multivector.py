"""The files of one multi-vector (late interaction) model's three Triton models.

The ensemble (``TEXT`` -> ``TOKEN_EMBEDDINGS``, ``NUM_TOKENS``; docs/sparse.md) and the token
encoder step are templates of this package (``templates/multivector/``); the tokenizer step
is the shipped one with ``kind`` ``multivector`` (its request parameters:
:mod:`triton_embed.multivector_options`), one window per text (``max_chunks`` 1) and the
model's spec appended to its parameters (the markers, the query length and augmentation it
applies). :func:`render_multivector` sets both steps' ``model_path``, ``max_length`` and
spec, the token encoder's instance count, dtype, step size, ``kv_cache_bytes`` and response
cap, and the ensemble's served name, dimension, lengths and cap, through
:func:`~triton_embed_server.models.repository.render_kind.render_kind`.
"""

from __future__ import annotations

from collections.abc import Callable

from triton_embed.serving_limits import TOKEN_MATRIX_BYTES

from triton_embed_server.models.multivector_spec import MultiVectorSpec
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

#: The multi-vector templates, package data of this package.
TEMPLATES = KIND_TEMPLATES / "multivector"
#: The name the templates use for the ensemble (``colbert``; steps ``colbert_tokenizer``...).
TEMPLATE_NAME = "colbert"
MULTIVECTOR_TEMPLATES = KindTemplates(
    kind="multivector",
    folder=TEMPLATES,
    template_name=TEMPLATE_NAME,
    engine="token_encoder",
    gpu_only_header=(
        "# Step 2 of the `{name}` ensemble: token IDs -> token vectors, vLLM pooling runner.\n"
        "# GPU variant (triton-embed repository add --device gpu); no CPU variant is written.\n"
    ),
    tokenizer=(SHIPPED / "tokenizer.pbtxt", SHIPPED / "tokenizer_model.py.tmpl", LEGACY_NAME),
)
#: The token encoder's ``max_num_batched_tokens`` per device (``max_length`` when larger).
STEP_TOKENS = {"cpu": CPU_STEP_TOKENS, "gpu": 16384}


def render_multivector(
    options: ModelOptions,
    model_path: str,
    spec: MultiVectorSpec,
    *,
    served_model_name: str,
    resolved_max_length: int,
    kv_cache_bytes: Callable[[str], int] | None = None,
    max_response_bytes: int = TOKEN_MATRIX_BYTES,
) -> dict[str, bytes]:
    """The files of a multi-vector model's three models, without checking anything.

    Args:
        options: names, device, instances, ``max_length`` (0: the model's own), dtype.
        model_path: the ``model_path`` parameter of both steps, as it is to be written.
        spec: the model's facts (:func:`~triton_embed_server.models.multivector_spec.
            read_multivector_spec`).
        served_model_name: the ensemble's ``served_model_name`` parameter.
        resolved_max_length: a document's token budget in force (the ensemble's
            ``max_length``).
        kv_cache_bytes: the engine step's ``kv_cache_bytes`` from its config text rendered
            with ``auto``; None: ``auto``.
        max_response_bytes: the cap on one response's token matrices, bytes.

    Returns:
        ``{path relative to the repository root, "/"-separated: UTF-8 bytes}``.
    """
    parameters = KindParameters(
        steps={"model_path": model_path, "max_length": str(options.max_length)},
        ensemble={
            "served_model_name": served_model_name,
            "dimension": str(spec.dim),
            "max_length": str(resolved_max_length),
            "query_length": str(spec.length("query", resolved_max_length)),
            "max_response_bytes": str(max_response_bytes),
        },
        tokenizer={"max_chunks": "1", "kind": "multivector"},
        tokenizer_added=spec.parameters(),
        tokenizer_comment=(
            "The multi-vector model's spec (the token encoder's): markers, query length, mask."
        ),
        engine={**spec.parameters(), "max_response_bytes": str(max_response_bytes)},
        step_tokens={d: max(t, resolved_max_length) for d, t in STEP_TOKENS.items()},
    )
    return render_kind(MULTIVECTOR_TEMPLATES, options, parameters, kv_cache_bytes)
