"""The one reader of a model folder: what it says about its embeddings and its length.

Read by ``triton-embed repository add`` (which writes the result into the embedder's config),
by ``repository list``, by the tokenizer step (prompts, length) and by the embedder step only
when its config leaves the spec empty (:mod:`triton_embed_server.models.spec`).

The sources are the files sentence-transformers itself reads (its ``SentenceTransformer``
loader, v2 to v5 formats):

* ``modules.json``: the module pipeline. Supported: one ``Transformer`` (path ``""``), one
  ``Pooling``, optionally one ``Normalize``. A ``Dense`` or any other module is refused
  (vLLM's pooling runner does not apply it, so the vectors would be wrong).
* ``<Pooling path>/config.json``: ``pooling_mode`` (v5: ``"mean"``, ``"cls"``, ``"lasttoken"``)
  or the legacy flags ``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``,
  ``pooling_mode_lasttoken``; ``include_prompt`` (default true); ``word_embedding_dimension``.
* ``config_sentence_transformers.json``: ``prompts`` (name -> text prepended to the input)
  and ``default_prompt_name``.
* ``config.json``: the hidden size (``hidden_size``, or ``d_model``, ``n_embd``, ``dim`` by
  model family), the Matryoshka dimensions where declared the way vLLM reads them
  (``matryoshka_dimensions``; ``is_matryoshka: true`` alone allows any dimension), and
  ``max_position_embeddings``.
* ``sentence_bert_config.json`` ``max_seq_length`` and ``tokenizer_config.json``
  ``model_max_length``: the model's own token budget (:func:`model_max_length`).
* ``tokenizer.json``: a fast tokenizer must be there (the tokenizer step needs it).

A folder without ``modules.json`` (a plain Hugging Face folder) has no stated pooling: the
operator gives it (``repository add --pooling``, the ``pooling`` model parameter), otherwise
:class:`ModelFolderError` says so. Every error is one line naming the file and what is wrong.

One error policy, :func:`read_json`: a file that must be there and is missing, or any file
that is there but is not a JSON object, is a :class:`ModelFolderError` naming the file. The
one tolerated case, kept as it always was: the two length hints (``sentence_bert_config.json``,
``tokenizer_config.json``) are skipped when unreadable, and the next source of the length is
used (:data:`HINT`).
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

from triton_embed_server.models.spec import (
    ModelFolderError,
    ModelSpec,
    PromptSpec,
    SpecParameters,
    int_list,
)
from triton_embed_server.steps.vectors import Dimensions, Pooling

# Legacy Pooling config flags (sentence-transformers < 5) and the pooling each selects.
_LEGACY_FLAGS = {
    "pooling_mode_mean_tokens": Pooling.MEAN,
    "pooling_mode_cls_token": Pooling.CLS,
    "pooling_mode_lasttoken": Pooling.LASTTOKEN,
}
_UNSUPPORTED_FLAGS = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)


class Need(enum.Enum):
    """How :func:`read_json` treats a file that is missing or unreadable."""

    #: Missing or unreadable: :class:`ModelFolderError`.
    REQUIRED = "required"
    #: Missing: ``{}``; there but unreadable: :class:`ModelFolderError`.
    OPTIONAL = "optional"
    #: Missing or unreadable: ``{}`` (the length hints only, as they always were).
    HINT = "hint"


#: The tolerated case of the error policy (see the module docstring).
HINT = Need.HINT


def read_json(path: Path, need: Need, kind: type = dict) -> Any:
    """One JSON file of a model folder, by the one error policy of this module.

    Args:
        path: the file.
        need: what a missing or unreadable file means (:class:`Need`).
        kind: ``dict`` (a JSON object) or ``list`` (``modules.json``).

    Returns:
        The parsed value; ``kind()`` (empty) for a missing optional file or a skipped hint.

    Raises:
        ModelFolderError: the file is required and missing, or it is there and is not valid
            JSON of ``kind`` (unless ``need`` is :data:`HINT`); the message names the file.
    """
    if not path.is_file():
        if need is Need.REQUIRED:
            raise ModelFolderError(f"{path}: missing")
        return kind()
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        if need is Need.HINT:
            return kind()
        raise ModelFolderError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(value, kind):
        if need is Need.HINT:
            return kind()
        what = "a JSON object" if kind is dict else "a list of module objects"
        raise ModelFolderError(f"{path}: expected {what}, got {type(value).__name__}")
    return value


def architectures(config: dict[str, Any]) -> list[str]:
    """The ``architectures`` a ``config.json`` names (``[]`` when absent or not a list)."""
    found = config.get("architectures") or []
    return [str(a) for a in found] if isinstance(found, list) else []


def require_fast_tokenizer(path: Path) -> None:
    """Refuse a model folder without ``tokenizer.json``: every tokenizer step needs one.

    Raises:
        ModelFolderError: names the file and how to write it.
    """
    if not (Path(path) / "tokenizer.json").is_file():
        raise ModelFolderError(
            f"{Path(path) / 'tokenizer.json'}: missing; the tokenizer step needs a fast "
            "tokenizer (save it with transformers' AutoTokenizer.save_pretrained)"
        )


def module_kinds(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(class name, module entry)`` of each ``modules.json`` entry; ``[]`` without one.

    Raises:
        ModelFolderError: ``modules.json`` is there and is not a list of objects.
    """
    value = read_json(Path(path) / "modules.json", Need.OPTIONAL, list)
    if not all(isinstance(m, dict) for m in value):
        raise ModelFolderError(f"{Path(path) / 'modules.json'}: expected a list of module objects")
    return [(str(m.get("type", "")).rsplit(".", 1)[-1], m) for m in value]


