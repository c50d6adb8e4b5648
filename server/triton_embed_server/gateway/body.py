"""Reading a request's body: declared JSON, bounded in size, time and nesting, then parsed.

Every ``POST`` route's body goes through :func:`read_json_body`, in this order, before the
request takes an in-flight slot (:mod:`~triton_embed_server.gateway.app`):

1. ``Content-Type`` (:func:`check_content_type`): ``application/json`` or
   ``application/<anything>+json``, with no ``charset`` or ``charset=utf-8`` (JSON is UTF-8,
   RFC 8259). Anything else, or none, is 415, as TEI (axum's ``Json`` extractor) answers:
   the forms a browser may send cross-site without a CORS preflight (``text/plain``, form,
   multipart) never reach the handlers.
2. Size (:func:`read_body`): a ``Content-Length`` over the limit is 413 before any byte is
   read; a chunked body is 413 as soon as it passes the limit. At most the limit is ever held.
3. Time: the whole body must arrive within ``--body-timeout-s`` plus one second per
   :data:`BODY_MIN_RATE_BPS` bytes received (Apache ``mod_reqtimeout``'s ``body=20,MinRate=``
   rule): a silent or trickling body is 408 and its connection is closed (``Connection:
   close``), like nginx's ``client_body_timeout``; a large body sent at a normal rate always
   fits. (Headers have their own timeout, :mod:`~triton_embed_server.gateway.protocol`.)
4. Nesting (:func:`check_depth`): more than :data:`MAX_JSON_DEPTH` levels of ``[``/``{`` is
   400 before parsing (TEI's ``serde_json`` stops at 128 too); the APIs' bodies need 3.
5. ``orjson.loads``; anything that is not JSON is 400 with the parser's message.

A client that disconnects while its body is read raises :class:`~.errors.ClientGone`.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
import orjson
from starlette.requests import ClientDisconnect, Request

from triton_embed_server.gateway.errors import (
    BadRequest,
    ClientGone,
    RequestTimeout,
    TooLarge,
    UnsupportedMediaType,
    quote,
)

#: The deepest nesting of arrays and objects accepted (TEI's ``serde_json`` limit, 128).
MAX_JSON_DEPTH = 128
#: Bytes per second a body must keep up beyond ``--body-timeout-s`` (64 KiB/s: the largest
#: body, :data:`~triton_embed_server.gateway.settings.DEFAULT_MAX_BODY_BYTES`, gets
#: ``--body-timeout-s`` + 513 s).
BODY_MIN_RATE_BPS = 64 * 1024
#: What ``Content-Type`` must say (case-insensitive), as the 415 message states it.
JSON_MEDIA_TYPES = "application/json or application/<type>+json, charset utf-8 if any"

# A JSON string (the unrolled-loop form: linear, no backtracking), and a table keeping only
# the bytes of brackets and braces.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def check_content_type(value: str | None) -> None:
    """Let a body declared JSON through (:data:`JSON_MEDIA_TYPES`).

    Args:
        value: the request's ``Content-Type`` header, if any.

    Raises:
        UnsupportedMediaType: no header, another media type, or another charset.
    """
    media, _, params = (value or "").partition(";")
    kind, _, subtype = media.strip().lower().partition("/")
    if kind == "application" and (subtype == "json" or subtype.endswith("+json")):
        charset = ""
        for param in params.split(";"):
            name, _, text = param.partition("=")
            if name.strip().lower() == "charset":
                charset = text.strip().strip('"').lower()
        if charset in ("", "utf-8", "utf8"):
            return
        raise UnsupportedMediaType(
            f"the request body is declared charset={quote(charset)}; JSON is UTF-8: send "
            "'Content-Type: application/json' (or charset=utf-8)"
        )
    declared = "no Content-Type" if value is None else f"Content-Type {quote(value)}"
    raise UnsupportedMediaType(
        f"the request has {declared}; the gateway reads JSON bodies only: send "
        "'Content-Type: application/json'"
    )


def _too_large(limit_bytes: int, size: str) -> TooLarge:
    return TooLarge(
        f"the request body is {size}; the gateway accepts at most {limit_bytes} bytes "
        f"({limit_bytes / 2**20:g} MiB, --max-body-mb); send fewer or shorter inputs per "
        "request"
    )


async def read_body(request: Request, limit_bytes: int, timeout_s: float) -> bytes:
    """The request's body, at most ``limit_bytes`` long, read within its time limit.

    Args:
        request: the request, body not yet read.
        limit_bytes: the largest body (``--max-body-mb``).
        timeout_s: ``--body-timeout-s``: seconds for the body, plus one per
            :data:`BODY_MIN_RATE_BPS` bytes received.

    Raises:
        TooLarge: ``Content-Length`` or the bytes received pass ``limit_bytes``.
        BadRequest: ``Content-Length`` is not a number.
        RequestTimeout: the body did not arrive in time.
        ClientGone: the client disconnected.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise BadRequest(f"Content-Length {quote(declared)} is not a number") from None
        if length > limit_bytes:
            raise _too_large(limit_bytes, f"{length} bytes (Content-Length)")
    chunks: list[bytes] = []
    received = 0
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            async for chunk in request.stream():
                received += len(chunk)
                if received > limit_bytes:
                    raise _too_large(limit_bytes, f"over {limit_bytes} bytes")
                chunks.append(chunk)
                extra_s = received / BODY_MIN_RATE_BPS
                deadline.reschedule(started + timeout_s + extra_s)
    except TimeoutError:
        expected = f" of {declared}" if declared is not None else ""
        raise RequestTimeout(
            f"the request body did not arrive in time: {received} bytes{expected} in "
            f"{loop.time() - started:.1f} s; the gateway waits {timeout_s:g} s "
            f"(--body-timeout-s) plus 1 s per {BODY_MIN_RATE_BPS} bytes received; send the "
            "body at once"
        ) from None
    except ClientDisconnect:
        raise ClientGone(f"the client disconnected after {received} bytes of its body") from None
    return b"".join(chunks)


