"""Reading a request's JSON body, never more than the size limit (``--max-body-mb``).

A body whose ``Content-Length`` is over the limit is refused before any of it is read; a
body without one (chunked) is read chunk by chunk and refused as soon as it passes the
limit. Either way the answer is 413 and at most ``limit`` bytes were ever held. Then the
body is parsed with ``orjson``; anything that is not JSON is 400.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from triton_embed_server.gateway.errors import BadRequest, TooLarge


def _too_large(limit_bytes: int, size: str) -> TooLarge:
    return TooLarge(
        f"the request body is {size}; the gateway accepts at most {limit_bytes} bytes "
        f"({limit_bytes / 2**20:g} MiB, --max-body-mb); send fewer or shorter inputs per request"
    )


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The request's body, at most ``limit_bytes`` long.

    Raises:
        TooLarge: ``Content-Length`` or the bytes received pass ``limit_bytes``.
        BadRequest: ``Content-Length`` is not a number.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise BadRequest(f"Content-Length {declared!r} is not a number") from None
        if length > limit_bytes:
            raise _too_large(limit_bytes, f"{length} bytes (Content-Length)")
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit_bytes:
            raise _too_large(limit_bytes, f"over {limit_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit_bytes: int) -> Any:
    """The request's body parsed as JSON (at most ``limit_bytes``).

    Raises:
        TooLarge: the body is over the limit.
        BadRequest: it is not valid JSON (the parser's message, with its position).
    """
    body = await read_body(request, limit_bytes)
    if not body.strip():
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
