"""The gateway's one API key (``--api-key-file``): where it comes from.

With a key configured, every route but ``GET /health`` and ``GET /metrics`` needs the header
``Authorization: Bearer <key>`` (what the ``openai`` SDK sends from ``api_key=``). The key is
one tenant's (:func:`~triton_embed_server.gateway.tenants.key_tenants`); a request's key is
checked as every tenant's is (:mod:`~triton_embed_server.gateway.tenancy`: SHA-256 digests
compared with :func:`hmac.compare_digest`; a missing or wrong key is 401 with
``WWW-Authenticate: Bearer``). Without a key (and without ``--tenants``) every route is open:
the default bind address is loopback.

The key comes from ``--api-key-file`` (a file holding it), else the environment variable
:data:`API_KEY_ENV`. It is never logged or put in an error message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

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