def json_depth(body: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text (brackets inside strings ignored).

    Cheap: an upper bound (the number of opening brackets) answers most bodies at once;
    only a body with more than :data:`MAX_JSON_DEPTH` of them is scanned, strings removed by
    one regular expression and the rest counted with numpy (no Python loop per byte).
    """
    opening = body.count(b"[") + body.count(b"{")
    if opening <= MAX_JSON_DEPTH:
        return opening
    if b'"' in body:
        body = _STRING.sub(b"", body)
    brackets = body.translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return int(np.cumsum(_STEP[np.frombuffer(brackets, dtype=np.uint8)], dtype=np.int64).max())


def check_depth(body: bytes) -> None:
    """Refuse a body nested deeper than :data:`MAX_JSON_DEPTH`.

    Raises:
        BadRequest: it is (names the limit).
    """
    if json_depth(body) > MAX_JSON_DEPTH:
        raise BadRequest(
            f"the request body nests arrays or objects more than {MAX_JSON_DEPTH} levels "
            "deep; the APIs' bodies need at most 3 (an object, a list, a list of token IDs)",
            code="too_deep",
        )


def parse_json(body: bytes) -> Any:
    """``body`` parsed as JSON, after :func:`check_depth`.

    Raises:
        BadRequest: empty, too deep, or not valid JSON (the parser's message and position).
    """
    if not body.strip():
        raise BadRequest("the request body is empty; send a JSON object")
    check_depth(body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        try:  # orjson names the wrong reason and position for bytes that are not UTF-8
            body.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise BadRequest(
                f"the request body is not valid UTF-8 at byte {bad.start} ({bad.reason}); send "
                "JSON encoded in UTF-8 (JSON's \\u escapes for any character)"
            ) from None
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None


async def read_json_body(request: Request, limit_bytes: int, timeout_s: float) -> Any:
    """The request's body, checked (:func:`check_content_type`, :func:`read_body`) and parsed.

    Raises:
        UnsupportedMediaType, TooLarge, RequestTimeout, BadRequest, ClientGone: see above.
    """
    check_content_type(request.headers.get("content-type"))
    return parse_json(await read_body(request, limit_bytes, timeout_s))
