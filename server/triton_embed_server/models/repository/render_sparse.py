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
from importlib import resources

from triton_embed_server.models.repository.copies import edit_text
from triton_embed_server.models.repository.names import LEGACY_NAME, step_names
from triton_embed_server.models.repository.render import DEFAULT_INSTANCES, ModelOptions
from triton_embed_server.models.repository.render import TEMPLATES as SHIPPED
from triton_embed_server.models.sparse_spec import SparseSpec

#: The sparse templates, package data of this package.
TEMPLATES = resources.files(__package__) / "templates" / "sparse"
#: The name the templates use for the ensemble (``splade``; steps ``splade_tokenizer``...).
TEMPLATE_NAME = "splade"
_GPU_VARIANT_HEADER = (
    "# GPU variant of the sparse encoder: tritonserver ... --model-config-name gpu\n"
)
_GPU_ONLY_HEADER = (
    "# Step 2 of the `{name}` ensemble: token IDs -> sparse vectors, vLLM pooling runner.\n"
    "# GPU variant (triton-embed repository add --device gpu); no CPU variant is written.\n"
)


def _retitle(text: str, old: str, name: str) -> str:
    first, _, rest = text.partition("\n")
    return first.replace(f"`{old}`", f"`{name}`", 1) + "\n" + rest


def _template(file: str, name: str) -> str:
    return _retitle((TEMPLATES / file).read_text("utf-8"), TEMPLATE_NAME, name)


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
    name = options.name
    tokenizer, encoder = step_names(name, "sparse")
    steps = {"model_path": model_path, "max_length": str(options.max_length)}
    ensemble = {
        "served_model_name": served_model_name,
        "vocab_size": str(spec.vocab_size),
        "max_length": str(resolved_max_length),
    }
    tokenizer_text = _retitle((SHIPPED / "tokenizer.pbtxt").read_text("utf-8"), LEGACY_NAME, name)
    tokenizer_params = {**steps, "max_chunks": "1", "kind": "sparse"}
    instances = options.instances or DEFAULT_INSTANCES[options.device]
    files = {
        f"{name}/config.pbtxt": edit_text(
            _template("ensemble.pbtxt", name),
            name=name,
            step_models=[tokenizer, encoder],
            parameters=ensemble,
        ),
        f"{name}/1/.gitkeep": "",
        f"{tokenizer}/config.pbtxt": edit_text(
            tokenizer_text, name=tokenizer, parameters=tokenizer_params
        ),
        f"{tokenizer}/1/model.py": (SHIPPED / "tokenizer_model.py.tmpl").read_text("utf-8"),
        f"{encoder}/1/model.py": _template("sparse_encoder_model.py.tmpl", name),
    }

    def encoder_config(text: str, count: int, **more: str) -> str:
        params = {**steps, **spec.parameters(), **more}
        text = edit_text(text, name=encoder, count=count, parameters=params)
        if kv_cache_bytes is None:
            return text
        return edit_text(text, parameters={"kv_cache_bytes": str(kv_cache_bytes(text))})

    dtype = {"dtype": options.dtype} if options.dtype else {}
    gpu = _template("sparse_encoder_gpu.pbtxt", name)
    if options.device == "gpu":
        text = _GPU_ONLY_HEADER.format(name=name) + gpu.removeprefix(_GPU_VARIANT_HEADER)
        files[f"{encoder}/config.pbtxt"] = encoder_config(text, instances, **dtype)
    else:
        cpu = _template("sparse_encoder_cpu.pbtxt", name)
        files[f"{encoder}/config.pbtxt"] = encoder_config(cpu, instances, **dtype)
        files[f"{encoder}/configs/gpu.pbtxt"] = encoder_config(gpu, DEFAULT_INSTANCES["gpu"])
    return {path: text.encode("utf-8") for path, text in sorted(files.items())}
