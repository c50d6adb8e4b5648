"""One exception hierarchy for the serving steps, mapped to Triton error codes in one place.

Every error that belongs to one request is raised as a subclass of :class:`EmbedServingError`
and turned into that request's ``pb_utils.InferenceResponse(error=...)`` by
:func:`to_triton_error`; the other requests of the same dynamic batch are still served.

These are server-side classes. The client library has its own errors
(:mod:`triton_embed.errors`): a request refused here with ``INVALID_ARG`` reaches a client
as :class:`triton_embed.errors.InvalidInputError`.
"""

from __future__ import annotations

from typing import Any


class EmbedServingError(Exception):
    """Base class. ``code`` is the name of a ``pb_utils.TritonError`` code constant.

    ``reason`` is the failure's label in the steps' metrics. A subclass sets either in its
    class line (``class X(InvalidArgumentError, reason="empty")``); what it leaves out it
    inherits.
    """

    code = "INTERNAL"
    reason = "internal"

    def __init_subclass__(cls, code: str | None = None, reason: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if reason is not None:
            cls.reason = reason


class InvalidArgumentError(EmbedServingError, code="INVALID_ARG", reason="invalid_input"):
    """The request's data or options break the input contract (Triton ``INVALID_ARG``).

    Raised as is for a request option outside its allowed values; its subclasses name the
    other rules.
    """


class EmptyTextError(InvalidArgumentError, reason="empty"):
    """A text is empty and the request did not opt in to empty texts."""


class InvalidUtf8Error(InvalidArgumentError, reason="invalid_utf8"):
    """A text's bytes are not valid UTF-8."""


class TooLongError(InvalidArgumentError, reason="too_long"):
    """A text has more tokens than the model accepts and truncation is ``NONE``."""


class TextTooLargeError(TooLongError):
    """A text's UTF-8 bytes exceed the most any text the tokenizer accepts can have.

    Refused from the payload's size alone, before it is decoded (counted as ``too_long``).
    """


class InvalidTokenIdsError(InvalidArgumentError, reason="invalid_token_ids"):
    """Token IDs sent to ``embedder`` are out of the vocabulary, too many, or malformed."""


class TooMuchWorkError(InvalidArgumentError, reason="too_much_work"):
    """A request asks for more work than a step's budget (tokens per request, windows)."""


class CancelledError(EmbedServingError, code="CANCELLED", reason="cancelled"):
    """The request was cancelled (its client went away) before the engine ran it."""


class EngineError(EmbedServingError, code="INTERNAL", reason="engine_error"):
    """The inference engine failed on a batch that passed validation."""


class QueueFullError(EmbedServingError, code="UNAVAILABLE", reason="queue_full"):
    """A batch-class request found the engine step's queue full (Triton's words: overload)."""

    def __init__(self, limit: int):
        super().__init__(
            f"Exceeds maximum queue size: {limit} batch-class requests already wait for this "
            "engine instance (the batch level's max_queue_size); send it again later, with backoff"
        )


class QueueTimeoutError(EmbedServingError, code="UNAVAILABLE", reason="queue_timeout"):
    """A batch-class request waited in the engine step's queue past its level's timeout."""

    def __init__(self, timeout_s: float):
        super().__init__(
            f"Request timeout expired: it waited more than {timeout_s:g} s for this engine "
            "instance (the batch level's default_timeout_microseconds); send it again later, "
            "with backoff, or send less at once"
        )


class UnloadingError(EmbedServingError, code="UNAVAILABLE", reason="unloading"):
    """The model instance stopped (unload, shutdown) before it ran the request."""

    def __init__(self):
        super().__init__(
            "the model instance stopped before it ran the request (unloaded or shutting "
            "down); send it again"
        )


def to_triton_error(exc: BaseException, pb_utils: Any) -> Any:
    """Map an exception to a ``pb_utils.TritonError`` (the one place codes are chosen).

    Args:
        exc: an :class:`EmbedServingError` (its ``code`` is used) or any other exception
            (reported as ``INTERNAL`` with its type name).
        pb_utils: the ``triton_python_backend_utils`` module of the running stub.

    Returns:
        ``pb_utils.TritonError`` with the message and code.
    """
    if isinstance(exc, EmbedServingError):
        code_name, message = exc.code, str(exc)
    else:
        code_name, message = "INTERNAL", f"{type(exc).__name__}: {exc}"
    code = getattr(pb_utils.TritonError, code_name, pb_utils.TritonError.INTERNAL)
    return pb_utils.TritonError(message, code)
