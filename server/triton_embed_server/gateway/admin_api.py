"""The gateway's admin route: ``GET /admin/usage``, tokens and cost per tenant and hour.

Behind the servers' admin key (the one the gateway reads their configs with,
``--admin-key-file``), sent as the header ``triton-embed-admin-key: <key>`` (or
``Authorization: Bearer <key>``), compared with :func:`hmac.compare_digest`; a tenant's key
does not open it. No key or a wrong one is 401; a gateway without an admin key answers 403.
``?format=json`` (default) answers ``{"usd_per_million_tokens": x, "usage": [rows]}``,
``?format=csv`` the rows as CSV (:mod:`~triton_embed_server.gateway.usage`); ``?tenant=NAME``
keeps one tenant's rows. ``triton-embed usage`` calls it.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

import orjson
from starlette.requests import Request
from starlette.responses import Response
from triton_embed.admin import ADMIN_HEADER

from triton_embed_server.gateway.errors import BadRequest, Forbidden, Unauthorized, quote
from triton_embed_server.gateway.tenancy import bearer_key
from triton_embed_server.gateway.usage import to_csv

if TYPE_CHECKING:
    from triton_embed_server.gateway.app import Gateway, RequestState

FORMATS = ("json", "csv")


def check_admin(gateway: Gateway, request: Request) -> None:
    """Let the request through only with the admin key.

    Raises:
        Forbidden: the gateway has no admin key.
        Unauthorized: the request's key is missing or wrong.
    """
    if gateway.admin_key is None:
        raise Forbidden(
            "the gateway has no admin key (--admin-key-file), so its admin routes are closed",
            code="no_admin_key",
        )
    given = request.headers.get(ADMIN_HEADER) or bearer_key(request.headers.get("authorization"))
    if not given:
        raise Unauthorized(f"send the admin key as the header '{ADMIN_HEADER}: <key>'")
    if not hmac.compare_digest(given.encode("utf-8"), gateway.admin_key.encode("utf-8")):
        raise Unauthorized("invalid admin key")


async def usage(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``GET /admin/usage[?format=json|csv][&tenant=NAME]``."""
    check_admin(gateway, request)
    fmt = request.query_params.get("format", "json")
    if fmt not in FORMATS:
        raise BadRequest(f"'format' must be json or csv; got {quote(fmt)}", param="format")
    usd = gateway.tenancy.usd_per_million_tokens
    rows = gateway.usage.rows(usd)
    tenant = request.query_params.get("tenant")
    if tenant is not None:
        rows = [row for row in rows if row["tenant"] == tenant]
    if fmt == "csv":
        return Response(to_csv(rows), media_type="text/csv")
    body = {"usd_per_million_tokens": usd, "usage": rows}
    return Response(orjson.dumps(body), media_type="application/json")
