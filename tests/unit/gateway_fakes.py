"""Shared pieces of the gateway's unit tests: the catalog entry of a test ensemble."""

from __future__ import annotations

from typing import Any

from triton_embed.transport.catalog import ModelInfo


def embed_info(batch: int, embedder_batch: int | None = None, **fields: Any) -> ModelInfo:
    """The :class:`ModelInfo` of an ensemble ``embed``, its steps ``tokenizer`` and ``embedder``.

    Args:
        batch: the ensemble's and its tokenizer step's ``max_batch_size``.
        embedder_batch: the embedder step's ``max_batch_size`` (``None``: ``batch``).
        **fields: the other fields (``dimension``, ``max_length``, ...).
    """
    return ModelInfo(
        name="embed",
        max_batch_size=batch,
        tokenizer="tokenizer",
        embedder="embedder",
        tokenizer_max_batch_size=batch,
        embedder_max_batch_size=batch if embedder_batch is None else embedder_batch,
        **fields,
    )
