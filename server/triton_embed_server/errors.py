"""One exception hierarchy for the serving steps, mapped to Triton error codes in one place.

Every error that belongs to one request is raised as a subclass of :class:`EmbedServingError`
and turned into that request's ``pb_utils.InferenceResponse(error=...)`` by
:func:`to_triton_error`; the other requests of the same dynamic batch are still served.
"""

from __future__ import annotations

from typing import Any


class EmbedServingError(Exception):
    """Base class. ``code`` is the name of a ``pb_utils.TritonError`` code constant."""

    code = "INTERNAL"
    reason = "internal"


class InvalidInputError(EmbedServingError):
    """The request's data breaks the input contract (KServe v2 ``INVALID_ARG``)."""

    code = "INVALID_ARG"
    reason = "invalid_input"


class EmptyTextError(InvalidInputError):
    """A text is empty and the request did not opt in to empty texts."""

    reason = "empty"


class InvalidUtf8Error(InvalidInputError):
    """A text's bytes are not valid UTF-8."""

    reason = "invalid_utf8"


class TooLongError(InvalidInputError):
    """A text has more tokens than the model accepts and truncation is ``NONE``."""

    reason = "too_long"


class InvalidTokenIdsError(InvalidInputError):
    """Token IDs sent to ``embedder`` are out of the vocabulary, too many, or malformed."""

    reason = "invalid_token_ids"


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
