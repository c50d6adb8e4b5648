"""Sparse (SPLADE) vectors from a sparse ensemble: the client's ``embed_sparse`` (a mixin).

A sparse ensemble (docs/sparse.md) answers, per text, its non-zero vocabulary indices (int32,
ascending) and their weights (float32); ``top_k`` and ``threshold`` cut them on the server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from triton_embed.errors import InvalidInputError
from triton_embed.hybrid_options import head_parameters
from triton_embed.options import Truncation
from triton_embed.sparse_options import SparseOptions
from triton_embed.transport.calls import (
    CallGroup,
    Channel,
    ClientPart,
    PairsRequest,
    as_bytes,
    send_all,
    send_sparse,
    trace_argument,
)
from triton_embed.transport.catalog import ModelKind
from triton_embed.transport.tracing import TraceContext


@dataclass(frozen=True)
class SparseResult:
    """The sparse vectors of one ``embed_sparse`` call, in input order.

    Attributes:
        indices: per text, int32 ``[k]`` vocabulary indices, ascending.
        weights: per text, float32 ``[k]`` weights (all > the call's ``threshold``).
        num_tokens: int32 ``[n]``, tokens the model read per text.
        latencies_s: each request's latency, seconds.
        retries: requests sent again after an overload refusal.
    """

    indices: list[np.ndarray]
    weights: list[np.ndarray]
    num_tokens: np.ndarray
    latencies_s: list[float]
    retries: int = 0

    def dense(self, vocab_size: int) -> np.ndarray:
        """The vectors as float32 ``[n, vocab_size]`` (zeros where no weight).

        Raises:
            ValueError: an index is not below ``vocab_size``.
        """
        out = np.zeros((len(self.indices), vocab_size), np.float32)
        for row, (idx, val) in enumerate(zip(self.indices, self.weights, strict=True)):
            if idx.size and int(idx.max()) >= vocab_size:
                raise ValueError(f"text {row}: index {int(idx.max())} >= {vocab_size}")
            out[row, idx] = val
        return out


class SparseEmbedding(ClientPart):
    """The ``embed_sparse`` method of :class:`~triton_embed.client.EmbeddingClient` (a mixin)."""

    def embed_sparse(
        self,
        texts: Sequence[str | bytes],
        *,
        model: str | None = None,
        top_k: int | None = None,
        threshold: float | None = None,
        truncation: Truncation | str | None = None,
        input_type: str | None = None,
        on_batch_done: Callable[[int, int], None] | None = None,
        traceparent: str | TraceContext | None = None,
    ) -> SparseResult:
        """Encode texts into sparse vectors with a sparse ensemble.

        Args:
            texts: ``n`` texts (``str``, or UTF-8 ``bytes`` sent as is).
            model: the sparse ensemble, or a hybrid one (BGE-M3's lexical weights; default:
                the client's ``model``).
            top_k: keep each text's ``top_k`` largest weights (``None``: the server's).
            threshold: keep weights above it (``None``: the server's, 0).
            truncation: ``NONE``, ``END`` or ``START`` (not ``CHUNK``; ``None``: the
                server's, ``END``).
            input_type: a prompt name of the model (``None``: its default).
            on_batch_done: called with ``(texts_in_request, tokens_in_request)`` after
                each request.
            traceparent: the W3C trace context of its requests (a ``traceparent`` or a
                ``TraceContext``; default: ``trace_context``'s, OpenTelemetry's current span).

        Returns:
            :class:`SparseResult`.

        Raises:
            InvalidInputError: an option outside its values, a text refused (``error.index``
                is its index in ``texts``), or ``model`` not a sparse model.
            ServerOverloadedError, ServerUnavailableError, EmbedTimeoutError: as ``embed``.
        """
        if isinstance(texts, (str, bytes)):
            raise InvalidInputError(
                "texts must be a sequence of texts, not a single str/bytes; wrap it in a list"
            )
        try:
            options = SparseOptions(
                truncation=truncation, input_type=input_type, top_k=top_k, threshold=threshold
            )
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        payloads = [as_bytes(t, i) for i, t in enumerate(texts)]
        model, trace = model or self.model, trace_argument(traceparent)
        if not payloads:
            return SparseResult([], [], np.zeros(0, np.int32), [])
        hybrid = self._check_kind(model, ModelKind.SPARSE)
        request = PairsRequest(model, head_parameters(hybrid, "sparse", options.to_parameters()))
        channel = Channel(self._grpc, self._client, self.url, self.timeout_s, self.priority_level)

        def send(start: int, stop: int, calls: CallGroup):
            return send_sparse(channel, payloads[start:stop], start, request, calls)

        def done(count: int, result) -> None:
            if on_batch_done is not None:
                on_batch_done(count, int(result[1].sum()))

        sent = send_all(
            len(payloads), self._batch_size(model), send, self.retry, self.max_concurrency, done,
            trace,
        )  # fmt: skip
        vectors = [v for vectors, _ in sent.results for v in vectors]
        return SparseResult(
            indices=[i for i, _ in vectors],
            weights=[w for _, w in vectors],
            num_tokens=np.concatenate([counts for _, counts in sent.results]),
            latencies_s=sent.latencies_s,
            retries=sent.retries,
        )
