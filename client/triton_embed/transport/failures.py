"""What went wrong on a call to a Triton server: one error kind per failure, read once.

:func:`classify` is the one place that reads a ``tritonclient`` error (an
``InferenceServerException`` of ``tritonclient.grpc`` or ``.grpc.aio``, a ``grpc`` error, or
any other exception raised by a call): its gRPC status, the server's message, and the index
of the text the tokenizer step named in it ("text 6 is empty ..."). Every user of the
transport maps the :class:`ErrorKind` to its own answer with one table: the client library
to its exception classes (:data:`triton_embed.errors.ERROR_CLASSES`), the HTTP gateway to
its statuses (``triton_embed_server.gateway.errors``).

:class:`TransportError` is what the asynchronous transport (the upstream pool and its
inference call, :mod:`~triton_embed.transport.inference`) raises: a kind, a message worded
for someone who called a pool of servers, and, for a refused text, its index in the texts
the caller passed.
"""

from __future__ import annotations

import enum
import re
from dataclasses import KW_ONLY, dataclass

from triton_embed.admin import is_refused

# What Triton 2.51 answers (gRPC UNAVAILABLE) when a queue policy refuses a request; through
# the ensemble the message reads "in ensemble 'embed', [request id: <id_unknown>] Exceeds
# maximum queue size" or "in ensemble 'embed', Request timeout expired".
QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"
#: Characters of a server's message carried into a pool's answer; the rest is cut (a server
#: that quotes a whole 100,000-character value must not make the gateway repeat it).
MAX_UPSTREAM_MESSAGE_CHARS = 1000
# "text N" (or "pair N", "sequence N") in a server message: N counts the texts (the
# query-document pairs, the token-ID sequences to decode) of that request, from 0 (the
# tokenizer step's wording, triton_embed_server.steps.errors; the pair tokenizer's: "the
# document of pair 3 is empty", "pair 3 has 600 tokens"; the decoder's "sequence 2 has ...").
_TEXT_INDEX = re.compile(r"\b(?:text|pair|sequence) (\d+)\b:? ?")
# Words of a connection that broke mid-call (gRPC UNKNOWN / CANCELLED / INTERNAL).
_BROKEN_CONNECTION = ("socket closed", "connection reset", "failed to connect", "broken pipe")


class ErrorKind(enum.Enum):
    """The kinds of failure of a call to a Triton server (or to a pool of them)."""

    #: The server refused the input (gRPC ``INVALID_ARGUMENT``, HTTP 400).
    INVALID_INPUT = "invalid_input"
    #: The request's texts are over its token budget (counted by the transport).
    OVER_BUDGET = "over_budget"
    #: A restricted API refused the call: the admin key is missing or wrong.
    ACCESS_DENIED = "access_denied"
    #: The call passed its deadline (gRPC ``DEADLINE_EXCEEDED``).
    TIMEOUT = "timeout"
    #: A step's queue is full, or the request timed out in it (gRPC ``UNAVAILABLE``).
    OVERLOADED = "overloaded"
    #: The server does not (or no longer) serve the model (gRPC ``NOT_FOUND``).
    MODEL_MISSING = "model_missing"
    #: The server cannot be reached, or the connection broke.
    UNREACHABLE = "unreachable"
    #: No server of the pool is ready, or none has the model READY.
    NO_UPSTREAM = "no_upstream"
    #: The server answered something the transport cannot read.
    BAD_ANSWER = "bad_answer"
    #: Any other failure of the server (an engine error, ...).
    OTHER = "other"


@dataclass(frozen=True)
class Failure:
    """A failed call, read once (:func:`classify`).

    Attributes:
        kind: what went wrong.
        raw_status: the status as ``tritonclient`` gives it (``StatusCode.UNAVAILABLE``,
            ``400``), or ``""`` for an error without one.
        message: the server's message, whole (``str(exc)`` for an error without one).
        index: for :attr:`ErrorKind.INVALID_INPUT`, the index of the text (or query-document
            pair) the message names, counted from the request's first; else ``None``.
        named_at: with ``index``, where "text N" stands in ``message``: the start and end
            of ``N``, and the end of the words naming the text.
    """

    kind: ErrorKind
    raw_status: str
    message: str
    index: int | None = None
    named_at: tuple[int, int, int] | None = None

    @property
    def status(self) -> str:
        """The gRPC status name (``UNAVAILABLE``), ``"400"``, or ``""`` without a status."""
        return self.raw_status.rsplit(".", 1)[-1]

    @property
    def reason(self) -> str | None:
        """With ``index``, what the message says of that text, else ``None``.

        Worded to follow "text": ``"is empty; send ..."``.
        """
        return None if self.named_at is None else self.message[self.named_at[2] :]

    def index_in(self, offset: int, size: int) -> int | None:
        """The named text's index in the caller's texts (``offset + index``), or ``None``.

        The request sent ``texts[offset : offset + size]``; ``None`` when the message names
        no text of the request.
        """
        if self.index is None or self.index >= size:
            return None
        return offset + self.index

    def renumbered(self, offset: int, size: int) -> str:
        """:attr:`message` with its "text N" ("pair N") counted in the caller's (``offset + N``).

        A message that names no text of the request (or with ``offset`` 0) is unchanged.
        """
        index = self.index_in(offset, size)
        if not offset or index is None or self.named_at is None:
            return self.message
        start, end, _ = self.named_at
        return f"{self.message[:start]}{index}{self.message[end:]}"


def status_name(exc: BaseException) -> str:
    """The gRPC status name of a ``tritonclient`` error, e.g. ``UNAVAILABLE`` ("" if none)."""
    return _raw_status(exc).rsplit(".", 1)[-1]


