"""The files of one embedding model's three Triton models, from the templates.

The templates (``triton_embed_server/models/repository/templates/``) are the shipped
``model_repository/``
files with :mod:`string.Template` placeholders for what differs between models: the model
names, ``model_path`` and ``max_length`` (both steps), the embedder's instance count, its
``pooling`` / ``normalize`` / ``dimensions`` and ``kv_cache_bytes``, the tokenizer's
``max_chunks``, and the step kind in ``model.py``. The shipped files stay the source of the
text: a unit test renders ``embed`` with the defaults and compares it with them byte for
byte (tests/unit/test_repository_gen.py).
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from triton_embed_server.models.repository.copies import _escape
from triton_embed_server.models.repository.names import step_names

DEVICES = ("cpu", "gpu")
#: Embedder instances per device when none is asked for: the shipped configs' counts.
DEFAULT_INSTANCES = {"cpu": 2, "gpu": 4}
DEFAULT_MAX_CHUNKS = 16
#: The template files, package data of this package.
TEMPLATES = resources.files(__package__) / "templates"

# The first line of the GPU template: the variant next to the CPU config (the shipped text),
# or the model's one config (``device="gpu"``).
_GPU_VARIANT_HEADER = "# GPU variant of the embedder: tritonserver ... --model-config-name gpu"
_GPU_ONLY_HEADER = (
    "# Step 2 of the `{name}` ensemble: token IDs -> embeddings, vLLM pooling runner in-process.\n"
    "# GPU variant (triton-embed repository add --device gpu); no CPU variant is written."
)


@dataclass(frozen=True)
class ModelOptions:
    """What ``repository add`` writes for one embedding model.

    Attributes:
        name: the ensemble's name (``NAME_PATTERN``, at most ``MAX_NAME_CHARS`` characters).
        model: the model folder: ``pkg://<package>/<subdir>`` (written as is) or a path
            (written absolute).
        device: ``cpu`` (``config.pbtxt`` for CPUs plus ``configs/gpu.pbtxt``) or ``gpu``
            (``config.pbtxt`` for GPUs only).
        instances: embedder instances (per GPU with ``gpu``); ``None``: 2 on CPU, 4 per GPU.
        max_length: token budget per text; 0 = the model's own limit (no larger allowed).
        pooling: ``""`` (what the folder states), ``mean``, ``cls`` or ``lasttoken``.
        normalize: ``None`` (what the folder states), or L2-normalize or not.
        dimensions: ``""`` (the folder's ``config.json``), ``any`` or a list such as
            ``"64,128"``: the dimensions a request may ask for.
        max_chunks: the most windows one text is cut into with ``truncation=CHUNK``.
        served_model_name: the other name clients may use for the ensemble (OpenAI's
            ``model``, e.g. the Hugging Face id); ``""``: the model folder's name.
    """

    name: str
    model: str
    device: str = "cpu"
    instances: int | None = None
    max_length: int = 0
    pooling: str = ""
    normalize: bool | None = None
    dimensions: str = ""
    max_chunks: int = DEFAULT_MAX_CHUNKS
    served_model_name: str = ""


def _template(file: str) -> string.Template:
    return string.Template((TEMPLATES / file).read_text("utf-8"))


def render(
    options: ModelOptions,
    model_path: str,
    *,
    pooling: str = "",
    normalize: str = "",
    dimensions: str = "",
    served_model_name: str = "",
    dimension: int = 0,
    resolved_max_length: int = 0,
    kv_cache_bytes: Callable[[str], int] | None = None,
) -> dict[str, bytes]:
    """The files of the three models, without checking anything.

    Args:
        options: names, device, instances, lengths.
        model_path: the ``model_path`` parameter of both steps, as it is to be written.
        pooling: the embedder's ``pooling`` parameter (``""``: the folder's).
        normalize: its ``normalize`` parameter (``""``, ``true``, ``false``).
        dimensions: its ``dimensions`` parameter (``""``, ``any``, ``64,128``).
        served_model_name: the ensemble's ``served_model_name`` parameter.
        dimension: the full vector length (the ensemble's ``dimension`` parameter).
        resolved_max_length: the token budget in force (the ensemble's ``max_length``).
        kv_cache_bytes: the embedder's ``kv_cache_bytes`` parameter from its config text
            rendered with ``auto`` (the limits are the template's); None: ``auto`` is written.

    Returns:
        ``{path relative to the repository root, "/"-separated: UTF-8 bytes}``.
    """
    name = options.name
    tokenizer, embedder = step_names(name)
    common = {
        "name": name,
        "tokenizer_name": tokenizer,
        "embedder_name": embedder,
        "model_path": _escape(model_path),
        "max_length": str(options.max_length),
        "pooling": pooling,
        "normalize": normalize,
        "dimensions": dimensions,
        "max_chunks": str(options.max_chunks),
        "served_model_name": _escape(served_model_name),
        "dimension": str(dimension),
        "resolved_max_length": str(resolved_max_length),
    }
    instances = options.instances or DEFAULT_INSTANCES[options.device]
    gpu = _template("embedder_gpu.pbtxt")
    files = {
        f"{name}/config.pbtxt": _template("ensemble.pbtxt").substitute(common),
        f"{name}/1/.gitkeep": "",
        f"{tokenizer}/config.pbtxt": _template("tokenizer.pbtxt").substitute(common),
        f"{tokenizer}/1/model.py": _template("model.py.tmpl").substitute(step="tokenizer"),
        f"{embedder}/1/model.py": _template("model.py.tmpl").substitute(step="embedder"),
    }

    def embedder_config(template: string.Template, **values: object) -> str:
        text = template.substitute(common, kv_cache_bytes="auto", **values)
        if kv_cache_bytes is None:
            return text
        return template.substitute(common, kv_cache_bytes=str(kv_cache_bytes(text)), **values)

    if options.device == "gpu":
        header = _GPU_ONLY_HEADER.format(name=name)
        files[f"{embedder}/config.pbtxt"] = embedder_config(gpu, instances=instances, header=header)
    else:
        files[f"{embedder}/config.pbtxt"] = embedder_config(
            _template("embedder_cpu.pbtxt"), instances=instances
        )
        files[f"{embedder}/configs/gpu.pbtxt"] = embedder_config(
            gpu, instances=DEFAULT_INSTANCES["gpu"], header=_GPU_VARIANT_HEADER
        )
    return {path: text.encode("utf-8") for path, text in sorted(files.items())}
