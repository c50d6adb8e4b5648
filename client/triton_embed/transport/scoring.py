"""Where a reranker ensemble is called: query-document pairs in pieces, scores back in order.

A request's pairs (one query with many documents, or as many queries as documents) are cut
into pieces of the reranker's :meth:`~.catalog.RerankerInfo.piece_size` pairs (its
``max_batch_size``, fewer where its pair tokenizer's token budget per request asks for
it), sent concurrently as ``QUERY`` and ``DOCUMENT`` ``BYTES [n, 1]`` tensors (the query
repeated on each row, docs/rerank.md) through the same machinery as embeddings
(:func:`~.inference.each_piece`: at most :data:`~.inference.PIECES_IN_FLIGHT` at once, a
token budget, cancellation, the pool's retry on another upstream), and put back together
in input order: ``SCORE`` (float32) and ``NUM_TOKENS`` (int32) per pair.

A failed piece fails the request with the
:class:`~triton_embed.transport.failures.TransportError` of
:func:`~triton_embed.transport.failures.upstream_error`: a pair the server refused ("the
document of pair 3 is empty") is named by its index in the request's documents.

The order of the scores, best first, is :func:`triton_embed.reranking.rank`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from triton_embed.codec import float32_values, int32_values
from triton_embed.rerank_options import PairOptions
from triton_embed.transport.catalog import RerankerInfo
from triton_embed.transport.inference import (
    Pool,
    TokenBudget,
    bad_answer,
    call_model,
    each_piece,
    pieces,
)

#: The reranker ensemble's inputs and outputs (docs/rerank.md).
QUERY, DOCUMENT, SCORE, NUM_TOKENS = "QUERY", "DOCUMENT", "SCORE", "NUM_TOKENS"


@dataclass(frozen=True)
class Scores:
    """The scores of a request's pairs, in input order.

    Attributes:
        scores: float32 ``[n]``, one per pair: the model's activated score (a sigmoid for a
            one-label cross-encoder), or its logit with ``raw_scores``.
        num_tokens: int32 ``[n]``, tokens of each pair as the server counted them.
    """

    scores: np.ndarray
    num_tokens: np.ndarray


def pair_queries(queries: Sequence[bytes], count: int) -> Sequence[bytes]:
    """The query of each of ``count`` pairs: one query for all, or one per pair.

    Raises:
        ValueError: ``queries`` holds neither 1 nor ``count`` elements.
    """
    if len(queries) == count:
        return queries
    if len(queries) == 1:
        return [queries[0]] * count
    raise ValueError(f"{len(queries)} queries for {count} documents: send 1 or {count}")


async def score_pairs(
    pool: Pool,
    model: RerankerInfo,
    queries: Sequence[bytes],
    documents: Sequence[bytes],
    options: PairOptions | None = None,
    budget: TokenBudget | None = None,
) -> Scores:
    """Score query-document pairs with the reranker ensemble ``model``.

    Args:
        pool: the upstreams.
        model: the reranker.
        queries: one UTF-8 query for every document, or one per document.
        documents: ``n`` UTF-8 documents.
        options: the request options (``truncation``, ``raw_scores``, ...; ``None``: the
            server's defaults), sent as the KServe v2 request parameters of every piece.
        budget: the request's token budget (``None``: none).

    Returns:
        The ``n`` scores and token counts, in the order of ``documents``.

    Raises:
        ValueError: ``queries`` holds neither 1 nor ``n`` elements.
        TransportError: a piece failed (the server's message; a pair named by its index in
            ``documents``), or the pairs are over ``budget`` (``OVER_BUDGET``).
    """
    count = len(documents)
    per_pair = pair_queries(queries, count)
    if not count:
        return Scores(np.zeros(0, np.float32), np.zeros(0, np.int32))

    async def call(start: int, stop: int) -> tuple[tuple[np.ndarray, np.ndarray], int]:
        inputs = {QUERY: per_pair[start:stop], DOCUMENT: documents[start:stop]}
        raw = await call_model(pool, model.name, inputs, (SCORE, NUM_TOKENS), options, start)
        try:
            scores = float32_values(raw[SCORE], stop - start)
            num_tokens = int32_values(raw[NUM_TOKENS], stop - start)
        except ValueError as exc:
            raise bad_answer(model.name, exc) from None
        return (scores, num_tokens), int(num_tokens.sum())

    size = model.piece_size()
    spans = pieces(count, size)
    bounds = None
    if budget is not None and len(spans) > 1:
        # A decoder reranker's instruction joins every pair (at most 4 UTF-8 bytes a character).
        extra = 4 * len(options.instruction) if options and options.instruction else 0
        bounds = [
            budget.bound_sizes([len(per_pair[i]) + len(documents[i]) + extra for i in range(*span)])
            for span in spans
        ]
    results = await each_piece(count, size, call, budget, bounds)
    return Scores(
        np.concatenate([scores for scores, _ in results]),
        np.concatenate([counts for _, counts in results]),
    )