def read_model_spec(
    path: Path,
    given: SpecParameters | None = None,
    *,
    pooling: str = "",
    normalize: str = "",
    dimensions: str = "",
) -> ModelSpec:
    """Read a model folder's embedding spec, with the operator's overrides.

    Args:
        path: a local model folder (``config.json``, ``tokenizer.json``, weights).
        given: overrides already parsed (an embedder config's spec parameters); set fields
            win over the folder.
        pooling: text override: ``""`` (the folder's ``Pooling`` module), or
            ``mean``/``cls``/``lasttoken``.
        normalize: text override: ``""`` (the folder: a ``Normalize`` module or not; ``true``
            without sentence-transformers files), ``true`` or ``false``.
        dimensions: text override: ``""`` (the folder's ``config.json``), ``any``, or a
            comma-separated list of allowed shorter dimensions, e.g. ``"64,128,256"``.

    Raises:
        ModelFolderError: a file is missing, unreadable or states something unsupported,
            or no pooling is stated anywhere (one line, naming the file).
        ValueError: an override is malformed (names the option).
    """
    if given is None:
        text = {"pooling": pooling, "normalize": normalize, "dimensions": dimensions}
        given = SpecParameters.parse(text)
    path = Path(path)
    config = read_json(path / "config.json", Need.REQUIRED)
    if not (path / "tokenizer.json").is_file():
        raise ModelFolderError(
            f"{path / 'tokenizer.json'}: missing; the tokenizer step needs a fast (Rust) "
            "tokenizer file (save one with AutoTokenizer.from_pretrained(...).save_pretrained)"
        )
    pooling_file, pooling_config, normalize_module = _pooling_module(path)
    if given.pooling is not None:
        chosen = given.pooling
    elif pooling_file is not None:
        chosen = _pooling_from_config(pooling_file, pooling_config)
    else:
        raise ModelFolderError(
            f"{path / 'modules.json'}: missing, so the folder states no pooling; give one "
            "(repository add --pooling mean|cls|lasttoken, or the pooling model parameter)"
        )
    dimension = given.dimension or _dimension(path, config, pooling_config)
    folder = ModelSpec(
        path=path,
        pooling=chosen,
        prompting=_prompting(path, pooling_config),
        normalize=normalize_module or pooling_file is None,
        dimensions=_matryoshka(path, config, dimension),
        max_length=given.model_max_length or model_max_length(path, config),
    )
    return given.over(folder)


