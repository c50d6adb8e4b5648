"""The gateway's errors: one hierarchy, its HTTP statuses and both APIs' envelopes, in one place.

Every failure of a request is raised as a :class:`GatewayError` (or, for a failure of the
transport, mapped to one by :func:`from_transport`: :data:`STATUS_OF_KIND`, one table over
:class:`~triton_embed.transport.failures.ErrorKind`) and rendered in the envelope of the API
the route belongs to:

* OpenAI (``/v1/...``): ``{"error": {"message", "type", "param", "code"}}``, the shape of
  OpenAI's API reference ("Error codes"), which the ``openai`` SDK reads into
  ``APIStatusError.body``.
* TEI (``/embed``, ``/tokenize``, ``/rerank`` with ``texts``, ...): ``{"error": "...",
  "error_type": "..."}``, text-embeddings-inference's ``ErrorResponse`` (``router/src/lib.rs``;
  ``error_type`` is one of its ``ErrorType`` names: ``Validation``, ``Empty``,
  ``Overloaded``, ``Backend``, ``Unhealthy``, plus ``Unauthorized`` and ``NotFound``, which
  TEI answers without a body).
* Cohere (``/v1/rerank``, ``/v2/rerank``, which Jina's API shares): ``{"message": "..."}``,
  the body of Cohere's error responses, which the ``cohere`` SDK puts in
  ``ApiError.body`` (it reads the status, not the body's fields). vLLM's ``/score`` and its
  ``/rerank`` (``documents``) answer in OpenAI's envelope, as vLLM does.

error (status): OpenAI ``type`` / ``code``; TEI ``error_type``

* :class:`BadRequest` (400): ``invalid_request_error`` / varies; ``Validation`` (``Empty``
  for an empty input list)
* :class:`Unauthorized` (401): ``invalid_request_error`` / ``invalid_api_key``;
  ``Unauthorized``
* :class:`Forbidden` (403): ``permission_error`` / ``model_not_allowed``; ``Unauthorized``
  (the tenant may not use that model)
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
* :class:`RateLimited` (429, ``Retry-After`` the seconds until the tenant's token bucket
  refills): ``tokens`` / ``rate_limit_exceeded``; ``Overloaded`` (the tenant is over its
  ``tokens_per_minute``, as OpenAI answers a rate limit: distinct from the server's overload)
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
from typing import Any, ClassVar

from triton_embed.transport.failures import ErrorKind, TransportError

#: Seconds a refused client is asked to wait (``Retry-After``) before sending again.
RETRY_AFTER_S = 1
#: The envelopes, by the API that uses them (a route's ``api``).
OPENAI, TEI, COHERE = "openai", "tei", "cohere"


class GatewayError(Exception):
    """A request's failure, with its HTTP status and both envelopes' fields.

    A subclass states its status and envelope fields as class arguments:
    ``class Overloaded(GatewayError, status=429, openai_type=..., code=..., tei_type=...)``.

    Attributes:
        message: what was wrong, the limit and what to change (the server's message when it
            came from the server).
        param: the request field at fault (OpenAI ``param``), or ``None``.
        code: OpenAI's ``code`` (a short machine-readable word), or the class default.
    """

    status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = "internal"
    tei_type: ClassVar[str] = "Backend"
    extra_headers: ClassVar[dict[str, str]] = {}

    def __init_subclass__(
        cls,
        *,
        status: int | None = None,
        openai_type: str | None = None,
        code: str | None = "",
        tei_type: str | None = None,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ):
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if openai_type is not None:
            cls.openai_type = openai_type
        if code != "":
            cls.default_code = code
        if tei_type is not None:
            cls.tei_type = tei_type
        if headers is not None:
            cls.extra_headers = headers

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code

    def headers(self) -> dict[str, str]:
        """Extra response headers (``Retry-After``, ``WWW-Authenticate``, ``Connection``)."""
        return dict(self.extra_headers)

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

    def cohere_body(self) -> dict[str, Any]:
        """Cohere's error envelope (also the ``/v1/rerank`` answer to Jina's clients)."""
        return {"message": self.message}


_INVALID = "invalid_request_error"
_RETRY_LATER = {"Retry-After": str(RETRY_AFTER_S)}
_BEARER = {"WWW-Authenticate": 'Bearer realm="triton-embed"'}


def _answer(
    status: int,
    code: str | None,
    tei_type: str,
    *,
    openai_type: str = _INVALID,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The class arguments of a :class:`GatewayError` subclass: its status and envelopes."""
    return {
        "status": status,
        "code": code,
        "tei_type": tei_type,
        "openai_type": openai_type,
        "headers": headers,
    }


class BadRequest(GatewayError, **_answer(400, None, "Validation")):
    """400: malformed JSON, a wrong field or type, or input the server refused."""


class EmptyInput(BadRequest, tei_type="Empty"):
    """400: an empty input list (TEI's ``Empty`` error type)."""


class Unauthorized(
    GatewayError, **_answer(401, "invalid_api_key", "Unauthorized", headers=_BEARER)
):
    """401: the ``Authorization: Bearer`` key is missing or wrong."""


