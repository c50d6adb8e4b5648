"""Reranking with a reranker ensemble: the client's ``rerank`` and the order of scores.

>>> from triton_embed import EmbeddingClient
>>> client = EmbeddingClient("127.0.0.1:8001", model="rerank")
>>> result = client.rerank("what is a panda?", ["a bear of China", "a sports car"], top_n=1)
>>> result.indices, result.scores  # best first: int64 [1], float32 [1]

A reranker ensemble (docs/rerank.md) scores query-document pairs: ``QUERY`` and
``DOCUMENT`` ``BYTES [n, 1]`` -> ``SCORE`` FP32 ``[n, 1]``, ``NUM_TOKENS`` INT32 ``[n, 1]``.
:meth:`Reranking.rerank` sends the query with each document, in requests of at most the
server's ``max_batch_size`` pairs (or the client's ``batch_size``), concurrently, with the
same retries, cancellation and errors as ``embed``
(:func:`~triton_embed.transport.calls.send_all`), and ranks the scores (:func:`rank`).

The order is one definition, :func:`rank`: score descending, ties by lower input index
(a stable sort), which the gateway's rerank routes use too.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_embed.errors import InvalidInputError
from triton_embed.rerank_options import PairOptions, PairTruncation
from triton_embed.transport.calls import (
    CallGroup,
    Channel,
    ClientPart,
    PairsRequest,
    as_bytes,
    send_all,
    send_pairs,
    trace_argument,
)
from triton_embed.transport.catalog import ModelKind
from triton_embed.transport.tracing import TraceContext

#: Documents one rerank call takes by default: Cohere's recommended limit per request
#: ("we recommend a maximum of 1,000 documents"), which the gateway's routes enforce too.
MAX_DOCUMENTS = 1000


def rank(scores: np.ndarray, top_n: int | None = None) -> np.ndarray:
    """The indices of ``scores``, best first: score descending, ties by lower index.

    A stable sort of the negated scores, so equal scores keep their input order; a NaN
    score (none is expected) sorts last.

    Args:
        scores: float ``[n]``.
        top_n: keep the first ``top_n`` (``None``: all; more than ``n``: all).

    Returns:
        int64 ``[min(n, top_n)]``.

    >>> rank(np.array([0.1, 0.9, 0.1, 0.5], np.float32)).tolist()
    [1, 3, 0, 2]
    """
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return order if top_n is None else order[:top_n]


@dataclass(frozen=True)
class RerankResult:
    """The ranking of a rerank call.

    Attributes:
        indices: int64 ``[k]``, the documents' indices in the caller's list, best first
            (score descending, ties by lower index; :func:`rank`); ``k`` is ``top_n``, or
            every document.
        scores: float32 ``[k]``, the scores of ``indices``, in that order: the model's
            activated score (a sigmoid for a one-label cross-encoder), or its logit with
            ``raw_scores=True``.
        num_tokens: int32 ``[n]``, tokens of each pair as the server counted them, in the
            caller's document order (every document, whatever ``top_n``).
        latencies_s: wall-clock seconds of each request, from its first send to its answer.
        retries: requests sent again after the server refused them (overloaded).
    """

    indices: np.ndarray
    scores: np.ndarray
    num_tokens: np.ndarray
    latencies_s: list[float]
    retries: int = 0


def _positive_int(value: Any, what: str, allow_none: bool = True) -> int | None:
    """``value`` as a whole number >= 1 (``None`` kept when allowed).

    Raises:
        InvalidInputError: anything else (names ``what``).
    """
    if value is None and allow_none:
        return None
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < 1:
        raise InvalidInputError(f"{what} must be a whole number >= 1, got {value!r}")
    return number


def _timeout(value: Any, default: float) -> float:
    """A call's deadline: ``value`` (finite, > 0) or ``default``.

    Raises:
        InvalidInputError: not a finite number > 0.
    """
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (math.isfinite(value) and value > 0)
    ):
        raise InvalidInputError(f"timeout_s must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def check_documents(documents: Any, max_documents: int) -> list[bytes]:
    """The UTF-8 payloads of a rerank call's documents, checked before anything is sent.

    Raises:
        InvalidInputError: a single ``str``/``bytes`` instead of a list, no documents, more
            than ``max_documents``, or a document that is not text (names ``documents[i]``).
    """
    if isinstance(documents, (str, bytes)):
        raise InvalidInputError(
            "documents must be a sequence of texts, not a single str/bytes; wrap it in a list"
        )
    if len(documents) == 0:
        raise InvalidInputError("documents is empty; send at least one document to rank")
    if len(documents) > max_documents:
        raise InvalidInputError(
            f"{len(documents)} documents; at most {max_documents} are reranked per call "
            "(max_documents=): rerank the first-stage results in slices of at most "
            f"{max_documents}, or pass a larger max_documents="
        )
    return [as_bytes(d, i, "documents") for i, d in enumerate(documents)]


def check_query(query: Any) -> bytes:
    """The UTF-8 payload of a rerank call's query.

    Raises:
        InvalidInputError: not text, or empty (only whitespace).
    """
    payload = as_bytes(query, None, "query")
    if not payload.strip():
        raise InvalidInputError("query is empty; send the text the documents are ranked against")
    return payload


class Reranking(ClientPart):
    """The rerank methods of :class:`~triton_embed.client.EmbeddingClient` (a mixin)."""

    def rerank(
        self,
        query: str | bytes,
        documents: Sequence[str | bytes],
        *,
        model: str | None = None,
        top_n: int | None = None,
        raw_scores: bool = False,
        truncation: PairTruncation | str | None = None,
        max_document_tokens: int | None = None,
        instruction: str | None = None,
        timeout_s: float | None = None,
        max_documents: int = MAX_DOCUMENTS,
        traceparent: str | TraceContext | None = None,
    ) -> RerankResult:
        """Rank ``documents`` by their relevance to ``query``.

        Args:
            query: the query (``str``, or UTF-8 ``bytes``); not empty.
            documents: ``n`` documents (``str`` or ``bytes``), 1 to ``max_documents``.
            model: the reranker ensemble (default: the client's ``model``).
            top_n: keep the best ``top_n`` (``None``: all ``n``).
            raw_scores: the model's logits instead of its activated scores.
            truncation: a pair over the model's token budget: ``longest_first`` (the
                server's default), ``only_second`` (cut the document only) or ``none``
                (an error naming the document).
            max_document_tokens: cut each document to this many tokens first (Cohere's
                ``max_tokens_per_doc``).
            instruction: a decoder reranker's instruction (``None``: the model's default).
            timeout_s: deadline of each request, seconds (default: the client's).
            max_documents: the most documents one call takes (default
                :data:`MAX_DOCUMENTS`, 1,000).
            traceparent: the W3C trace context of its requests (a ``traceparent`` or a
                ``TraceContext``; default: ``trace_context``'s, OpenTelemetry's current span).

        Returns:
            :class:`RerankResult`: ``indices`` and ``scores`` best first, ``num_tokens`` in
            input order.

        Raises:
            InvalidInputError: an empty query, no documents or too many, a document the
                client or the server refused (``error.index`` is its index in
                ``documents``, which the message names), an option outside its values, or
                a ``model`` that is an embedding model.
            ServerOverloadedError: still refused as overloaded after the retries.
            ServerUnavailableError, EmbedTimeoutError: transport failures.
        """
        return self.rerank_with_details(
            query,
            documents,
            model=model,
            top_n=top_n,
            raw_scores=raw_scores,
            truncation=truncation,
            max_document_tokens=max_document_tokens,
            instruction=instruction,
            timeout_s=timeout_s,
            max_documents=max_documents,
            traceparent=traceparent,
        )

    def rerank_with_details(
        self,
        query: str | bytes,
        documents: Sequence[str | bytes],
        on_batch_done: Callable[[int, int], None] | None = None,
        *,
        model: str | None = None,
        top_n: int | None = None,
        raw_scores: bool = False,
        truncation: PairTruncation | str | None = None,
        max_document_tokens: int | None = None,
        instruction: str | None = None,
        timeout_s: float | None = None,
        max_documents: int = MAX_DOCUMENTS,
        traceparent: str | TraceContext | None = None,
    ) -> RerankResult:
        """:meth:`rerank`, and a callback after each request (progress bars).

        Args:
            query: see :meth:`rerank`.
            documents: see :meth:`rerank`.
            on_batch_done: called with ``(documents_in_request, tokens_in_request)`` after
                each request completes.
            model: see :meth:`rerank`.
            top_n: see :meth:`rerank`.
            raw_scores: see :meth:`rerank`.
            truncation: see :meth:`rerank`.
            max_document_tokens: see :meth:`rerank`.
            instruction: see :meth:`rerank`.
            timeout_s: see :meth:`rerank`.
            max_documents: see :meth:`rerank`.
            traceparent: see :meth:`rerank`.

        Returns:
            :class:`RerankResult`, with each request's latency and the retries.

        Raises:
            InvalidInputError, ServerOverloadedError, ServerUnavailableError,
            EmbedTimeoutError: as :meth:`rerank`.
        """
        top_n = _positive_int(top_n, "top_n")
        max_documents = _positive_int(max_documents, "max_documents", allow_none=False) or 1
        deadline_s = _timeout(timeout_s, self.timeout_s)
        trace = trace_argument(traceparent)
        try:
            options = PairOptions(
                truncation=truncation,
                raw_scores=True if raw_scores else None,  # False is the server's default
                max_document_tokens=max_document_tokens,
                instruction=instruction,
            )
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        payload = check_query(query)
        payloads = check_documents(documents, max_documents)
        model = model or self.model
        self._check_kind(model, ModelKind.RERANKER)
        request = PairsRequest(model, options.to_parameters())
        channel = Channel(self._grpc, self._client, self.url, deadline_s, self.priority_level)

        def send(start: int, stop: int, calls: CallGroup) -> tuple[np.ndarray, np.ndarray]:
            return send_pairs(channel, payload, payloads[start:stop], start, request, calls)

        def done(count: int, result: tuple[np.ndarray, np.ndarray]) -> None:
            if on_batch_done is not None:
                on_batch_done(count, int(result[1].sum()))

        sent = send_all(
            len(payloads), self._batch_size(model), send, self.retry, self.max_concurrency, done,
            trace,
        )  # fmt: skip
        scores = np.concatenate([r[0] for r in sent.results])
        order = rank(scores, top_n)
        return RerankResult(
            indices=order,
            scores=scores[order],
            num_tokens=np.concatenate([r[1] for r in sent.results]),
            latencies_s=sent.latencies_s,
            retries=sent.retries,
        )
