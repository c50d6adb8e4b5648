"""The gateway's API key: where it comes from and how a request's key is checked.

With a key configured, every route but ``GET /health`` and ``GET /metrics`` needs the header
``Authorization: Bearer <key>`` (what the ``openai`` SDK sends from ``api_key=``). A missing
or wrong key is 401 with ``WWW-Authenticate: Bearer``. The comparison is
:func:`hmac.compare_digest` (its time does not depend on where the keys differ). Without a
key every route is open: the default bind address is loopback.

The key comes from ``--api-key-file`` (a file holding it), else the environment variable
:data:`API_KEY_ENV`. It is never logged or put in an error message.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from triton_embed_server.gateway.errors import Unauthorized

API_KEY_ENV = "TRITON_EMBED_GATEWAY_API_KEY"


def load_api_key(key_file: Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key clients must send, or ``None`` for an open gateway.

    Args:
        key_file: ``--api-key-file``: a file holding the key (surrounding whitespace dropped).
        environ: the environment (default ``os.environ``), read when no file is given.

    Raises:
        OSError: the file cannot be read.
        ValueError: the file or the variable holds an empty key, or whitespace inside it.
    """
    env = os.environ if environ is None else environ
    if key_file is not None:
        key, source = Path(key_file).read_text(encoding="utf-8").strip(), str(key_file)
    elif env.get(API_KEY_ENV) is not None:
        key, source = env[API_KEY_ENV].strip(), API_KEY_ENV
    else:
        return None
    if not key or any(c.isspace() for c in key):
        raise ValueError(f"the API key from {source} is empty or holds whitespace")
    return key


class ApiKeyCheck:
    """Checks ``Authorization: Bearer <key>`` against the configured key.

    Args:
        key: the key; ``None`` lets every request through.
    """

    def __init__(self, key: str | None):
        self._key = key.encode() if key else None

    @property
    def enabled(self) -> bool:
        """Whether a key is required."""
        return self._key is not None

    def check(self, authorization: str | None) -> None:
        """Let the request through, or raise.

        Args:
            authorization: the request's ``Authorization`` header, if any.

        Raises:
            Unauthorized: a key is configured and the header is missing, not ``Bearer``, or
                holds another key.
        """
        if self._key is None:
            return
        scheme, _, given = (authorization or "").strip().partition(" ")
        if not authorization or scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized(
                "missing API key: send the header 'Authorization: Bearer <key>' (the openai "
                "SDK sends its api_key so)"
            )
        if not hmac.compare_digest(given.strip().encode(), self._key):
            raise Unauthorized("invalid API key")
