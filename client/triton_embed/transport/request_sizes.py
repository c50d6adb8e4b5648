"""How many texts (or pairs) one request to a served model carries, from its config."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from triton_embed.transport.catalog import ModelKind, preferred_pairs, texts_within_cap


def texts_per_request(
    config: dict[str, Any], kind: ModelKind | None, read_config: Callable[[str], dict[str, Any]]
) -> int:
    """The most texts (pairs, for a reranker) one request to the model of ``config`` takes.

    Its ``max_batch_size`` (1 when it has none); for a reranker, at most its scorer step's
    preferred batch (pieces the scorer runs whole; the ensemble's ``max_batch_size`` where the
    scorer's config cannot be read); for a multi-vector or hybrid model, as many texts as fit
    its response cap (:func:`~triton_embed.transport.catalog.texts_within_cap`).

    Args:
        config: the ensemble's config, as Triton's JSON gives it.
        kind: its kind (``kind_of_config``).
        read_config: reads a step model's config by name (may raise).
    """
    most = int(config.get("max_batch_size", 0)) or 1
    if kind is ModelKind.RERANKER:
        steps = (config.get("ensemble_scheduling") or {}).get("step") or []
        try:
            scorer = read_config(steps[-1]["model_name"])
        except Exception:  # noqa: BLE001 - the ensemble's max_batch_size then
            return most
        return min(most, preferred_pairs(scorer) or most)
    if kind in (ModelKind.MULTIVECTOR, ModelKind.HYBRID):
        return texts_within_cap(config, most)
    return most