def read_prompt_spec(path: Path) -> PromptSpec:
    """Read a model folder's prompts and ``include_prompt`` (no pooling needed).

    A sparse model's folder (a ``SpladePooling`` module) includes the prompt: its pooling
    takes every token (:mod:`triton_embed_server.models.sparse_spec`).

    Raises:
        ModelFolderError: as :func:`read_model_spec`, for these files.
    """
    path = Path(path)
    modules = _modules(path) or []
    if any(str(m.get("type", "")).rsplit(".", 1)[-1] == "SpladePooling" for m in modules):
        return _prompting(path, {})  # a sparse model's SpladePooling pools every token
    _, pooling_config, _ = _pooling_module(path)
    return _prompting(path, pooling_config)


def model_max_length(path: Path, config: dict[str, Any] | None = None) -> int:
    """The number of tokens (special tokens included) the model is meant to read.

    Order of precedence, the same sentence-transformers uses: ``max_seq_length`` of
    ``sentence_bert_config.json`` (256 for all-MiniLM-L6-v2), then the tokenizer's
    ``model_max_length`` when it is a real value, then ``max_position_embeddings``.

    Args:
        path: the model folder.
        config: its ``config.json``, when already read.

    Raises:
        ModelFolderError: none of the three is present, or ``config.json`` is unreadable.
    """
    st = read_json(path / "sentence_bert_config.json", HINT).get("max_seq_length")
    if _positive(st):
        return st
    tok = read_json(path / "tokenizer_config.json", HINT).get("model_max_length")
    if _positive(tok) and tok < 1_000_000:
        return tok
    if config is None:
        config = read_json(path / "config.json", Need.REQUIRED)
    pos = config.get("max_position_embeddings")
    if _positive(pos):
        return pos
    raise ModelFolderError(
        f"{path}: cannot tell the model's maximum length (no sentence_bert_config.json "
        "max_seq_length, tokenizer model_max_length or max_position_embeddings); set the "
        "max_length parameter"
    )


def embedding_dimension(path: Path) -> int:
    """The full vector length the folder states, without the rest of the spec.

    The Pooling module's ``word_embedding_dimension``, else the hidden size of
    ``config.json`` (what :func:`read_model_spec` computes; for all-MiniLM-L6-v2, 384).

    Raises:
        ModelFolderError: neither is present, or a file is unreadable (names the file).
    """
    path = Path(path)
    _, pooling_config, _ = _pooling_module(path)
    return _dimension(path, read_json(path / "config.json", Need.REQUIRED), pooling_config)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _prompting(path: Path, pooling_config: dict[str, Any]) -> PromptSpec:
    where = path / "config_sentence_transformers.json"
    st_config = read_json(where, Need.OPTIONAL)
    prompts = st_config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ModelFolderError(f"{where}: prompts must be an object of name -> text")
    default_name = st_config.get("default_prompt_name")
    if default_name is not None and default_name not in prompts:
        raise ModelFolderError(
            f"{where}: default_prompt_name {default_name!r} is not one of its prompts"
        )
    return PromptSpec(
        prompts=dict(prompts),
        default_prompt_name=default_name,
        include_prompt=bool(pooling_config.get("include_prompt", True)),
    )


def _pooling_module(path: Path) -> tuple[Path | None, dict[str, Any], bool]:
    """(the Pooling module's config file, its content, a Normalize module follows).

    ``(None, {}, False)`` for a folder without ``modules.json``.
    """
    modules = _modules(path)
    if modules is None:
        return None, {}, False
    pooling_dir, normalize = _pipeline(path, modules)
    file = pooling_dir / "config.json"
    return file, read_json(file, Need.REQUIRED), normalize


