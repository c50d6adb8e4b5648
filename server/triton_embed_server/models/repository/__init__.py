"""The Triton models of one embedding model: written, listed and removed (``repository``).

One embedding model is served as three models of a Triton model repository: the ensemble
``NAME`` (the public contract: ``TEXT`` in; ``EMBEDDING``, ``NUM_TOKENS`` out) and its two
steps ``NAME_tokenizer`` and ``NAME_embedder`` (Python backend; their ``1/model.py`` imports
``triton_embed_server.steps.adapters.<step>``). The ensemble named ``embed`` keeps the step names
``tokenizer`` and ``embedder`` it always had, so ``triton-embed repository add --name embed``
with the defaults writes this project's ``model_repository/`` byte for byte.

* :mod:`~triton_embed_server.models.repository.names`: model names, step names, the error type.
* :mod:`~triton_embed_server.models.repository.render`: the files: the shipped ones (linked
  from ``triton_embed_server/models/repository/templates/``) with their values set by key.
* :mod:`~triton_embed_server.models.repository.layout`: which folders of a repository are ours.
* :mod:`~triton_embed_server.models.repository.add`: checking a model folder and writing the
  models all or nothing.
* :mod:`~triton_embed_server.models.repository.remove` and
  :mod:`~triton_embed_server.models.repository.listing`: ``repository remove`` and ``list``.
"""

from triton_embed_server.models.repository.add import add_model, memory_warnings
from triton_embed_server.models.repository.listing import ListedModel, format_table, list_models
from triton_embed_server.models.repository.names import (
    LEGACY_NAME,
    MAX_NAME_CHARS,
    MAX_SERVED_NAME_CHARS,
    NAME_PATTERN,
    SERVED_NAME_PATTERN,
    RepositoryError,
    check_name,
    check_served_model_name,
    step_names,
)
from triton_embed_server.models.repository.remove import removable, remove_model
from triton_embed_server.models.repository.render import (
    DEFAULT_INSTANCES,
    DEFAULT_MAX_CHUNKS,
    DEVICES,
    TEMPLATES,
    ModelOptions,
    render,
)

__all__ = [
    "DEFAULT_INSTANCES",
    "DEFAULT_MAX_CHUNKS",
    "DEVICES",
    "LEGACY_NAME",
    "MAX_NAME_CHARS",
    "MAX_SERVED_NAME_CHARS",
    "NAME_PATTERN",
    "SERVED_NAME_PATTERN",
    "TEMPLATES",
    "ListedModel",
    "ModelOptions",
    "RepositoryError",
    "add_model",
    "check_name",
    "check_served_model_name",
    "format_table",
    "list_models",
    "memory_warnings",
    "removable",
    "remove_model",
    "render",
    "step_names",
]
