"""The gateway's errors: one hierarchy, its HTTP statuses and both APIs' envelopes, in one place.

Every failure of a request is raised as a :class:`GatewayError` (or mapped to one by
:func:`from_upstream`) and rendered in the envelope of the API the route belongs to:

* OpenAI (``/v1/...``): ``{"error": {"message", "type", "param", "code"}}``, the shape of
  OpenAI's API reference ("Error codes"), which the ``openai`` SDK reads into
  ``APIStatusError.body``.
* TEI (``/embed``, ``/tokenize``, ...): ``{"error": "...", "error_type": "..."}``,
  text-embeddings-inference's ``ErrorResponse`` (``router/src/lib.rs``; ``error_type`` is
  one of its ``ErrorType`` names: ``Validation``, ``Empty``, ``Overloaded``, ``Backend``,
  ``Unhealthy``, plus ``Unauthorized`` and ``NotFound``, which TEI answers without a body).

error (status): OpenAI ``type`` / ``code``; TEI ``error_type``

* :class:`BadRequest` (400): ``invalid_request_error`` / varies; ``Validation`` (``Empty``
  for an empty input list)
* :class:`Unauthorized` (401): ``invalid_request_error`` / ``invalid_api_key``;
  ``Unauthorized``
* :class:`NotFound` (404): ``invalid_request_error`` / ``model_not_found`` (or
  ``unknown_route``); ``NotFound``
* :class:`MethodNotAllowed` (405): ``invalid_request_error`` / ``method_not_allowed``;
  ``Validation``
* :class:`RequestTimeout` (408): ``invalid_request_error`` / ``request_timeout``;
  ``Validation`` (the body did not arrive in time; the connection is closed)
* :class:`TooLarge` (413): ``invalid_request_error`` / ``payload_too_large`` or
  ``too_many_inputs``; ``Validation``
* :class:`UnsupportedMediaType` (415): ``invalid_request_error`` /
  ``unsupported_media_type``; ``Validation``
* :class:`Overloaded` (429): ``rate_limit_error`` / ``overloaded``; ``Overloaded``
* :class:`Internal` (500): ``server_error`` / ``internal``; ``Backend``
* :class:`UpstreamError` (502): ``api_error`` / ``upstream_error``; ``Backend``
* :class:`Unavailable` (503): ``service_unavailable`` / ``no_upstream``; ``Unhealthy``
* :class:`Timeout` (504): ``timeout_error`` / ``upstream_timeout``; ``Backend``

TEI itself answers validation errors with 422 and backend errors with 424; the gateway uses
the same statuses on both APIs (400 and 502), so one status means one thing.
"""

from __future__ import annotations

import re
from typing import Any

from triton_embed.admin import is_refused
from triton_embed.errors import QUEUE_FULL, QUEUE_TIMEOUT

#: Seconds a refused client is asked to wait (``Retry-After``) before sending again.
RETRY_AFTER_S = 1

# "text N" in a server message: N counts the texts of that request (a piece), from 0.
_TEXT_INDEX = re.compile(r"\btext (\d+)\b")


