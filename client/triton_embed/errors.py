"""The client library's errors; ``tritonclient`` exception types never reach the caller.

:func:`map_error` translates a failed call: the transport reads its kind once
(:func:`triton_embed.transport.failures.classify`) and :data:`ERROR_CLASSES`, a table over
that kind, picks the class; a rejected text is named by its index in the caller's texts.
"""

from __future__ import annotations

from triton_embed.transport.failures import (
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    ErrorKind,
    Failure,
    TransportError,
    classify,
)

__all__ = [
    "QUEUE_FULL",
    "QUEUE_TIMEOUT",
    "ERROR_CLASSES",
    "AccessDeniedError",
    "EmbedClientError",
    "EmbedTimeoutError",
    "InvalidInputError",
    "ServerOverloadedError",
    "ServerUnavailableError",
    "from_transport",
    "map_error",
]


class EmbedClientError(Exception):
    """Base class of every error the client library raises."""


class InvalidInputError(EmbedClientError, ValueError):
    """The input was rejected; the message says what and why.

    Raised when the server answers ``INVALID_ARG`` (gRPC ``INVALID_ARGUMENT``, HTTP 400:
    a text breaks the input contract, or a request option has a value outside those of
    :mod:`triton_embed.options`), and when the client refuses an argument before sending.

    Attributes:
        index: when the error is about one text, its index in the texts given to
            :meth:`~triton_embed.client.EmbeddingClient.embed` (the server counts texts from
            the start of each request; the client adds the request's offset); else ``None``.
        reason: when ``index`` is set, what is wrong with that text, worded to follow
            "text", e.g. ``"is empty; send at least one character, or set the request
            parameter allow_empty=true to embed it"``; else ``None``.
        server_message: the server's message as it sent it; ``None`` when the client
            refused the input before sending.
    """

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        reason: str | None = None,
        server_message: str | None = None,
    ):
        super().__init__(message)
        self.index = index
        self.reason = reason
        self.server_message = server_message


class ServerUnavailableError(EmbedClientError, ConnectionError):
    """The server cannot be reached or the model is not ready."""


class ServerOverloadedError(ServerUnavailableError):
    """The server is overloaded and refused the request; retry later, with backoff.

    Past capacity a step of the ensemble refuses a request instead of queueing it: gRPC
    ``UNAVAILABLE`` with Triton's message "Exceeds maximum queue size" (its queue is full),
    or "Request timeout expired" (it waited in the queue longer than the queue policy's
    timeout); see docs/configuration.md, "Queue policy". Nothing of the request was embedded,
    so sending it again is safe. :class:`~triton_embed.client.EmbeddingClient` does so with
    exponential backoff and jitter (:class:`~triton_embed.retry.RetryPolicy`) and raises
    this error when its retries run out. A subclass of :class:`ServerUnavailableError`, so
    code that handles that handles this too.
    """


class EmbedTimeoutError(EmbedClientError, TimeoutError):
    """A request exceeded its deadline (``timeout_s``)."""


class AccessDeniedError(EmbedClientError, PermissionError):
    """The server refused a restricted API call: the admin key is missing or wrong.

    Reading a model's config and loading or unloading models need the admin key
    (:mod:`triton_embed.admin`); inference does not.
    """


#: The client's exception class of each kind of failure.
ERROR_CLASSES: dict[ErrorKind, type[EmbedClientError]] = {
    ErrorKind.INVALID_INPUT: InvalidInputError,
    ErrorKind.OVER_BUDGET: InvalidInputError,
    ErrorKind.ACCESS_DENIED: AccessDeniedError,
    ErrorKind.TIMEOUT: EmbedTimeoutError,
    ErrorKind.OVERLOADED: ServerOverloadedError,
    ErrorKind.UNREACHABLE: ServerUnavailableError,
    ErrorKind.NO_UPSTREAM: ServerUnavailableError,
    ErrorKind.MODEL_MISSING: EmbedClientError,
    ErrorKind.BAD_ANSWER: EmbedClientError,
    ErrorKind.OTHER: EmbedClientError,
}

#: What every "cannot reach the server" error adds: a common cause is the wrong port.
URL_HINT = (
    "check that the server runs and that the URL is host:port of its gRPC port (8001 by "
    "default), not of its HTTP port (8000 by default)"
)


def map_error(
    exc: BaseException,
    url: str,
    offset: int | None = None,
    size: int | None = None,
    *,
    items: str = "texts",
) -> EmbedClientError:
    """Translate a ``tritonclient`` exception into this library's error types.

    Args:
        exc: the exception.
        url: the server's URL (for the message).
        offset: index in the caller's texts of the request's first text, if a request failed.
        size: texts in that request.
        items: what the caller passed, as the messages name it: ``texts``, or ``documents``
            for a rerank call (the server's "pair N" is ``documents[offset + N]``).

    Returns:
        The :data:`ERROR_CLASSES` class of the failure's kind, with a message naming the
        request's texts and the server.
    """
    failure = classify(exc)
    message = failure.message
    where = f"{items}[{offset}:{offset + size}]: " if offset is not None and size else ""
    kind = failure.kind
    if kind is ErrorKind.INVALID_INPUT:
        return _invalid_input(failure, where, offset, size, items)
    wording = {
        ErrorKind.ACCESS_DENIED: (
            f"{where}server at {url} refused the call: no admin key was sent, or not the "
            f"server's ({message})"
        ),
        ErrorKind.TIMEOUT: f"{where}request to {url} timed out: {message}",
        ErrorKind.OVERLOADED: (
            f"{where}server at {url} is overloaded and refused the request ({message}); "
            "retry later, with backoff"
        ),
        ErrorKind.UNREACHABLE: f"server at {url} is unavailable: {message}; {URL_HINT}",
    }
    if kind in wording:
        return ERROR_CLASSES[kind](wording[kind])
    return ERROR_CLASSES[kind](f"{where}{failure.raw_status} {message}".strip())


#: How the server names one of the caller's items in a request: ``texts`` by "text N", the
#: ``documents`` of a rerank call by "pair N" (one query-document pair per document), the
#: ``ids`` of a decode call by "sequence N".
_UNITS = {"texts": "text", "documents": "pair", "ids": "sequence"}


def _invalid_input(
    failure: Failure, where: str, offset: int | None, size: int | None, items: str = "texts"
) -> InvalidInputError:
    """The server's ``INVALID_ARGUMENT``, naming the text by its index in the caller's texts.

    The server names a text by its index in the request ("text 6 is empty ..."); a request
    holds ``texts[offset : offset + size]``, so the text is ``texts[offset + 6]``. A message
    with no such index (a whole-request error), or with one outside the request, is kept
    under the request's range.
    """
    message = failure.message
    index = None if offset is None or not size else failure.index_in(offset, size)
    if index is None:
        return InvalidInputError(f"{where}{message}", server_message=message)
    note = (
        f" ({_UNITS.get(items, 'item')} {failure.index} of the request that sent "
        f"{items}[{offset}:{offset + size}])"
        if offset
        else ""
    )
    return InvalidInputError(
        f"{items}[{index}] was rejected: {message}{note}",
        index=index,
        reason=failure.reason,
        server_message=message,
    )


def from_transport(exc: TransportError) -> EmbedClientError:
    """The client's error for a failure of the asynchronous transport (the upstream pool).

    The :data:`ERROR_CLASSES` class of its kind, with its message; a refused text keeps its
    index (``InvalidInputError.index``).
    """
    cls = ERROR_CLASSES[exc.kind]
    if cls is InvalidInputError:
        return InvalidInputError(exc.message, index=exc.index)
    return cls(exc.message)
