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
from importlib import resources

from triton_embed_server.models.repository.copies import edit_text
from triton_embed_server.models.repository.names import step_names
from triton_embed_server.models.repository.render import (
    CPU_STEP_TOKENS,
    DEFAULT_INSTANCES,
    ModelOptions,
)
from triton_embed_server.models.reranker_spec import RerankerSpec

#: The reranker templates, package data of this package.
TEMPLATES = resources.files(__package__) / "templates" / "reranker"
#: The name the templates use for the ensemble (``rerank``; steps ``rerank_tokenizer``...).
TEMPLATE_NAME = "rerank"
_GPU_VARIANT_HEADER = "# GPU variant of the scorer: tritonserver ... --model-config-name gpu\n"
_GPU_ONLY_HEADER = (
    "# Step 2 of the `{name}` ensemble: token IDs of pairs -> scores, vLLM pooling runner.\n"
    "# GPU variant (triton-embed repository add --device gpu); no CPU variant is written.\n"
)


def _template(file: str, name: str) -> str:
    text = (TEMPLATES / file).read_text("utf-8")
    first, _, rest = text.partition("\n")
    return first.replace(f"`{TEMPLATE_NAME}`", f"`{name}`", 1) + "\n" + rest


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
    name = options.name
    tokenizer, scorer = step_names(name, "reranker")
    steps = {
        "model_path": model_path,
        "max_length": str(options.max_length),
        **spec.parameters(),
    }
    ensemble = {
        "served_model_name": served_model_name,
        "family": spec.family.value,
        "max_length": str(resolved_max_length),
    }
    instances = options.instances or DEFAULT_INSTANCES[options.device]
    files = {
        f"{name}/config.pbtxt": edit_text(
            _template("ensemble.pbtxt", name),
            name=name,
            step_models=[tokenizer, scorer],
            parameters=ensemble,
        ),
        f"{name}/1/.gitkeep": "",
        f"{tokenizer}/config.pbtxt": edit_text(
            _template("pair_tokenizer.pbtxt", name), name=tokenizer, parameters=steps
        ),
        f"{tokenizer}/1/model.py": _template("pair_tokenizer_model.py.tmpl", name),
        f"{scorer}/1/model.py": _template("scorer_model.py.tmpl", name),
    }

    def scorer_config(text: str, count: int, **more: str) -> str:
        text = edit_text(text, name=scorer, count=count, parameters={**steps, **more})
        if kv_cache_bytes is None:
            return text
        return edit_text(text, parameters={"kv_cache_bytes": str(kv_cache_bytes(text))})

    dtype = {"dtype": options.dtype} if options.dtype else {}
    gpu = _template("scorer_gpu.pbtxt", name)
    # One full-length pair must fit in an engine step: the templates' step, or max_length.
    steps_of = {
        device: {"max_num_batched_tokens": str(max(tokens, resolved_max_length))}
        for device, tokens in SCORER_STEP_TOKENS.items()
    }
    if options.device == "gpu":
        text = _GPU_ONLY_HEADER.format(name=name) + gpu.removeprefix(_GPU_VARIANT_HEADER)
        files[f"{scorer}/config.pbtxt"] = scorer_config(text, instances, **dtype, **steps_of["gpu"])
    else:
        cpu = _template("scorer_cpu.pbtxt", name)
        files[f"{scorer}/config.pbtxt"] = scorer_config(cpu, instances, **dtype, **steps_of["cpu"])
        files[f"{scorer}/configs/gpu.pbtxt"] = scorer_config(
            gpu, DEFAULT_INSTANCES["gpu"], **steps_of["gpu"]
        )
    return {path: text.encode("utf-8") for path, text in sorted(files.items())}