class Forbidden(
    GatewayError,
    **_answer(403, "model_not_allowed", "Unauthorized", openai_type="permission_error"),
):
    """403: the request's tenant may not use the model it asked for."""


class NotFound(GatewayError, **_answer(404, "model_not_found", "NotFound")):
    """404: no upstream serves a model of that name or alias."""


class MethodNotAllowed(GatewayError, **_answer(405, "method_not_allowed", "Validation")):
    """405: a route asked with another HTTP method than its own."""


class RequestTimeout(
    GatewayError, **_answer(408, "request_timeout", "Validation", headers={"Connection": "close"})
):
    """408: the request's body did not arrive within the read timeout; the connection closes."""


class UnsupportedMediaType(GatewayError, **_answer(415, "unsupported_media_type", "Validation")):
    """415: the body is not declared JSON (``Content-Type``), as TEI answers."""


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


class TooLarge(GatewayError, **_answer(413, "payload_too_large", "Validation")):
    """413: too many inputs, or a body over the size limit."""


class Overloaded(
    GatewayError,
    **_answer(
        429, "overloaded", "Overloaded", openai_type="rate_limit_error", headers=_RETRY_LATER
    ),
):
    """429: too many requests in the gateway, or every upstream's queue is full."""


class RateLimited(
    GatewayError, **_answer(429, "rate_limit_exceeded", "Overloaded", openai_type="tokens")
):
    """429: the tenant is over its token rate; ``Retry-After`` says when it may send again.

    Args:
        message: what was wrong and what to do.
        retry_after_s: whole seconds until the tenant's bucket holds tokens again.
    """

    def __init__(self, message: str, *, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        """``Retry-After``: the seconds until the tenant may send again."""
        return {"Retry-After": str(self.retry_after_s)}


class UpstreamError(
    GatewayError, **_answer(502, "upstream_error", "Backend", openai_type="api_error")
):
    """502: an upstream failed the request for a reason of its own (engine error, ...)."""


class Unavailable(
    GatewayError,
    **_answer(
        503, "no_upstream", "Unhealthy", openai_type="service_unavailable", headers=_RETRY_LATER
    ),
):
    """503: no upstream is ready (or none has the model ready)."""


class Timeout(
    GatewayError, **_answer(504, "upstream_timeout", "Backend", openai_type="timeout_error")
):
    """504: the upstream did not answer within the gateway's deadline."""


class Internal(GatewayError):
    """500: a bug in the gateway; the message is short, the traceback goes to the log."""


#: The gateway's answer to each kind of transport failure: its class, and the OpenAI
#: ``code`` when it is not the class default.
STATUS_OF_KIND: dict[ErrorKind, tuple[type[GatewayError], str | None]] = {
    ErrorKind.INVALID_INPUT: (BadRequest, None),
    ErrorKind.OVER_BUDGET: (BadRequest, "too_many_tokens"),
    ErrorKind.OVERLOADED: (Overloaded, None),
    ErrorKind.TIMEOUT: (Timeout, None),
    ErrorKind.MODEL_MISSING: (Unavailable, None),
    ErrorKind.UNREACHABLE: (Unavailable, None),
    ErrorKind.NO_UPSTREAM: (Unavailable, None),
    ErrorKind.ACCESS_DENIED: (UpstreamError, None),
    ErrorKind.BAD_ANSWER: (UpstreamError, None),
    ErrorKind.OTHER: (UpstreamError, None),
}


#: The server steps' advice for an over-long input, as TEI's routes take it: TEI has no
#: ``truncation`` field, its ``truncate: true`` is what the request must send.
_TRUNCATION_ADVICE = re.compile(r"set the request parameter truncation=[\w]+(?:, \w+)*(?: or \w+)?")


def for_api(message: str, api: str | None) -> str:
    """``message`` of a server step with its advice in the words of ``api``'s fields.

    >>> for_api("it has 610 tokens; shorten it or set the request parameter "
    ...         "truncation=longest_first or only_second", TEI)
    'it has 610 tokens; shorten it or send "truncate": true'
    """
    if api == TEI:
        return _TRUNCATION_ADVICE.sub('send "truncate": true', message)
    return message


def from_transport(exc: TransportError, api: str | None = None) -> GatewayError:
    """The gateway error for a failure of the transport (an upstream call, a token budget).

    Args:
        exc: the failure.
        api: the route's API (:data:`TEI`, ...): the server's advice is put in its fields'
            words (:func:`for_api`).

    Returns:
        The :data:`STATUS_OF_KIND` class of its kind with its message: 400 for refused input
        (``param`` ``input``) or a token budget (``param`` the inputs' field, ``code``
        ``too_many_tokens``), 429 for a queue refusal, 504 for a deadline, 503 for an
        unreachable upstream, a model it lost or no ready upstream, 502 for anything else.
    """
    cls, code = STATUS_OF_KIND[exc.kind]
    param = exc.field or ("input" if exc.kind is ErrorKind.INVALID_INPUT else None)
    return cls(for_api(exc.message, api), param=param, code=code)
