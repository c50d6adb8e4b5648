"""The files of one reranker's three Triton models, from this package's reranker templates.

No reranker ships in ``model_repository/`` (no reranker checkpoint ships in a package), so
the templates are files of this package (``templates/reranker/``): the ensemble (``QUERY``,
``DOCUMENT`` -> ``SCORE``, ``NUM_TOKENS``; docs/rerank.md), the pair tokenizer step and the
scorer step (CPU config plus its GPU variant, or the GPU config alone). :func:`render_reranker`
sets, by key (:func:`~triton_embed_server.models.repository.copies.edit_text`), the names,
``model_path`` and ``max_length`` of both steps, the reranker's spec (family, architecture,
activation, segments, the model's own token budget) in both, the scorer's instance count,
dtype and ``kv_cache_bytes``, and the ensemble's kind, family, served name and budget.
"""

from __future__ import annotations

from collections.abc import Callable

from triton_embed_server.models.repository.render import CPU_STEP_TOKENS, ModelOptions
from triton_embed_server.models.repository.render_kind import (
    TEMPLATES as KIND_TEMPLATES,
)
from triton_embed_server.models.repository.render_kind import (
    KindParameters,
    KindTemplates,
    render_kind,
)
from triton_embed_server.models.reranker_spec import RerankerSpec

#: The reranker templates, package data of this package.
TEMPLATES = KIND_TEMPLATES / "reranker"
#: The name the templates use for the ensemble (``rerank``; steps ``rerank_tokenizer``...).
TEMPLATE_NAME = "rerank"
RERANKER_TEMPLATES = KindTemplates(
    kind="reranker",
    folder=TEMPLATES,
    template_name=TEMPLATE_NAME,
    engine="scorer",
    gpu_only_header=(
        "# Step 2 of the `{name}` ensemble: token IDs of pairs -> scores, vLLM pooling runner.\n"
        "# GPU variant (triton-embed repository add --device gpu); no CPU variant is written.\n"
    ),
)

#: The scorer templates' ``max_num_batched_tokens`` per device (tokens per engine step).
SCORER_STEP_TOKENS = {"cpu": CPU_STEP_TOKENS, "gpu": 16384}


def render_reranker(
    options: ModelOptions,
    model_path: str,
    spec: RerankerSpec,
    *,
    served_model_name: str,
    resolved_max_length: int,
    kv_cache_bytes: Callable[[str], int] | None = None,
) -> dict[str, bytes]:
    """The files of a reranker's three models, without checking anything.

    Args:
        options: names, device, instances, ``max_length`` (0: the model's own), dtype.
        model_path: the ``model_path`` parameter of both steps, as it is to be written.
        spec: the reranker's facts (:func:`~triton_embed_server.models.reranker_spec.
            read_reranker_spec`).
        served_model_name: the ensemble's ``served_model_name`` parameter.
        resolved_max_length: the token budget per pair in force (the ensemble's ``max_length``).
        kv_cache_bytes: the scorer's ``kv_cache_bytes`` from its config text rendered with
            ``auto``; None: ``auto``.

    Returns:
        ``{path relative to the repository root, "/"-separated: UTF-8 bytes}``.
    """
    parameters = KindParameters(
        steps={
            "model_path": model_path,
            "max_length": str(options.max_length),
            **spec.parameters(),
        },
        ensemble={
            "served_model_name": served_model_name,
            "family": spec.family.value,
            "max_length": str(resolved_max_length),
        },
        # One full-length pair must fit in an engine step: the templates' step, or max_length.
        step_tokens={
            device: max(tokens, resolved_max_length)
            for device, tokens in SCORER_STEP_TOKENS.items()
        },
    )
    return render_kind(RERANKER_TEMPLATES, options, parameters, kv_cache_bytes)
