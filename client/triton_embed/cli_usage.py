"""``triton-embed usage``: tokens and cost per tenant and hour, from a gateway.

Calls the gateway's ``GET /admin/usage`` (docs/tenants.md, "Usage and cost") with the
admin key (``--admin-key-file``, else where :func:`triton_embed.admin.read_admin_key` looks)
in the header ``triton-embed-admin-key``, and prints the answer: CSV (``--format csv``),
or JSON. The key is never taken on the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from triton_embed.admin import ADMIN_HEADER, read_admin_key, read_key_file
from triton_embed.errors import EmbedClientError

#: The gateway's usage route.
USAGE_PATH = "/admin/usage"


def add_usage_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``usage`` to the ``triton-embed`` subcommands."""
    u = sub.add_parser(
        "usage",
        help="tokens and cost per tenant and hour, from a gateway (JSON or CSV)",
        description="Print a gateway's usage table (GET /admin/usage; docs/tenants.md).",
    )
    u.add_argument(
        "--gateway",
        default="http://127.0.0.1:8080",
        help="the gateway's base URL (default %(default)s)",
    )
    u.add_argument("--format", choices=("json", "csv"), default="json", help="output format")
    u.add_argument("--tenant", help="only this tenant's rows")
    u.add_argument(
        "--admin-key-file",
        type=Path,
        help="file holding the admin key (default: TRITON_EMBED_ADMIN_KEY, the file "
        "TRITON_EMBED_ADMIN_KEY_FILE, the server's default key file)",
    )
    u.add_argument("--timeout-s", type=float, default=30.0, help="HTTP timeout, seconds")


def usage_url(gateway: str, fmt: str, tenant: str | None) -> str:
    """The route's URL with its query (``format``, ``tenant``)."""
    query = {"format": fmt, **({"tenant": tenant} if tenant else {})}
    return gateway.rstrip("/") + USAGE_PATH + "?" + urllib.parse.urlencode(query)


def run_usage(args: argparse.Namespace) -> str:
    """``triton-embed usage``: prints and returns the gateway's answer.

    Raises:
        EmbedClientError: no admin key, the gateway refused, or cannot be reached.
    """
    key = read_key_file(args.admin_key_file) if args.admin_key_file else read_admin_key()
    if key is None:
        raise EmbedClientError("no admin key: pass --admin-key-file or set TRITON_EMBED_ADMIN_KEY")
    request = urllib.request.Request(
        usage_url(args.gateway, args.format, args.tenant), headers={ADMIN_HEADER: key}
    )
    try:
        with urllib.request.urlopen(request, timeout=args.timeout_s) as answer:  # noqa: S310
            text = answer.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace")
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body[:200]
        raise EmbedClientError(f"{args.gateway} answered {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EmbedClientError(f"{args.gateway} cannot be reached: {exc}") from None
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return text
