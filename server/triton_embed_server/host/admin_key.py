"""The admin key that guards Triton's management APIs, and the flags that turn the guard on.

Without it, anyone who reaches the HTTP or gRPC port can load a model whose ``model.py``
travels in the request (``file:1/model.py``: code that then runs inside the server), unload
``embed``, or read configs and statistics. Triton 2.51 can require a header on chosen APIs:

    --http-restricted-api=<apis>:<header>=<key>
    --grpc-restricted-protocol=<apis>:<header>=<key>

(``tritonserver --help`` describes ``<apis>,<key>=<value>``; the binary accepts only the
``:`` form and rejects the other with an error that repeats the whole value, so the flags are
built here and the key is checked first.) :data:`RESTRICTED_APIS` lists every API but
inference, health and metadata: restricted on both ports. Over HTTP, inference is restricted
too (:data:`HTTP_RESTRICTED_APIS`): Triton 2.51's HTTP frontend parses a JSON inference body
with a recursive parser and dies (SIGSEGV) on a ``data`` array nested 100,000 levels deep (a
200 KB request), and it bounds no body size; the restricted-API check runs on the URL and
header before the body is parsed, so a keyless request is answered 403 and cannot reach the
parser. The HTTP API for users is the gateway (docs/operations.md, "Ports"); gRPC inference
stays open. Over gRPC, Triton expects the header name prefixed with ``triton-grpc-protocol-``
(:data:`triton_embed.admin.GRPC_ADMIN_HEADER`).

Where the key comes from (:func:`ensure_admin_key`): ``TRITON_EMBED_ADMIN_KEY``, else the file
named by ``TRITON_EMBED_ADMIN_KEY_FILE``, else the default file
(``$XDG_STATE_HOME/triton-embed/admin_key``), generated with :func:`secrets.token_urlsafe`
and written with mode 0600 the first time. The header name and the client's way of reading
the key live in :mod:`triton_embed.admin`; the server imports them from there.

tritonserver takes the key only on its command line, so users of the same host can read it
in ``/proc/<pid>/cmdline`` of tritonserver and of the supervisor (docs/operations.md).

    python -m triton_embed_server.host.admin_key              # where the key comes from (no key)
    python -m triton_embed_server.host.admin_key --tritonserver-args   # the flags, for serve.sh
"""

from __future__ import annotations

import argparse
import os
import secrets
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

from triton_embed.admin import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    ADMIN_KEY_FILE_ENV,
    check_key,
    default_key_file,
    read_key_file,
)

