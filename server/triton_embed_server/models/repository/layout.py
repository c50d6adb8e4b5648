"""Which folders of a model repository are the models of an embedding, reranker or sparse model.

An ensemble is ours when its two steps are a tokenizer and an embedder (an embedding model),
a pair tokenizer and a scorer (a reranker) or a tokenizer and a sparse encoder (a sparse
model) whose ``1/model.py`` imports this package's
adapter (``from triton_embed_server.steps.adapters.<step> import
TritonPythonModel``, as the template writes it). Configs are read with
:func:`~triton_embed_server.models.instance_group.read_config_pbtxt` (protobuf text format).
"""

from __future__ import annotations

import re
from pathlib import Path

from triton_embed_server.models.instance_group import read_config_pbtxt
from triton_embed_server.models.repository.names import RepositoryError

#: Model kind -> the adapters of its two steps, in ensemble order.
KIND_STEPS = {
    "embedding": ("tokenizer", "embedder"),
    "reranker": ("pair_tokenizer", "scorer"),
    "sparse": ("tokenizer", "sparse_encoder"),
    "multivector": ("tokenizer", "token_encoder"),
    "hybrid": ("tokenizer", "hybrid_encoder"),
}

#: Prefix of the temporary folders that ``add`` and ``remove`` make inside a repository.
TEMP_PREFIX = ".triton-embed-"
# The line of a step's model.py that makes it one of ours, and which step it is.
_ADAPTER_IMPORT = re.compile(
    r"^from triton_embed_server\.steps\.adapters\."
    r"(tokenizer|embedder|pair_tokenizer|scorer|sparse_encoder|token_encoder|hybrid_encoder) "
    r"import TritonPythonModel\b",
    re.M,
)


def ensembles(repository: Path) -> dict[str, list[str]]:
    """``{ensemble: its step model names}`` of every readable ensemble config, by name."""
    out = {}
    for config in sorted(Path(repository).glob("*/config.pbtxt")):
        if config.parent.name.startswith("."):
            continue
        try:
            parsed = read_config_pbtxt(config)
        except (OSError, ValueError):
            continue
        if parsed.get("platform") == "ensemble":
            steps = (parsed.get("ensemble_scheduling") or {}).get("step") or []
            out[config.parent.name] = [str(s.get("model_name", "")) for s in steps]
    return out


def step_users(repository: Path) -> dict[str, set[str]]:
    """``{step model: the ensembles that use it}``."""
    users: dict[str, set[str]] = {}
    for ensemble, steps in ensembles(repository).items():
        for step in steps:
            users.setdefault(step, set()).add(ensemble)
    return users


def step_kind(folder: Path) -> str | None:
    """The adapter of ``folder/1/model.py`` if it is one of ours (a :data:`KIND_STEPS` step)."""
    try:
        found = _ADAPTER_IMPORT.search((folder / "1" / "model.py").read_text("utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    return found.group(1) if found else None


def our_steps(repository: Path, name: str, steps: list[str]) -> tuple[str, str, str]:
    """``(kind, tokenizer step, engine step)`` of the ensemble ``name`` whose steps are ``steps``.

    ``kind`` is ``embedding`` (a tokenizer and an embedder), ``reranker`` (a pair tokenizer
    and a scorer), ``sparse`` (a tokenizer and a sparse encoder) or ``multivector`` (a
    tokenizer and a token encoder) or ``hybrid`` (a tokenizer and a hybrid encoder),
    :data:`KIND_STEPS`.

    Raises:
        RepositoryError: the steps are not the two steps of one kind of this project.
    """
    kinds = tuple(step_kind(repository / step) for step in steps)
    for kind, adapters in KIND_STEPS.items():
        if kinds == adapters:
            return kind, steps[0], steps[1]
    raise RepositoryError(
        f"{repository / name} is not a model of triton-embed: its steps "
        f"({', '.join(steps) or 'none'}) are not a tokenizer and an embedder (or a pair "
        "tokenizer and a scorer, a tokenizer and a sparse, token or hybrid encoder) whose "
        "1/model.py imports triton_embed_server.steps.adapters"
    )
