"""The files of one model of a kind with its own templates: reranker, sparse, multi-vector.

No such model ships in ``model_repository/``, so each kind's ensemble and engine step are
templates of this package (``templates/<kind>/``: the ensemble, the engine step's CPU config
plus its GPU variant, its ``model.py``); the tokenizer step is the kind's own template or the
shipped one. :func:`render_kind` sets, by key
(:func:`~triton_embed_server.models.repository.copies.edit_text`), the names, the steps'
parameters (``model_path``, ``max_length``, the model's spec), the engine step's instance
count, dtype, step size and ``kv_cache_bytes``, and the ensemble's parameters; the first
comment line of each template names the ensemble (``TEMPLATE_NAME`` there, ``name`` here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable

from triton_embed_server.models.repository.copies import add_parameters, edit_text
from triton_embed_server.models.repository.names import step_names
from triton_embed_server.models.repository.render import DEFAULT_INSTANCES, ModelOptions

#: This package's templates (package data).
TEMPLATES = resources.files(__package__) / "templates"


def retitle(text: str, old: str, name: str) -> str:
    """``text`` whose first line names the ensemble `name` where it named `old`."""
    first, _, rest = text.partition("\n")
    return first.replace(f"`{old}`", f"`{name}`", 1) + "\n" + rest


@dataclass(frozen=True)
class KindTemplates:
    """Where a kind's templates are and what they are called.

    Attributes:
        kind: the model kind (``reranker``, ``sparse``, ``multivector``): its step names.
        folder: the kind's template folder.
        template_name: the ensemble name the templates use (``rerank``, ``splade``...).
        engine: the engine step's template stem (``scorer``: ``scorer_cpu.pbtxt``,
            ``scorer_gpu.pbtxt``, ``scorer_model.py.tmpl``).
        gpu_only_header: the two comment lines of a GPU-only engine config (``{name}``: the
            ensemble), replacing the GPU variant's first line.
        tokenizer: the tokenizer step's ``(config, model.py)`` template files, and the
            ensemble name its first line uses; ``None``: the kind folder's ``pair_tokenizer``.
    """

    kind: str
    folder: Traversable
    template_name: str
    engine: str
    gpu_only_header: str
    tokenizer: tuple[Traversable, Traversable, str] | None = None

    def text(self, file: str, name: str) -> str:
        """A template of the kind's folder, its first line naming ``name``."""
        return retitle((self.folder / file).read_text("utf-8"), self.template_name, name)


@dataclass(frozen=True)
class KindParameters:
    """The parameters a kind writes into its three models.

    Attributes:
        steps: both steps' (``model_path``, ``max_length``, the spec where both read it).
        tokenizer: the tokenizer step's own.
        engine: the engine step's own (the spec where only it reads it).
        ensemble: the ensemble's (``served_model_name``, ``max_length``, the kind's facts).
        step_tokens: ``max_num_batched_tokens`` per device; empty: the templates'.
        tokenizer_added: parameters the tokenizer template lacks, appended to it (with the
            comment :attr:`tokenizer_comment`): the multi-vector spec the tokenizer reads.
    """

    steps: dict[str, str]
    ensemble: dict[str, str]
    tokenizer: dict[str, str] = field(default_factory=dict)
    engine: dict[str, str] = field(default_factory=dict)
    step_tokens: dict[str, int] = field(default_factory=dict)
    tokenizer_added: dict[str, str] = field(default_factory=dict)
    tokenizer_comment: str = ""


def render_kind(
    templates: KindTemplates,
    options: ModelOptions,
    parameters: KindParameters,
    kv_cache_bytes: Callable[[str], int] | None = None,
) -> dict[str, bytes]:
    """The files of one model's three models, without checking anything.

    Args:
        templates: the kind's templates.
        options: names, device, instances, dtype.
        parameters: what each model's ``parameters`` say.
        kv_cache_bytes: the engine step's ``kv_cache_bytes`` from its config text rendered
            with ``auto``; None: ``auto``.

    Returns:
        ``{path relative to the repository root, "/"-separated: UTF-8 bytes}``.
    """
    name = options.name
    tokenizer, engine = step_names(name, templates.kind)
    if templates.tokenizer is None:
        tokenizer_config = templates.text("pair_tokenizer.pbtxt", name)
        tokenizer_model = templates.text("pair_tokenizer_model.py.tmpl", name)
    else:
        config_file, model_file, old = templates.tokenizer
        tokenizer_config = retitle(config_file.read_text("utf-8"), old, name)
        tokenizer_model = model_file.read_text("utf-8")
    if parameters.tokenizer_added:
        tokenizer_config = add_parameters(
            tokenizer_config, parameters.tokenizer_added, parameters.tokenizer_comment
        )
    files = {
        f"{name}/config.pbtxt": edit_text(
            templates.text("ensemble.pbtxt", name),
            name=name,
            step_models=[tokenizer, engine],
            parameters=parameters.ensemble,
        ),
        f"{name}/1/.gitkeep": "",
        f"{tokenizer}/config.pbtxt": edit_text(
            tokenizer_config,
            name=tokenizer,
            parameters={**parameters.steps, **parameters.tokenizer},
        ),
        f"{tokenizer}/1/model.py": tokenizer_model,
        f"{engine}/1/model.py": templates.text(f"{templates.engine}_model.py.tmpl", name),
    }

    def engine_config(text: str, device: str, count: int, **more: str) -> str:
        params = {**parameters.steps, **parameters.engine, **more}
        if device in parameters.step_tokens:
            params["max_num_batched_tokens"] = str(parameters.step_tokens[device])
        text = edit_text(text, name=engine, count=count, parameters=params)
        if kv_cache_bytes is None:
            return text
        return edit_text(text, parameters={"kv_cache_bytes": str(kv_cache_bytes(text))})

    instances = options.instances or DEFAULT_INSTANCES[options.device]
    dtype = {"dtype": options.dtype} if options.dtype else {}
    gpu = templates.text(f"{templates.engine}_gpu.pbtxt", name)
    if options.device == "gpu":
        header = templates.gpu_only_header.format(name=name)
        text = header + gpu.partition("\n")[2]
        files[f"{engine}/config.pbtxt"] = engine_config(text, "gpu", instances, **dtype)
    else:
        cpu = templates.text(f"{templates.engine}_cpu.pbtxt", name)
        files[f"{engine}/config.pbtxt"] = engine_config(cpu, "cpu", instances, **dtype)
        files[f"{engine}/configs/gpu.pbtxt"] = engine_config(gpu, "gpu", DEFAULT_INSTANCES["gpu"])
    return {path: text.encode("utf-8") for path, text in sorted(files.items())}
