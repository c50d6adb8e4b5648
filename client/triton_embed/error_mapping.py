"""Translating ``tritonclient`` exceptions into this library's errors (one place).

:func:`map_error` picks the :mod:`triton_embed.errors` class from the gRPC status and the
server's message, and names a rejected text by its index in the caller's texts.
"""

from __future__ import annotations

import re

from triton_embed.admin import is_refused
from triton_embed.errors import (
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    AccessDeniedError,
    EmbedClientError,
    EmbedTimeoutError,
    InvalidInputError,
    ServerOverloadedError,
    ServerUnavailableError,
)

#: What every "cannot reach the server" error adds: a common cause is the wrong port.
URL_HINT = (
    "check that the server runs and that the URL is host:port of its gRPC port (8001 by "
    "default), not of its HTTP port (8000 by default)"
)
# "text N" in a server message: N counts the texts of that request, from 0.
_SERVER_TEXT_INDEX = re.compile(r"\btext (\d+)\b:? ?")


def map_error(
    exc: BaseException, url: str, offset: int | None = None, size: int | None = None
) -> EmbedClientError:
    """Translate a ``tritonclient`` exception into this library's error types.

    Args:
        exc: the exception.
        url: the server's URL (for the message).
        offset: index in the caller's texts of the request's first text, if a request failed.
        size: texts in that request.
    """
    status = ""
    message = str(exc)
    if hasattr(exc, "status") and callable(exc.status):
        status = str(exc.status() or "")
        message = exc.message() if hasattr(exc, "message") else message
    where = f"texts[{offset}:{offset + size}]: " if offset is not None and size else ""
    if is_refused(message):  # gRPC UNAVAILABLE, but the server is up: the key is missing/wrong
        return AccessDeniedError(
            f"{where}server at {url} refused the call: no admin key was sent, or not the "
            f"server's ({message})"
        )
    if "INVALID_ARGUMENT" in status or "400" == status:
        return _invalid_input(message, where, offset, size)
    if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
        return EmbedTimeoutError(f"{where}request to {url} timed out: {message}")
    if "UNAVAILABLE" in status and (QUEUE_FULL in message or QUEUE_TIMEOUT in message):
        return ServerOverloadedError(
            f"{where}server at {url} is overloaded and refused the request ({message}); "
            "retry later, with backoff"
        )
    if "UNAVAILABLE" in status or "failed to connect" in message.lower():
        return ServerUnavailableError(f"server at {url} is unavailable: {message}; {URL_HINT}")
    return EmbedClientError(f"{where}{status} {message}".strip())


def _invalid_input(
    message: str, where: str, offset: int | None, size: int | None
) -> InvalidInputError:
    """The server's ``INVALID_ARGUMENT``, naming the text by its index in the caller's texts.

    The server names a text by its index in the request ("text 6 is empty ..."); a request
    holds ``texts[offset : offset + size]``, so the text is ``texts[offset + 6]``. A message
    with no such index (a whole-request error), or with one outside the request, is kept
    under the request's range.
    """
    found = _SERVER_TEXT_INDEX.search(message)
    if offset is None or not size or found is None or int(found.group(1)) >= size:
        return InvalidInputError(f"{where}{message}", server_message=message)
    in_request = int(found.group(1))
    index = offset + in_request
    note = (
        f" (text {in_request} of the request that sent texts[{offset}:{offset + size}])"
        if offset
        else ""
    )
    return InvalidInputError(
        f"texts[{index}] was rejected: {message}{note}",
        index=index,
        reason=message[found.end() :],
        server_message=message,
    )
