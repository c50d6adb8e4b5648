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
    """Base class. ``code`` is the name of a ``pb_utils.TritonError`` code constant."""

    code = "INTERNAL"
    reason = "internal"


class InvalidArgumentError(EmbedServingError):
    """The request's data or options break the input contract (Triton ``INVALID_ARG``).

    Raised as is for a request option outside its allowed values; its subclasses name the
    other rules.
    """

    code = "INVALID_ARG"
    reason = "invalid_input"


class EmptyTextError(InvalidArgumentError):
    """A text is empty and the request did not opt in to empty texts."""

    reason = "empty"


class InvalidUtf8Error(InvalidArgumentError):
    """A text's bytes are not valid UTF-8."""

    reason = "invalid_utf8"


class TooLongError(InvalidArgumentError):
    """A text has more tokens than the model accepts and truncation is ``NONE``."""

    reason = "too_long"


class TextTooLargeError(TooLongError):
    """A text's UTF-8 bytes exceed the most any text the tokenizer accepts can have.

    Refused from the payload's size alone, before it is decoded (counted as ``too_long``).
    """


class InvalidTokenIdsError(InvalidArgumentError):
    """Token IDs sent to ``embedder`` are out of the vocabulary, too many, or malformed."""

    reason = "invalid_token_ids"


class TooMuchWorkError(InvalidArgumentError):
    """A request asks for more work than a step's budget (tokens per request, windows)."""

    reason = "too_much_work"


class CancelledError(EmbedServingError):
    """The request was cancelled (its client went away) before the engine ran it."""

    code = "CANCELLED"
    reason = "cancelled"


class EngineError(EmbedServingError):
    """The inference engine failed on a batch that passed validation."""

    code = "INTERNAL"
    reason = "engine_error"


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
