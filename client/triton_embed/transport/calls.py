"""The client library's gRPC calls: one request of texts, cancellable with the others of its call.

:func:`send_texts` sends one request of an ``embed`` call over ``tritonclient.grpc`` as a
cancellable call with its deadline; a :class:`CallGroup` holds the calls of one ``embed``
call in flight and cancels them together when one fails (Triton 2.51 then stops an
ensemble request before its next step). Failures come back as the client's errors
(:func:`triton_embed.errors.map_error`). :class:`ChannelOwner` is what every object that
owns a ``tritonclient.grpc.InferenceServerClient`` shares: ``close`` and ``with``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from triton_embed.admin import check_key, read_admin_key
from triton_embed.codec import decode_embeddings
from triton_embed.errors import EmbedClientError, InvalidInputError, map_error
from triton_embed.options import DEFAULT_EMBEDDING_TYPE, EmbeddingType

#: Seconds past a call's deadline after which a lost answer is given up on.
LOST_ANSWER_MARGIN_S = 5.0


class Stopped(EmbedClientError):
    """A request of an ``embed`` call that was not sent, or cancelled: another one failed."""


class CallGroup:
    """The in-flight gRPC calls of one ``embed`` call, cancelled together on the first failure.

    Thread-safe: the worker threads add and remove their calls; :meth:`fail` records the
    first real error and cancels the rest.
    """

    def __init__(self) -> None:
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
class Channel:
    """One server's ``tritonclient.grpc`` module, client, URL and deadline per call."""

    grpc: Any
    client: Any
    url: str
    timeout_s: float


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
    if calls.stopped:
        raise Stopped("not sent: another request of this call failed")
    grpc = channel.grpc
    arr = np.empty((len(batch), 1), dtype=object)
    arr[:, 0] = batch
    inp = grpc.InferInput("TEXT", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    outputs = [grpc.InferRequestedOutput("EMBEDDING"), grpc.InferRequestedOutput("NUM_TOKENS")]
    answered = threading.Event()
    answer: list = [None, None]

    def on_answer(result, error) -> None:
        answer[0], answer[1] = result, error
        answered.set()

    try:
        context = channel.client.async_infer(
            request.model,
            [inp],
            on_answer,
            outputs=outputs,
            client_timeout=channel.timeout_s,
            parameters=request.parameters or None,
        )
    except Exception as exc:
        raise map_error(exc, channel.url, offset, len(batch)) from None
    calls.add(context)
    try:
        # The gRPC deadline answers at timeout_s; the margin only guards a lost callback.
        if not answered.wait(channel.timeout_s + LOST_ANSWER_MARGIN_S):
            context.cancel()
            lost = TimeoutError("Deadline Exceeded")
            raise map_error(lost, channel.url, offset, len(batch))
    finally:
        calls.discard(context)
    result, error = answer
    if error is not None:
        if calls.stopped and calls.first_error is not None:
            raise Stopped("cancelled: another request of this call failed")
        raise map_error(error, channel.url, offset, len(batch)) from None
    vectors = decode_embeddings(
        result.as_numpy("EMBEDDING").reshape(-1),
        embedding_type=request.embedding_type or DEFAULT_EMBEDDING_TYPE,
    )
    counts = result.as_numpy("NUM_TOKENS").reshape(-1).astype(np.int32)
    if len(vectors) != len(batch) or len(counts) != len(batch):
        raise EmbedClientError(f"server returned {len(vectors)} embeddings for {len(batch)} texts")
    return vectors, counts


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