def _raw_status(exc: BaseException) -> str:
    status = exc.status() if callable(getattr(exc, "status", None)) else None
    return str(status or "")


def server_message(exc: BaseException) -> str:
    """The server's message of a ``tritonclient`` error, whole (``str(exc)`` for others)."""
    message = exc.message() if callable(getattr(exc, "message", None)) else None
    return str(message if message is not None else exc)


def short_message(text: str) -> str:
    """``text`` cut at :data:`MAX_UPSTREAM_MESSAGE_CHARS` characters, then how long it was."""
    if len(text) > MAX_UPSTREAM_MESSAGE_CHARS:
        return f"{text[:MAX_UPSTREAM_MESSAGE_CHARS]}... ({len(text)} characters)"
    return text


def classify(exc: BaseException) -> Failure:
    """The kind of a failed call, from its gRPC status and the server's message.

    In order: a restricted-API refusal (:func:`triton_embed.admin.is_refused`) is
    ``ACCESS_DENIED``; ``INVALID_ARGUMENT`` (HTTP ``400``) ``INVALID_INPUT``, with the index
    of the text the message names; ``DEADLINE_EXCEEDED`` (or "Deadline Exceeded")
    ``TIMEOUT``; ``UNAVAILABLE`` with a queue policy's message (:data:`QUEUE_FULL`,
    :data:`QUEUE_TIMEOUT`) ``OVERLOADED``; ``NOT_FOUND`` ``MODEL_MISSING``; any other
    ``UNAVAILABLE``, or ``UNKNOWN`` / ``CANCELLED`` / ``INTERNAL`` (or no status) of a
    connection that broke ("Socket closed", "Connection reset", "failed to connect",
    "Broken pipe") ``UNREACHABLE``; the rest ``OTHER``.

    Args:
        exc: the error a call raised.
    """
    raw = _raw_status(exc)
    status = raw.rsplit(".", 1)[-1]
    message = server_message(exc)
    lowered = message.lower()

    def failure(kind: ErrorKind) -> Failure:
        return Failure(kind, raw, message)

    if is_refused(message):
        return failure(ErrorKind.ACCESS_DENIED)
    if status in ("INVALID_ARGUMENT", "400"):
        found = _TEXT_INDEX.search(message)
        if found is None:
            return failure(ErrorKind.INVALID_INPUT)
        named_at = (*found.span(1), found.end())
        return Failure(ErrorKind.INVALID_INPUT, raw, message, int(found.group(1)), named_at)
    if status == "DEADLINE_EXCEEDED" or not status and "Deadline Exceeded" in message:
        return failure(ErrorKind.TIMEOUT)
    if status == "UNAVAILABLE" and (QUEUE_FULL in message or QUEUE_TIMEOUT in message):
        return failure(ErrorKind.OVERLOADED)
    if status == "NOT_FOUND":
        return failure(ErrorKind.MODEL_MISSING)
    if status == "UNAVAILABLE":
        return failure(ErrorKind.UNREACHABLE)
    if status in ("UNKNOWN", "CANCELLED", "INTERNAL", "") and any(
        marker in lowered for marker in _BROKEN_CONNECTION
    ):
        return failure(ErrorKind.UNREACHABLE)
    return failure(ErrorKind.OTHER)


@dataclass(eq=False)
class TransportError(Exception):
    """A failure of the asynchronous transport (the upstream pool, its inference call).

    Attributes:
        kind: what went wrong (:class:`ErrorKind`).
        message: what was wrong and what to do, worded for a caller of a pool of servers
            (the server's message, cut at :data:`MAX_UPSTREAM_MESSAGE_CHARS`, inside).
        index: for a refused text, its index in the texts the caller passed; else ``None``.
        field: the request field at fault (the inputs' field of a token budget), or ``None``.
    """

    kind: ErrorKind
    message: str
    _: KW_ONLY
    index: int | None = None
    field: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __reduce__(self) -> tuple:
        """Copies and pickles keep the kind, the index and the field."""
        return (type(self), (self.kind, self.message), {"index": self.index, "field": self.field})


def upstream_error(exc: BaseException, *, offset: int = 0, size: int = 0) -> TransportError:
    """The :class:`TransportError` of a pool call that failed (after any retry).

    Args:
        exc: the error of the call's last attempt.
        offset: index in the caller's texts of the failed piece's first text.
        size: texts in that piece.

    Returns:
        ``INVALID_INPUT`` with the server's message, its "text N" counted in the caller's
        texts; ``OVERLOADED``, ``TIMEOUT``, ``MODEL_MISSING`` and ``UNREACHABLE`` saying what
        the pool met; anything else (a refused admin key included) ``OTHER``, with the
        server's status and message.
    """
    if isinstance(exc, TransportError):
        return exc
    failure = classify(exc)
    kind = failure.kind
    message = short_message(failure.message)
    if kind is ErrorKind.INVALID_INPUT:
        return TransportError(
            kind,
            short_message(failure.renumbered(offset, size)),
            index=failure.index_in(offset, size),
        )
    wording = {
        ErrorKind.OVERLOADED: (
            f"every upstream is overloaded and refused the request ({message}); retry later, "
            "with backoff"
        ),
        ErrorKind.TIMEOUT: f"the upstream did not answer in time: {message}",
        ErrorKind.MODEL_MISSING: f"no upstream has the model ready: {message}",
        ErrorKind.UNREACHABLE: f"no upstream could be reached: {message}",
    }
    if kind in wording:
        return TransportError(kind, wording[kind])
    status = failure.status or "error"
    return TransportError(
        ErrorKind.OTHER, f"the upstream failed the request: {status} {message}".strip()
    )
