"""Token vectors from a multi-vector ensemble: the client's ``embed_tokens`` (a mixin).

A multi-vector ensemble (docs/sparse.md, "Multi-vector") answers, per text, one float32
vector per token: ColBERT's projected, L2-normalized vectors (with its ``[Q]``/``[D]`` marker
and a query's ``[MASK]`` augmentation), or a dense model's last hidden states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from triton_embed.errors import InvalidInputError
from triton_embed.hybrid_options import head_parameters
from triton_embed.multivector_options import MultiVectorOptions
from triton_embed.options import Truncation
from triton_embed.transport.calls import (
    CallGroup,
    Channel,
    ClientPart,
    PairsRequest,
    as_bytes,
    send_all,
    send_tokens,
    trace_argument,
)
from triton_embed.transport.catalog import ModelKind
from triton_embed.transport.tracing import TraceContext


class TokenEmbedding(ClientPart):
    """The ``embed_tokens`` method of :class:`~triton_embed.client.EmbeddingClient` (a mixin)."""

    def embed_tokens(
        self,
        texts: Sequence[str | bytes],
        *,
        model: str | None = None,
        input_type: str | None = None,
        truncation: Truncation | str | None = None,
        on_batch_done: Callable[[int, int], None] | None = None,
        traceparent: str | TraceContext | None = None,
    ) -> list[np.ndarray]:
        """Encode texts into one vector per token with a multi-vector ensemble.

        Args:
            texts: ``n`` texts (``str``, or UTF-8 ``bytes`` sent as is).
            model: the multi-vector ensemble, or a hybrid one (BGE-M3's ColBERT vectors;
                default: the client's ``model``).
            input_type: ``query`` or ``document`` (``None``: the server's, ``document``):
                ColBERT's marker, and a query's length and ``[MASK]`` augmentation.
            truncation: ``NONE``, ``END`` or ``START`` (not ``CHUNK``; ``None``: the
                server's, ``END``).
            on_batch_done: called with ``(texts_in_request, tokens_in_request)`` after
                each request.
            traceparent: the W3C trace context of its requests (a ``traceparent`` or a
                ``TraceContext``; default: ``trace_context``'s, OpenTelemetry's current span).

        Returns:
            Per text float32 ``[tokens, dim]``, in input order (``tokens``: the text's
            ``NUM_TOKENS``, special tokens, marker and mask tokens included, a ColBERT
            document's punctuation rows left out; a hybrid model's ColBERT vectors leave the
            CLS token out: ``NUM_TOKENS - 1`` rows).

        Raises:
            InvalidInputError: an option outside its values, a text refused (``error.index``
                is its index in ``texts``), a request over the server's response cap, or
                ``model`` not a multi-vector model.
            ServerOverloadedError, ServerUnavailableError, EmbedTimeoutError: as ``embed``.
        """
        if isinstance(texts, (str, bytes)):
            raise InvalidInputError(
                "texts must be a sequence of texts, not a single str/bytes; wrap it in a list"
            )
        try:
            options = MultiVectorOptions(truncation=truncation, input_type=input_type)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        payloads = [as_bytes(t, i) for i, t in enumerate(texts)]
        model, trace = model or self.model, trace_argument(traceparent)
        if not payloads:
            return []
        hybrid = self._check_kind(model, ModelKind.MULTIVECTOR)
        parameters = head_parameters(hybrid, "colbert", options.to_parameters())
        request = PairsRequest(model, parameters, rows_skipped=int(hybrid))
        channel = Channel(self._grpc, self._client, self.url, self.timeout_s)

        def send(start: int, stop: int, calls: CallGroup):
            return send_tokens(channel, payloads[start:stop], start, request, calls)

        def done(count: int, result) -> None:
            if on_batch_done is not None:
                on_batch_done(count, int(result[1].sum()))

        sent = send_all(
            len(payloads), self._batch_size(model), send, self.retry, self.max_concurrency, done,
            trace,
        )  # fmt: skip
        return [m for matrices, _ in sent.results for m in matrices]
