"""Shared pieces of the gateway's unit tests: catalog entries of test ensembles, configs."""

from __future__ import annotations

from typing import Any

from triton_embed.transport.catalog import ModelInfo, RerankerInfo


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


def rerank_info(batch: int, **fields: Any) -> RerankerInfo:
    """The :class:`RerankerInfo` of ``rerank``: steps ``rerank_tokenizer``, ``rerank_scorer``.

    Args:
        batch: the ensemble's ``max_batch_size`` (pairs per request).
        **fields: the other fields (``served_model_name``, ``max_length``, ...).
    """
    return RerankerInfo(
        name=fields.pop("name", "rerank"),
        max_batch_size=batch,
        tokenizer="rerank_tokenizer",
        scorer="rerank_scorer",
        **fields,
    )


#: A reranker ensemble's config as Triton returns it (docs/rerank.md), and its steps'.
RERANK_CONFIG = {
    "name": "rerank",
    "platform": "ensemble",
    "max_batch_size": 64,
    "input": [{"name": "QUERY"}, {"name": "DOCUMENT"}],
    "output": [{"name": "SCORE"}, {"name": "NUM_TOKENS"}],
    "parameters": {
        "kind": {"string_value": "reranker"},
        "served_model_name": {"string_value": "BAAI/bge-reranker-base"},
        "max_length": {"string_value": "512"},
        "family": {"string_value": "cross_encoder"},
    },
    "ensemble_scheduling": {
        "step": [{"model_name": "rerank_tokenizer"}, {"model_name": "rerank_scorer"}],
    },
}
RERANK_STEP_CONFIGS = {
    "rerank_tokenizer": {"name": "rerank_tokenizer", "backend": "python", "max_batch_size": 64},
    "rerank_scorer": {
        "name": "rerank_scorer",
        "backend": "python",
        "max_batch_size": 64,
        "parameters": {"dtype": {"string_value": "bfloat16"}},
    },
}
