"""The admin key: what a caller of a restricted Triton API sends, and where it reads the key.

The server (``scripts/serve.sh``, :class:`triton_embed_server.run.launcher.TritonServer`) restricts
every API but inference, health and metadata: model configuration, the model repository
(load/unload), statistics, trace, logging and shared-memory registration answer only requests
that carry the admin key in a header (docs/operations.md, "Restricted APIs"). Triton compares
the header's value with the key given on its command line.

* HTTP: the header :data:`ADMIN_HEADER` (``triton-embed-admin-key: <key>``).
* gRPC: Triton prefixes the configured name with ``triton-grpc-protocol-``, so the metadata
  key is :data:`GRPC_ADMIN_HEADER` (``triton-grpc-protocol-triton-embed-admin-key``).

The key comes, in this order, from the environment variable :data:`ADMIN_KEY_ENV`, from the
file named by :data:`ADMIN_KEY_FILE_ENV`, or from the default file
(:func:`default_key_file`: ``$XDG_STATE_HOME/triton-embed/admin_key``, where the server writes
the key it generates). The key itself is never logged or printed by this package.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

ADMIN_KEY_ENV = "TRITON_EMBED_ADMIN_KEY"
ADMIN_KEY_FILE_ENV = "TRITON_EMBED_ADMIN_KEY_FILE"
ADMIN_HEADER = "triton-embed-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"  # what Triton 2.51 adds to a gRPC restriction key
GRPC_ADMIN_HEADER = GRPC_HEADER_PREFIX + ADMIN_HEADER
# Characters of a key: it travels in a header and inside a tritonserver flag
# (``<apis>:<header>=<key>``), so no ``:``, ``=``, ``,``, spaces or control characters.
KEY_PATTERN = re.compile(r"[A-Za-z0-9_.~-]{16,256}")
# Triton's answer to a restricted call without the right header (HTTP 403 body, gRPC
# UNAVAILABLE message): "This API is restricted, expecting header '...'" (HTTP) and
# "This protocol is restricted, expecting header '...'" (gRPC).
REFUSED_MARKER = "is restricted, expecting header"


def default_key_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where the server keeps a key it generated: ``$XDG_STATE_HOME/triton-embed/admin_key``.

    ``XDG_STATE_HOME`` defaults to ``~/.local/state`` (XDG Base Directory Specification):
    per user, outside any source tree.

    Args:
        environ: the environment to read (default ``os.environ``).
    """
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local/state")
    return Path(state) / "triton-embed" / "admin_key"


def check_key(key: str, source: str) -> str:
    """Return ``key`` if it is usable; the error names ``source``, never the key.

    Raises:
        ValueError: shorter than 16 or longer than 256 characters, or a character outside
            ``A-Z a-z 0-9 _ . ~ -``.
    """
    if not KEY_PATTERN.fullmatch(key):
        raise ValueError(
            f"the admin key from {source} is not usable: it needs 16 to 256 characters "
            "from A-Z a-z 0-9 _ . ~ - (python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))' makes one)"
        )
    return key


def read_key_file(path: Path) -> str:
    """The key stored in ``path`` (surrounding whitespace removed).

    Raises:
        OSError: the file cannot be read.
        ValueError: its content is not a usable key.
    """
    return check_key(Path(path).read_text(encoding="utf-8").strip(), str(path))


def read_admin_key(environ: Mapping[str, str] | None = None) -> str | None:
    """The admin key this process should send, or ``None`` when none is configured.

    In order: :data:`ADMIN_KEY_ENV`; the file named by :data:`ADMIN_KEY_FILE_ENV` (it must
    exist); the default file (:func:`default_key_file`) if it exists.

    Args:
        environ: the environment to read (default ``os.environ``).

    Raises:
        OSError: :data:`ADMIN_KEY_FILE_ENV` names a file that cannot be read.
        ValueError: the key found is not usable (:func:`check_key`).
    """
    env = os.environ if environ is None else environ
    if env.get(ADMIN_KEY_ENV):
        return check_key(env[ADMIN_KEY_ENV].strip(), ADMIN_KEY_ENV)
    if env.get(ADMIN_KEY_FILE_ENV):
        return read_key_file(Path(env[ADMIN_KEY_FILE_ENV]))
    path = default_key_file(env)
    return read_key_file(path) if path.is_file() else None


def http_headers(key: str | None) -> dict[str, str]:
    """HTTP headers that carry ``key`` (none when ``key`` is ``None``)."""
    return {ADMIN_HEADER: key} if key else {}


def grpc_headers(key: str | None) -> dict[str, str]:
    """The gRPC metadata that carries ``key`` (none when ``key`` is ``None``)."""
    return {GRPC_ADMIN_HEADER: key} if key else {}


def is_refused(message: str) -> bool:
    """Whether a server error message is Triton refusing a restricted API call."""
    return REFUSED_MARKER in message