def _modules(path: Path) -> list[dict[str, Any]] | None:
    file = path / "modules.json"
    if not file.is_file():
        return None
    value = read_json(file, Need.REQUIRED, list)
    if not all(isinstance(m, dict) for m in value):
        raise ModelFolderError(f"{file}: expected a list of module objects")
    return value


def _pipeline(path: Path, modules: list[dict[str, Any]]) -> tuple[Path, bool]:
    """The Pooling module's folder and whether a Normalize module follows; refuse the rest."""
    file = path / "modules.json"
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unsupported = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if unsupported:
        raise ModelFolderError(
            f"{file}: module {unsupported[0]!r} is not supported (served: Transformer, "
            "Pooling, Normalize); the vectors would differ from the model's"
        )
    if kinds.count("Pooling") != 1:
        raise ModelFolderError(
            f"{file}: expected one Pooling module, found {kinds.count('Pooling')}"
        )
    pooling = modules[kinds.index("Pooling")]
    return path / str(pooling.get("path", "")), "Normalize" in kinds


def _pooling_from_config(file: Path, config: dict[str, Any]) -> Pooling:
    mode = config.get("pooling_mode")
    if isinstance(mode, str):
        try:
            return Pooling.parse(mode, f"{file}: pooling_mode")
        except ValueError as exc:
            raise ModelFolderError(f"{exc}; other poolings are not supported") from None
    chosen = [p for flag, p in _LEGACY_FLAGS.items() if config.get(flag)]
    other = [flag for flag in _UNSUPPORTED_FLAGS if config.get(flag)]
    if other or len(chosen) != 1:
        found = ", ".join([*(f for f in _LEGACY_FLAGS if config.get(f)), *other]) or "none"
        raise ModelFolderError(
            f"{file}: exactly one of pooling_mode_mean_tokens, pooling_mode_cls_token, "
            f"pooling_mode_lasttoken must be true (found: {found})"
        )
    return chosen[0]


# config.json keys that hold the width of a transformer's hidden states, by model family
# (BERT/RoBERTa/most: hidden_size; T5: d_model; GPT-2: n_embd; DistilBERT: dim).
_HIDDEN_SIZE_KEYS = ("hidden_size", "d_model", "n_embd", "dim")


def _dimension(path: Path, config: dict[str, Any], pooling_config: dict[str, Any]) -> int:
    """The Pooling module's ``word_embedding_dimension``, else the hidden size."""
    found = [pooling_config.get("word_embedding_dimension")]
    found += [config.get(key) for key in _HIDDEN_SIZE_KEYS]
    for value in found:
        if _positive(value):
            return value
    raise ModelFolderError(
        f"{path / 'config.json'}: no hidden_size (nor d_model, n_embd, dim; and no Pooling "
        "word_embedding_dimension): cannot tell the embedding dimension"
    )


def _matryoshka(path: Path, config: dict[str, Any], dimension: int) -> Dimensions:
    """The dimensions ``config.json`` declares (``matryoshka_dimensions``, ``is_matryoshka``)."""
    declared = config.get("matryoshka_dimensions")
    if declared is not None:
        where = f"{path / 'config.json'}: matryoshka_dimensions"
        if not isinstance(declared, list):
            raise ModelFolderError(f"{where} must be a list")
        try:
            return Dimensions.of(dimension, int_list(declared, where), where)
        except ValueError as exc:
            raise ModelFolderError(str(exc)) from None
    return Dimensions(dimension, (), bool(config.get("is_matryoshka", False)))


def quantization_of(folder: Path) -> str:
    """``int8`` for a compressed-tensors int8 folder (``triton-embed quantize``), else ``none``.

    Read from ``config.json``'s ``quantization_config`` (its ``quant_method``); a folder
    without a readable ``config.json`` is ``none``.
    """
    config = read_json(Path(folder) / "config.json", Need.HINT)
    q = config.get("quantization_config") or {}
    return (
        "int8" if isinstance(q, dict) and q.get("quant_method") == "compressed-tensors" else "none"
    )
