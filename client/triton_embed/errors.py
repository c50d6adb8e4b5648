"""The client library's errors; ``tritonclient`` exception types never reach the caller."""

from __future__ import annotations


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


# What Triton 2.51 answers (gRPC UNAVAILABLE) when a queue policy refuses a request; through
# the ensemble the message reads "in ensemble 'embed', [request id: <id_unknown>] Exceeds
# maximum queue size" or "in ensemble 'embed', Request timeout expired".
QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"


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
