"""The client library's gRPC calls: one request, cancellable with the others of its call.

:func:`send_texts` sends one request of an ``embed`` call (:func:`send_pairs`: of a
``rerank`` call) over ``tritonclient.grpc`` as a cancellable call with its deadline; a
:class:`CallGroup` holds the calls of one ``embed`` call in flight and cancels them together
when one fails (Triton 2.51 then stops an ensemble request before its next step);
:func:`send_all` sends a call's requests concurrently, each retried on its own, and stops
them all at the first failure. Failures come back as the client's errors
(:func:`triton_embed.errors.map_error`). :class:`ChannelOwner` is what every object that
owns a ``tritonclient.grpc.InferenceServerClient`` shares: ``close`` and ``with``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar

import numpy as np

from triton_embed.admin import check_key, read_admin_key
from triton_embed.codec import decode_embeddings, decode_sparse, decode_token_matrices
from triton_embed.errors import EmbedClientError, InvalidInputError, map_error
from triton_embed.options import DEFAULT_EMBEDDING_TYPE, EmbeddingType
from triton_embed.priority import wire
from triton_embed.retry import RetryPolicy
from triton_embed.transport.tracing import TraceContext, as_trace_context, call_span, capture

#: Seconds past a call's deadline after which a lost answer is given up on.
LOST_ANSWER_MARGIN_S = 5.0

T = TypeVar("T")


class Stopped(EmbedClientError):
    """A request of an ``embed`` call that was not sent, or cancelled: another one failed."""


class CallGroup:
    """The in-flight gRPC calls of one ``embed`` call, cancelled together on the first failure.

    Thread-safe: the worker threads add and remove their calls; :meth:`fail` records the
    first real error and cancels the rest.

    Args:
        trace: the parent of its calls' spans, captured in the caller's thread
            (:func:`~triton_embed.transport.tracing.capture`; ``None``: not traced).
    """

    def __init__(self, trace: Any = None) -> None:
        self.trace = trace
        self._lock = threading.Lock()
        self._contexts: set = set()
        self.stopped = False
        self.first_error: BaseException | None = None

    def add(self, context) -> None:
        """Track an in-flight call (``tritonclient`` ``CallContext``); cancel it if stopped."""
        with self._lock:
            if not self.stopped:
                self._contexts.add(context)
                return
        context.cancel()

    def discard(self, context) -> None:
        """Forget a call that has answered."""
        with self._lock:
            self._contexts.discard(context)

    def fail(self, error: BaseException) -> None:
        """Stop the ``embed`` call: keep the first real error, cancel every call in flight."""
        with self._lock:
            if self.first_error is None and not isinstance(error, Stopped):
                self.first_error = error
            self.stopped = True
            contexts, self._contexts = self._contexts, set()
        for context in contexts:
            context.cancel()


@dataclass(frozen=True)
class TextsRequest:
    """What every request of one ``embed`` call shares: model, parameters, output type."""

    model: str
    parameters: dict
    embedding_type: EmbeddingType | None


@dataclass(frozen=True)
class PairsRequest:
    """What every request of one ``rerank`` (or ``embed_sparse``) call shares: model, parameters.

    ``rows_skipped``: a token matrix has ``NUM_TOKENS - rows_skipped`` rows (1 for a hybrid
    model's ColBERT vectors, which leave the CLS token out).
    """

    model: str
    parameters: dict
    rows_skipped: int = 0


@dataclass(frozen=True)
class Channel:
    """One server's ``tritonclient.grpc`` module, client, URL, deadline and priority per call.

    ``priority`` is the Triton priority level every call is sent at
    (:func:`triton_embed.priority.level_of`; 0: the server's default level).
    """

    grpc: Any
    client: Any
    url: str
    timeout_s: float
    priority: int = 0


def _call(
    channel: Channel,
    model: str,
    inputs: dict[str, list[bytes]],
    outputs: tuple[str, ...],
    parameters: dict,
    calls: CallGroup,
    offset: int,
    items: str,
) -> Any:
    """One cancellable gRPC request of ``BYTES [n, 1]`` inputs; its result.

    Sent with the ``timeout_s`` deadline; ``calls`` cancels it when another request of the
    same call fails.

    Args:
        channel: the server.
        model: the model.
        inputs: ``{input name: n elements}``.
        outputs: the outputs asked for.
        parameters: the KServe v2 request parameters.
        calls: the call's group of requests.
        offset: index in the caller's items of the request's first element.
        items: what the caller passed (``texts``, ``documents``), for the messages.

    Raises:
        EmbedClientError: the mapped failure (:func:`~triton_embed.errors.map_error`);
            :class:`Stopped` when ``calls`` stopped before or while it ran.
    """
    if calls.stopped:
        raise Stopped("not sent: another request of this call failed")
    grpc = channel.grpc
    size = len(next(iter(inputs.values())))
    tensors = []
    for name, elements in inputs.items():
        arr = np.empty((len(elements), 1), dtype=object)  # object: trailing NULs survive
        arr[:, 0] = elements
        tensor = grpc.InferInput(name, list(arr.shape), "BYTES")
        tensor.set_data_from_numpy(arr)
        tensors.append(tensor)
    answered = threading.Event()
    answer: list = [None, None]

    def on_answer(result, error) -> None:
        answer[0], answer[1] = result, error
        answered.set()

    with call_span(calls.trace, model, channel.url) as headers:  # failures mark the span
        try:
            context = channel.client.async_infer(
                model,
                tensors,
                on_answer,
                outputs=[grpc.InferRequestedOutput(name) for name in outputs],
                client_timeout=channel.timeout_s,
                headers=headers,
                **wire(channel.priority, parameters),
            )
        except Exception as exc:
            raise map_error(exc, channel.url, offset, size, items=items) from None
        calls.add(context)
        try:
            # The gRPC deadline answers at timeout_s; the margin only guards a lost callback.
            if not answered.wait(channel.timeout_s + LOST_ANSWER_MARGIN_S):
                context.cancel()
                lost = TimeoutError("Deadline Exceeded")
                raise map_error(lost, channel.url, offset, size, items=items)
        finally:
            calls.discard(context)
        result, error = answer
        if error is not None:
            if calls.stopped and calls.first_error is not None:
                raise Stopped("cancelled: another request of this call failed")
            raise map_error(error, channel.url, offset, size, items=items) from None
    return result


def send_texts(
    channel: Channel, batch: list[bytes], offset: int, request: TextsRequest, calls: CallGroup
) -> tuple[np.ndarray, np.ndarray]:
    """One gRPC request: ``batch`` (``texts[offset : offset + len(batch)]``) embedded.

    Sent as a cancellable call with the ``timeout_s`` deadline; ``calls`` cancels it when
    another request of the same ``embed`` call fails.

    Returns:
        The vectors ``[n, dim]`` (:func:`~triton_embed.codec.decode_embeddings` of the
        request's ``embedding_type``) and int32 ``[n]`` token counts.

    Raises:
        EmbedClientError: the mapped failure (:func:`~triton_embed.errors.map_error`);
            :class:`Stopped` when ``calls`` stopped before or while it ran.
    """
    result = _call(
        channel, request.model, {"TEXT": batch}, ("EMBEDDING", "NUM_TOKENS"),
        request.parameters, calls, offset, "texts",
    )  # fmt: skip
    vectors = decode_embeddings(
        result.as_numpy("EMBEDDING").reshape(-1),
        embedding_type=request.embedding_type or DEFAULT_EMBEDDING_TYPE,
    )
    counts = result.as_numpy("NUM_TOKENS").reshape(-1).astype(np.int32)
    if len(vectors) != len(batch) or len(counts) != len(batch):
        raise EmbedClientError(f"server returned {len(vectors)} embeddings for {len(batch)} texts")
    return vectors, counts


def send_sparse(
    channel: Channel, batch: list[bytes], offset: int, request: PairsRequest, calls: CallGroup
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """One gRPC request to a sparse ensemble: ``batch`` (``texts[offset : ...]``) encoded.

    ``request`` carries the sparse model and its parameters (docs/sparse.md); a cancellable
    call as :func:`send_texts`'s.

    Returns:
        Per text ``(indices int32 [k], weights float32 [k])``, indices ascending
        (:func:`~triton_embed.codec.decode_sparse`), and int32 ``[n]`` token counts.

    Raises:
        EmbedClientError: the mapped failure, or an answer that is not ``n`` sparse vectors;
            :class:`Stopped` as for :func:`send_texts`.
    """
    result = _call(
        channel, request.model, {"TEXT": batch}, ("SPARSE", "NUM_TOKENS"),
        request.parameters, calls, offset, "texts",
    )  # fmt: skip
    elements = result.as_numpy("SPARSE").reshape(-1)
    counts = result.as_numpy("NUM_TOKENS").reshape(-1).astype(np.int32)
    if len(elements) != len(batch) or len(counts) != len(batch):
        raise EmbedClientError(f"server returned {len(elements)} vectors for {len(batch)} texts")
    try:
        return [decode_sparse(e) for e in elements], counts
    except ValueError as exc:
        raise EmbedClientError(f"server returned an unreadable sparse vector: {exc}") from None


def send_tokens(
    channel: Channel, batch: list[bytes], offset: int, request: PairsRequest, calls: CallGroup
) -> tuple[list[np.ndarray], np.ndarray]:
    """One gRPC request to a multi-vector ensemble: ``batch`` encoded, one vector per token.

    ``request`` carries the model and its parameters (``input_type``...); a cancellable call
    as :func:`send_texts`'s.

    Returns:
        Per text float32 ``[tokens, dim]`` (:func:`~triton_embed.codec.decode_token_matrices`)
        and int32 ``[n]`` token counts (the rows).

    Raises:
        EmbedClientError: the mapped failure, or an answer that is not ``n`` token matrices;
            :class:`Stopped` as for :func:`send_texts`.
    """
    result = _call(
        channel, request.model, {"TEXT": batch}, ("TOKEN_EMBEDDINGS", "NUM_TOKENS"),
        request.parameters, calls, offset, "texts",
    )  # fmt: skip
    elements = result.as_numpy("TOKEN_EMBEDDINGS").reshape(-1)
    counts = result.as_numpy("NUM_TOKENS").reshape(-1).astype(np.int32)
    if len(elements) != len(batch) or len(counts) != len(batch):
        raise EmbedClientError(f"server returned {len(elements)} matrices for {len(batch)} texts")
    try:
        return decode_token_matrices(elements, counts - request.rows_skipped), counts
    except ValueError as exc:
        raise EmbedClientError(f"server returned unreadable token vectors: {exc}") from None


def send_pairs(
    channel: Channel,
    query: bytes,
    batch: list[bytes],
    offset: int,
    request: PairsRequest,
    calls: CallGroup,
) -> tuple[np.ndarray, np.ndarray]:
    """One gRPC request: ``query`` with each of ``batch`` (``documents[offset : ...]``) scored.

    The reranker ensemble's ``QUERY`` (``query`` repeated on each row) and ``DOCUMENT``
    (docs/rerank.md), a cancellable call as :func:`send_texts`'s.

    Returns:
        float32 ``[n]`` scores and int32 ``[n]`` token counts, in the order of ``batch``.

    Raises:
        EmbedClientError: the mapped failure; a refused pair is named by its index in the
            caller's documents (``documents[i]``); :class:`Stopped` as for
            :func:`send_texts`.
    """
    inputs = {"QUERY": [query] * len(batch), "DOCUMENT": batch}
    result = _call(
        channel, request.model, inputs, ("SCORE", "NUM_TOKENS"), request.parameters, calls,
        offset, "documents",
    )  # fmt: skip
    scores = result.as_numpy("SCORE").reshape(-1).astype(np.float32)
    counts = result.as_numpy("NUM_TOKENS").reshape(-1).astype(np.int32)
    if len(scores) != len(batch) or len(counts) != len(batch):
        raise EmbedClientError(f"server returned {len(scores)} scores for {len(batch)} documents")
    return scores, counts


@dataclass(frozen=True)
class Sent(Generic[T]):
    """What :func:`send_all` got back.

    Attributes:
        results: each request's result, in input order.
        latencies_s: each request's seconds from its first send to its answer (retries and
            their waits included).
        retries: requests sent again after the server refused them, over all requests.
    """

    results: list[T]
    latencies_s: list[float]
    retries: int


def send_all(
    count: int,
    batch_size: int,
    send: Callable[[int, int, CallGroup], T],
    retry: RetryPolicy,
    max_concurrency: int,
    on_done: Callable[[int, T], None] | None = None,
    trace: TraceContext | None = None,
) -> Sent[T]:
    """Send ``count`` inputs as requests of ``batch_size``, concurrently; results in input order.

    ``send(start, stop, calls)`` is one request (of inputs ``[start, stop)``), retried by
    ``retry`` when refused. When one request fails the call raises at once: the requests in
    flight are cancelled (``calls``) and those not yet sent are never sent.

    Args:
        count: the inputs.
        batch_size: inputs per request.
        send: one request.
        retry: how a refused request is sent again.
        max_concurrency: requests in flight at once.
        on_done: called with ``(inputs in the request, its result)`` after each request.
        trace: the method's ``traceparent=`` (:func:`trace_argument`); ``None``: the calls'
            parent is :func:`~triton_embed.transport.tracing.capture`'s, if any.

    Raises:
        EmbedClientError: the first request's failure (not a :class:`Stopped` one).
    """
    starts = list(range(0, count, batch_size))
    retries = [0]
    lock = threading.Lock()
    calls = CallGroup(capture(trace))  # the trace of the call, from the caller's thread

    def count_retry(error: BaseException, wait_s: float) -> None:
        with lock:
            retries[0] += 1

    def run(start: int) -> tuple[T, float]:
        stop = min(start + batch_size, count)
        t0 = time.perf_counter()
        try:
            result = retry.call(send, start, stop, calls, on_retry=count_retry)
        except BaseException as exc:
            calls.fail(exc)  # nobody waits for the other requests any more
            raise
        elapsed = time.perf_counter() - t0
        if on_done is not None:
            on_done(stop - start, result)
        return result, elapsed

    with ThreadPoolExecutor(max_workers=max(1, min(max_concurrency, len(starts)))) as pool:
        futures = [pool.submit(run, start) for start in starts]
        try:
            done = [f.result() for f in futures]  # in input order
        except BaseException as exc:
            calls.fail(exc)
            for f in futures:
                f.cancel()  # requests not yet sent are never sent
            if calls.first_error is not None and calls.first_error is not exc:
                raise calls.first_error from None
            raise
    return Sent([r for r, _ in done], [t for _, t in done], retries[0])


def as_bytes(text: str | bytes, index: int | None, items: str = "texts") -> bytes:
    """The UTF-8 bytes of ``items[index]`` (a text, a document; ``index`` ``None``: ``items``).

    Raises:
        InvalidInputError: the text is neither ``str`` nor ``bytes``, or holds a lone
            surrogate (no UTF-8 form); names ``items[index]`` (``error.index``).
    """
    where = items if index is None else f"{items}[{index}]"
    if isinstance(text, bytes):
        return text
    if isinstance(text, str):
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:
            reason = (
                f"holds a lone surrogate, U+{ord(text[exc.start]):04X} at character {exc.start}, "
                'which has no UTF-8 form (typically from a JSON escape such as "\\ud800" or '
                "from bytes decoded with errors='surrogateescape'); remove it or replace it, "
                "e.g. with U+FFFD"
            )
            raise InvalidInputError(f"{where} {reason}", index=index, reason=reason) from None
    reason = f"must be str or bytes, got {type(text).__name__}"
    raise InvalidInputError(f"{where} {reason}", index=index, reason=reason)


def trace_argument(traceparent: str | TraceContext | None) -> TraceContext | None:
    """A method's ``traceparent=`` (a W3C ``traceparent`` or a ``TraceContext``), checked.

    Raises:
        InvalidInputError: not a W3C trace context; the message shows the form.
    """
    try:
        return as_trace_context(traceparent)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None


def admin_key_of(admin_key: str | None) -> str | None:
    """The admin key to send: ``admin_key`` checked, or the configured one (if any).

    ``None`` reads it as :func:`triton_embed.admin.read_admin_key` does.

    Raises:
        InvalidInputError: the key is not usable.
        EmbedClientError: the configured key file cannot be read.
    """
    try:
        return read_admin_key() if admin_key is None else check_key(admin_key, "admin_key=")
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    except OSError as exc:
        raise EmbedClientError(f"cannot read the admin key: {exc}") from None


class ChannelOwner:
    """Owns one ``tritonclient.grpc.InferenceServerClient`` (``_client``): ``close``, ``with``."""

    _client: Any

    def close(self) -> None:
        """Close the gRPC channel."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ClientPart:
    """What a mixin of :class:`~triton_embed.client.EmbeddingClient` uses of the client.

    Its server (``url``, ``_client``, ``_grpc``), ``model``, ``timeout_s``,
    ``max_concurrency``, ``retry``, ``priority_level``, and two of its methods.
    """

    model: str
    priority_level: int
    url: str
    timeout_s: float
    max_concurrency: int
    retry: RetryPolicy
    _client: Any
    _grpc: Any
    #: Items per request to a model (its ``max_batch_size``, capped ``batch_size``).
    _batch_size: Callable[[str], int]
    #: Refuses a model of another kind (when its config could be read).
    _check_kind: Callable[[str, Any], None]
    #: The admin key's header for the restricted APIs (config reads), or ``None``.
    _admin_headers: Callable[[], dict[str, str] | None]