class GatewayError(Exception):
    """A request's failure, with its HTTP status and both envelopes' fields.

    Attributes:
        message: what was wrong, the limit and what to change (the server's message when it
            came from the server).
        param: the request field at fault (OpenAI ``param``), or ``None``.
        code: OpenAI's ``code`` (a short machine-readable word), or the class default.
    """

    status = 500
    openai_type = "server_error"
    default_code: str | None = "internal"
    tei_type = "Backend"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code

    def headers(self) -> dict[str, str]:
        """Extra response headers (``Retry-After``, ``WWW-Authenticate``)."""
        return {}

    def openai_body(self) -> dict[str, Any]:
        """OpenAI's error envelope."""
        return {
            "error": {
                "message": self.message,
                "type": self.openai_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def tei_body(self) -> dict[str, Any]:
        """TEI's error envelope."""
        return {"error": self.message, "error_type": self.tei_type}


class BadRequest(GatewayError):
    """400: malformed JSON, a wrong field or type, or input the server refused."""

    status = 400
    openai_type = "invalid_request_error"
    default_code = None
    tei_type = "Validation"


class EmptyInput(BadRequest):
    """400: an empty input list (TEI's ``Empty`` error type)."""

    tei_type = "Empty"


class Unauthorized(GatewayError):
    """401: the ``Authorization: Bearer`` key is missing or wrong."""

    status = 401
    openai_type = "invalid_request_error"
    default_code = "invalid_api_key"
    tei_type = "Unauthorized"

    def headers(self) -> dict[str, str]:  # noqa: D102
        return {"WWW-Authenticate": 'Bearer realm="triton-embed"'}


class NotFound(GatewayError):
    """404: no upstream serves a model of that name or alias."""

    status = 404
    openai_type = "invalid_request_error"
    default_code = "model_not_found"
    tei_type = "NotFound"


class MethodNotAllowed(GatewayError):
    """405: a route asked with another HTTP method than its own."""

    status = 405
    openai_type = "invalid_request_error"
    default_code = "method_not_allowed"
    tei_type = "Validation"


class RequestTimeout(GatewayError):
    """408: the request's body did not arrive within the read timeout; the connection closes."""

    status = 408
    openai_type = "invalid_request_error"
    default_code = "request_timeout"
    tei_type = "Validation"

    def headers(self) -> dict[str, str]:  # noqa: D102
        return {"Connection": "close"}


class UnsupportedMediaType(GatewayError):
    """415: the body is not declared JSON (``Content-Type``), as TEI answers."""

    status = 415
    openai_type = "invalid_request_error"
    default_code = "unsupported_media_type"
    tei_type = "Validation"


class ClientGone(Exception):
    """The HTTP client disconnected before its answer (nginx's 499): nothing is sent."""


#: The status counted (never sent) for a request whose client went away: nginx's 499.
CLIENT_CLOSED_REQUEST = 499
#: Characters of an offending value quoted in a message (:func:`quote`).
QUOTE_CHARS = 64


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``value`` for an error message, at most about ``limit`` characters, never recursing.

    Strings are quoted (``repr``) up to ``limit`` characters and then say how long they are;
    numbers, booleans and ``null`` as JSON writes them (a huge integer by its digit count);
    a list or an object by its kind and size only (it may be nested thousands deep).

    >>> quote("x" * 100, 8)
    "'xxxxxxxx'... (100 characters)"
    >>> quote([1, 2])
    'a list of 2 items'
    """
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value)} characters)"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, int):
        if value.bit_length() <= 128:  # at most 39 digits: written out
            return str(value)
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"an object of {len(value)} fields"
    return type(value).__name__


class TooLarge(GatewayError):
    """413: too many inputs, or a body over the size limit."""

    status = 413
    openai_type = "invalid_request_error"
    default_code = "payload_too_large"
    tei_type = "Validation"


class Overloaded(GatewayError):
    """429: too many requests in the gateway, or every upstream's queue is full."""

    status = 429
    openai_type = "rate_limit_error"
    default_code = "overloaded"
    tei_type = "Overloaded"

    def headers(self) -> dict[str, str]:  # noqa: D102
        return {"Retry-After": str(RETRY_AFTER_S)}


class UpstreamError(GatewayError):
    """502: an upstream failed the request for a reason of its own (engine error, ...)."""

    status = 502
    openai_type = "api_error"
    default_code = "upstream_error"
    tei_type = "Backend"


class Unavailable(GatewayError):
    """503: no upstream is ready (or none has the model ready)."""

    status = 503
    openai_type = "service_unavailable"
    default_code = "no_upstream"
    tei_type = "Unhealthy"

    def headers(self) -> dict[str, str]:  # noqa: D102
        return {"Retry-After": str(RETRY_AFTER_S)}


class Timeout(GatewayError):
    """504: the upstream did not answer within the gateway's deadline."""

    status = 504
    openai_type = "timeout_error"
    default_code = "upstream_timeout"
    tei_type = "Backend"


class Internal(GatewayError):
    """500: a bug in the gateway; the message is short, the traceback goes to the log."""


def upstream_status(exc: BaseException) -> str:
    """The gRPC status name of a ``tritonclient`` error, e.g. ``UNAVAILABLE`` ("" if none)."""
    status = exc.status() if callable(getattr(exc, "status", None)) else None
    return str(status or "").rsplit(".", 1)[-1]


#: Characters of a server's message carried into an answer; the rest is cut (a server that
#: quotes a whole 100,000-character value must not make the gateway repeat it).
MAX_UPSTREAM_MESSAGE_CHARS = 1000


def upstream_message(exc: BaseException) -> str:
    """The server's message of a ``tritonclient`` error (``str(exc)`` for anything else).

    At most :data:`MAX_UPSTREAM_MESSAGE_CHARS` characters, then how long it was.
    """
    message = exc.message() if callable(getattr(exc, "message", None)) else None
    text = str(message if message is not None else exc)
    if len(text) > MAX_UPSTREAM_MESSAGE_CHARS:
        return f"{text[:MAX_UPSTREAM_MESSAGE_CHARS]}... ({len(text)} characters)"
    return text


def is_queue_refusal(exc: BaseException) -> bool:
    """The upstream refused the request because a step's queue is full (or timed out in it).

    Triton answers both with gRPC ``UNAVAILABLE`` and the queue policy's message
    (:data:`triton_embed.errors.QUEUE_FULL`, :data:`~triton_embed.errors.QUEUE_TIMEOUT`):
    the server is up and nothing was embedded.
    """
    message = upstream_message(exc)
    return upstream_status(exc) == "UNAVAILABLE" and (
        QUEUE_FULL in message or QUEUE_TIMEOUT in message
    )


def is_connection_failure(exc: BaseException) -> bool:
    """The upstream could not be reached or went away (not a refusal by a running server).

    gRPC ``UNAVAILABLE`` other than a queue refusal or a restricted-API refusal, and
    ``CANCELLED`` / ``UNKNOWN`` errors of a connection that broke mid-call ("Socket closed",
    "Connection reset").
    """
    status = upstream_status(exc)
    message = upstream_message(exc)
    if status == "UNAVAILABLE":
        return not is_queue_refusal(exc) and not is_refused(message)
    lowered = message.lower()
    return status in ("UNKNOWN", "CANCELLED", "INTERNAL") and any(
        marker in lowered
        for marker in ("socket closed", "connection reset", "failed to connect", "broken pipe")
    )


def is_model_missing(exc: BaseException) -> bool:
    """The upstream does not (or no longer) serve the model: gRPC ``NOT_FOUND``."""
    return upstream_status(exc) == "NOT_FOUND"


def text_index(message: str) -> int | None:
    """The index of the text a server message names ("text 6 is empty ..."), or ``None``."""
    found = _TEXT_INDEX.search(message)
    return int(found.group(1)) if found else None


def rebase_text_index(message: str, offset: int, size: int) -> str:
    """A server message about "text N" of a piece, renumbered to the index in the request.

    The gateway sends ``input[offset : offset + size]`` as one upstream request, and the
    server names a text by its index in that request ("text 6 is empty ..."); the client
    knows it as ``offset + 6``. A number outside the piece is left alone.
    """
    found = _TEXT_INDEX.search(message)
    if not offset or found is None or int(found.group(1)) >= size:
        return message
    index = int(found.group(1)) + offset
    return f"{message[: found.start(1)]}{index}{message[found.end(1) :]}"


def from_upstream(exc: BaseException, *, offset: int = 0, size: int = 0) -> GatewayError:
    """The gateway error for an upstream call that failed (after any retry).

    Args:
        exc: the ``tritonclient`` error.
        offset: index in the request's inputs of the failed piece's first input.
        size: inputs in that piece.

    Returns:
        400 for ``INVALID_ARGUMENT`` (the server's message, its text index made the
        request's), 429 for a queue refusal, 504 for a deadline, 503 for an unreachable
        upstream or a model it lost, 502 for anything else (the server's message).
    """
    if isinstance(exc, GatewayError):
        return exc
    status = upstream_status(exc)
    message = upstream_message(exc)
    if status == "INVALID_ARGUMENT":
        return BadRequest(rebase_text_index(message, offset, size), param="input")
    if is_queue_refusal(exc):
        return Overloaded(
            f"every upstream is overloaded and refused the request ({message}); retry later, "
            "with backoff"
        )
    if status == "DEADLINE_EXCEEDED":
        return Timeout(f"the upstream did not answer in time: {message}")
    if is_model_missing(exc):
        return Unavailable(f"no upstream has the model ready: {message}")
    if is_connection_failure(exc):
        return Unavailable(f"no upstream could be reached: {message}")
    return UpstreamError(f"the upstream failed the request: {status or 'error'} {message}".strip())
