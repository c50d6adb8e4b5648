"""The files of one embedding model's three Triton models, from the shipped ones.

The shipped ``model_repository/`` files are the one text: ``templates/`` in this package
holds links to them (package data), and :func:`render` sets, by key, what differs between
models (:func:`~triton_embed_server.models.repository.copies.edit_text`): the model names, the
ensemble's step names, ``model_path`` and ``max_length`` (both steps), the embedder's instance
count, its spec (:meth:`~triton_embed_server.models.spec.ModelSpec.parameters`) and
``kv_cache_bytes``, its CPU engine limits (the :class:`~triton_embed_server.steps.config.
EmbedderConfig` field defaults), ``max_chunks`` of both steps, and the first comment line.
A unit test renders ``embed`` with the defaults and compares it with the shipped files byte
for byte (tests/unit/test_repository_gen.py): it holds the shipped values to the code's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from importlib import resources

from triton_embed_server.models.repository.copies import edit_text
from triton_embed_server.models.repository.names import LEGACY_NAME, step_names
from triton_embed_server.models.spec import ModelSpec
from triton_embed_server.steps.config import DEFAULT_MAX_CHUNKS, EmbedderConfig

DEVICES = ("cpu", "gpu")
#: The engine dtypes ``repository add --dtype`` writes, per device. float16 is for GPUs:
#: CPUs multiply bfloat16 in hardware (AVX512_BF16, AMX) but not float16.
DTYPES = {"cpu": ("float32", "bfloat16"), "gpu": ("float16", "bfloat16", "float32")}
#: Embedder instances per device when none is asked for: the shipped configs' counts.
DEFAULT_INSTANCES = {"cpu": 2, "gpu": 4}
#: Links to the shipped ``model_repository`` files, package data of this package.
TEMPLATES = resources.files(__package__) / "templates"
#: The CPU embedder's engine limits, set from the config's field defaults.
CPU_ENGINE_DEFAULTS = (
    "dtype",
    "gpu_memory_utilization",
    "max_num_seqs",
    "threads_bind",
    "numa_placement",
)
#: Tokens per engine step of the CPU engine steps (``max_num_batched_tokens``; ``max_length``
#: when that is larger): vLLM's own CPU default. One 16,384-token step of 64 texts (or pairs)
#: of 256 tokens ran 9-23% slower per token than four of 4,096 here (bfloat16 embedder and
#: float32 cross-encoder, in-process engines, alternating; docs/configuration.md).
CPU_STEP_TOKENS = 4096

# The first line of the shipped GPU config (the variant next to the CPU config), and what
# replaces it in a model's one config (``device="gpu"``).
_GPU_VARIANT_HEADER = "# GPU variant of the embedder: tritonserver ... --model-config-name gpu\n"
_GPU_ONLY_HEADER = (
    "# Step 2 of the `{name}` ensemble: token IDs -> embeddings, vLLM pooling runner in-process.\n"
    "# GPU variant (triton-embed repository add --device gpu); no CPU variant is written.\n"
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
        dtype: the engine's dtype (:data:`DTYPES` of ``device``) in the device's config;
            ``""``: the shipped config's (float32 on CPU, float16 on GPU). The GPU variant
            next to a CPU config keeps float16.
        kind: ``embedding``, ``reranker``, ``sparse``, ``multivector`` or ``""``: what the
            folder is (a ``*ForSequenceClassification`` folder is a reranker, a SPLADE folder
            a sparse model, a ColBERT folder a multi-vector model, anything else an embedding
            model); ``reranker`` on a causal LM serves it as a decoder reranker,
            ``multivector`` on an embedding model serves its token embeddings.
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
    dtype: str = ""
    kind: str = ""


def _shipped(file: str) -> str:
    return (TEMPLATES / file).read_text("utf-8")


def _retitle(text: str, name: str) -> str:
    """The first comment line's ensemble name (the shipped text says `embed`)."""
    first, _, rest = text.partition("\n")
    return first.replace(f"`{LEGACY_NAME}`", f"`{name}`", 1) + "\n" + rest


def _render_value(value: object) -> str:
    """A config field default as its parameter text (``0.2``, ``16384``, ``spread``)."""
    return str(value)


def render(
    options: ModelOptions,
    model_path: str,
    spec: ModelSpec,
    *,
    served_model_name: str = "",
    resolved_max_length: int = 0,
    kv_cache_bytes: Callable[[str], int] | None = None,
) -> dict[str, bytes]:
    """The files of the three models, without checking anything.

    Args:
        options: names, device, instances, lengths.
        model_path: the ``model_path`` parameter of both steps, as it is to be written.
        spec: the model's spec with the operator's overrides: the embedder's spec parameters
            and the ensemble's ``dimension``.
        served_model_name: the ensemble's ``served_model_name`` parameter.
        resolved_max_length: the token budget in force (the ensemble's ``max_length``).
        kv_cache_bytes: the embedder's ``kv_cache_bytes`` parameter from its config text
            rendered with ``auto`` (the limits are the shipped text's); None: ``auto``.

    Returns:
        ``{path relative to the repository root, "/"-separated: UTF-8 bytes}``.
    """
    name = options.name
    tokenizer, embedder = step_names(name)
    steps = {
        "model_path": model_path,
        "max_length": str(options.max_length),
        "max_chunks": str(options.max_chunks),
    }
    ensemble = {
        "served_model_name": served_model_name,
        "dimension": str(spec.dimension),
        "max_length": str(resolved_max_length),
    }
    defaults = {f.name: f.default for f in fields(EmbedderConfig)}
    cpu = {key: _render_value(defaults[key]) for key in CPU_ENGINE_DEFAULTS}
    instances = options.instances or DEFAULT_INSTANCES[options.device]
    files = {
        f"{name}/config.pbtxt": edit_text(
            _shipped("ensemble.pbtxt"),
            name=name,
            step_models=[tokenizer, embedder],
            parameters=ensemble,
        ),
        f"{name}/1/.gitkeep": "",
        f"{tokenizer}/config.pbtxt": edit_text(
            _retitle(_shipped("tokenizer.pbtxt"), name), name=tokenizer, parameters=steps
        ),
        f"{tokenizer}/1/model.py": _shipped("tokenizer_model.py.tmpl"),
        f"{embedder}/1/model.py": _shipped("embedder_model.py.tmpl"),
    }

    def embedder_config(text: str, count: int, **more: str) -> str:
        params = {**steps, **spec.parameters(), **more, "kv_cache_bytes": "auto"}
        text = edit_text(text, name=embedder, count=count, parameters=params)
        if kv_cache_bytes is None:
            return text
        return edit_text(text, parameters={"kv_cache_bytes": str(kv_cache_bytes(text))})

    gpu = _shipped("embedder_gpu.pbtxt")
    if options.device == "gpu":
        text = _GPU_ONLY_HEADER.format(name=name) + gpu.removeprefix(_GPU_VARIANT_HEADER)
        dtype = {"dtype": options.dtype} if options.dtype else {}
        files[f"{embedder}/config.pbtxt"] = embedder_config(text, instances, **dtype)
    else:
        text = _retitle(_shipped("embedder_cpu.pbtxt"), name)
        cpu["dtype"] = options.dtype or cpu["dtype"]
        cpu["max_num_batched_tokens"] = str(max(CPU_STEP_TOKENS, resolved_max_length))
        files[f"{embedder}/config.pbtxt"] = embedder_config(text, instances, **cpu)
        files[f"{embedder}/configs/gpu.pbtxt"] = embedder_config(gpu, DEFAULT_INSTANCES["gpu"])
    return {path: text.encode("utf-8") for path, text in sorted(files.items())}