# Every API of Triton 2.51 but inference, health and metadata (``tritonserver --help``).
RESTRICTED_APIS = (
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
OPEN_APIS = ("inference", "health", "metadata")
# Over HTTP, inference needs the key too (module docstring): only health and metadata are open.
HTTP_RESTRICTED_APIS = (*RESTRICTED_APIS, "inference")
HTTP_OPEN_APIS = ("health", "metadata")
# Where Triton's HTTP port listens on every start path (serve.sh, per_node, the launcher):
# loopback only, whatever the gRPC address. A keyless body of 150 MiB kills the 2.51 HTTP
# frontend before the restricted-API check (measured; 100 MiB was refused with 403), so the
# key alone does not make the port safe to expose (docs/operations.md, "Ports").
LOCAL_HTTP_ADDRESS = "127.0.0.1"
HTTP_FLAG = "--http-restricted-api"
GRPC_FLAG = "--grpc-restricted-protocol"
REDACTED = "***"


def generate_key() -> str:
    """A new random key: 32 bytes from :func:`secrets.token_urlsafe` (43 characters)."""
    return secrets.token_urlsafe(32)


def write_key_file(path: Path, key: str) -> str:
    """Store ``key`` in ``path`` with mode 0600, atomically; keep a key already there.

    The key goes to a new temporary file in the same folder, created with ``O_EXCL`` and mode
    0600 (the umask can only remove bits) and linked to ``path``; the link fails if ``path``
    exists, so two servers starting at once end up with one key and no reader ever sees a
    half-written file. A missing folder is created with mode 0700.

    Returns:
        The key now in ``path`` (``key``, or the one another process wrote first).

    Raises:
        OSError: the folder or the file cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (key + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return read_key_file(path)
    finally:
        tmp.unlink()
    return key


def ensure_admin_key(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The server's admin key and where it came from; generates one when none is configured.

    Order: ``TRITON_EMBED_ADMIN_KEY``; the file named by ``TRITON_EMBED_ADMIN_KEY_FILE``
    (it must exist); the default file (:func:`triton_embed.admin.default_key_file`), written by
    :func:`write_key_file` with a new key when it does not exist. A key file that group or
    others can read gets a warning on stderr.

    Args:
        environ: the environment to read (default ``os.environ``).

    Returns:
        ``(key, source)``; ``source`` names the variable or file, never the key.

    Raises:
        OSError: a key file cannot be read or written.
        ValueError: the key is not usable (:func:`triton_embed.admin.check_key`).
    """
    env = os.environ if environ is None else environ
    if env.get(ADMIN_KEY_ENV):
        return check_key(env[ADMIN_KEY_ENV].strip(), ADMIN_KEY_ENV), ADMIN_KEY_ENV
    if env.get(ADMIN_KEY_FILE_ENV):
        path, source = Path(env[ADMIN_KEY_FILE_ENV]), f"{ADMIN_KEY_FILE_ENV}={{}}"
    else:
        path, source = default_key_file(env), "{}"
    if path.is_file():
        key = read_key_file(path)
    elif env.get(ADMIN_KEY_FILE_ENV):
        raise FileNotFoundError(f"{ADMIN_KEY_FILE_ENV} names {path}, which does not exist")
    else:
        key = write_key_file(path, generate_key())
        source = "{} (generated, mode 0600)"
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        print(
            f"admin_key: warning: {path} has mode {mode:04o}; other users may read the key "
            f"(chmod 600 {path})",
            file=sys.stderr,
        )
    return key, source.format(path)


def tritonserver_args(
    key: str,
    header: str = ADMIN_HEADER,
    http_apis: tuple[str, ...] = HTTP_RESTRICTED_APIS,
    grpc_apis: tuple[str, ...] = RESTRICTED_APIS,
) -> list[str]:
    """The tritonserver flags that require ``header: key`` on ``http_apis`` and ``grpc_apis``.

    By default every API but health and metadata over HTTP (inference included: module
    docstring), every API but inference, health and metadata over gRPC.

    Raises:
        ValueError: ``key`` is not usable (it would break the flag, and tritonserver prints a
            flag it cannot parse).
    """
    check_key(key, "the caller")
    return [
        f"{HTTP_FLAG}={','.join(http_apis)}:{header}={key}",
        f"{GRPC_FLAG}={','.join(grpc_apis)}:{header}={key}",
    ]


def _flag_values(args: list[str], flag: str) -> list[tuple[int, str]]:
    """``(index, value)`` of each ``flag=value`` or ``flag value`` in ``args``."""
    out = []
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            out.append((i, arg.split("=", 1)[1]))
        elif arg == flag and i + 1 < len(args):
            out.append((i + 1, args[i + 1]))
    return out


def restricted_http_headers(args: list[str], api: str = "model-repository") -> dict[str, str]:
    """The HTTP header a server started with ``args`` expects on ``api`` (empty: not restricted).

    Read from its ``--http-restricted-api`` flags; the last one naming ``api`` wins.
    """
    headers: dict[str, str] = {}
    for _, value in _flag_values(args, HTTP_FLAG):
        apis, _, setting = value.partition(":")
        header, sep, key = setting.partition("=")
        if sep and api in apis.split(","):
            headers = {header: key}
    return headers


def redact(args: list[str]) -> list[str]:
    """``args`` with the key of every restriction flag replaced by ``***`` (for messages)."""
    out = list(args)
    for flag in (HTTP_FLAG, GRPC_FLAG):
        for i, value in _flag_values(args, flag):
            head, sep, _ = value.rpartition("=")
            if not sep:
                continue
            redacted = f"{head}={REDACTED}"
            out[i] = f"{flag}={redacted}" if out[i].startswith(flag + "=") else redacted
    return out


def main(argv: list[str] | None = None) -> int:
    """Print where the key comes from, or (``--tritonserver-args``) the flags, one a line."""
    parser = argparse.ArgumentParser(
        prog="python -m triton_embed_server.host.admin_key",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--tritonserver-args",
        action="store_true",
        help="print the restriction flags (they contain the key) for a script to pass on",
    )
    args = parser.parse_args(argv)
    try:
        key, source = ensure_admin_key()
    except (OSError, ValueError) as exc:
        print(f"admin_key: error: {exc}", file=sys.stderr)
        return 1
    if args.tritonserver_args:
        if sys.stdout.isatty():
            print("admin_key: refusing to print the key to a terminal", file=sys.stderr)
            return 1
        print("\n".join(tritonserver_args(key)))
        print(f"admin_key: restricted APIs need the key from {source}", file=sys.stderr)
    else:
        print(f"admin key: {source}")
        for port, open_apis, restricted in (
            ("HTTP", HTTP_OPEN_APIS, HTTP_RESTRICTED_APIS),
            ("gRPC", OPEN_APIS, RESTRICTED_APIS),
        ):
            print(f"{port}: open: {', '.join(open_apis)}; restricted: {', '.join(restricted)}")
        print(f"header: {ADMIN_HEADER} (HTTP), triton-grpc-protocol-{ADMIN_HEADER} (gRPC)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
