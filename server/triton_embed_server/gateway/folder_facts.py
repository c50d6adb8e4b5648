"""The gateway's facts reader: pooling and normalization read from a model folder on its host.

The transport's catalog knows what an embedder's config states
(:func:`triton_embed.transport.catalog.config_facts`); the gateway may run next to the model
folders, so it passes :func:`folder_facts` to its upstream pool, which reads what the config
leaves empty from the folder itself, with the same reader the embedder step uses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from triton_embed.transport.catalog import FolderFacts, config_facts, parameter

log = logging.getLogger("triton_embed.gateway")


def folder_facts(embedder_config: Mapping[str, Any]) -> FolderFacts:
    """Pooling and normalization of an embedder step, from its config or its model folder.

    The config's ``pooling`` / ``normalize`` parameters win; empty ones are read from the
    folder named by ``model_path`` (:func:`triton_embed_server.models.model_spec.read_model_spec`)
    when that is an absolute path or ``pkg://`` and readable here. A relative path is
    relative to the server's model repository, which the gateway does not know. Never
    raises: what cannot be read stays ``None``.
    """
    stated = config_facts(embedder_config)
    if stated.pooling is not None and stated.normalize is not None:
        return stated
    model_path = parameter(embedder_config, "model_path")
    if not (model_path.startswith("pkg://") or Path(model_path).is_absolute()):
        return stated
    try:
        from triton_embed_server.models.model_files import resolve_model_path
        from triton_embed_server.models.model_spec import read_model_spec

        spec = read_model_spec(
            resolve_model_path(model_path),
            pooling=parameter(embedder_config, "pooling"),
            normalize=parameter(embedder_config, "normalize"),
        )
    except Exception as exc:  # a folder on another host, unreadable, or odd: stay unknown
        log.info(
            "cannot read the model folder %s here (%s); pooling stays unknown", model_path, exc
        )
        return stated
    return FolderFacts(spec.pooling.value, spec.normalize)
