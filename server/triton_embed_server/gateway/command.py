"""The command line: ``triton-embed gateway``, ``python -m triton_embed_server.gateway``.

Both take the flags of :func:`triton_embed.cli.add_gateway_args` and end in :func:`run`:
uvicorn serving :func:`~triton_embed_server.gateway.app.create_app`, with uvloop when it is
installed and the gateway's HTTP protocol (uvicorn's httptools or h11 protocol with a
request-header timeout, :mod:`~triton_embed_server.gateway.protocol`), one worker process
unless ``--workers N``.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys

from triton_embed_server.gateway.settings import GatewaySettings, configure_logging

log = logging.getLogger("triton_embed.gateway")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def run(settings: GatewaySettings) -> None:
    """Serve the gateway until SIGINT or SIGTERM.

    Raises:
        OSError, ValueError: a key file cannot be read or holds no usable key (checked
            before anything listens).
    """
    import uvicorn

    from triton_embed_server.gateway.app import SETTINGS_ENV, create_app
    from triton_embed_server.gateway.protocol import protocol_class

    configure_logging(settings.log_level)
    settings.api_key()  # fail now, with the file's name, rather than in a worker
    settings.admin_key()
    options = {
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop" if _installed("uvloop") else "asyncio",
        "http": protocol_class(),
        "log_level": settings.log_level,
        "access_log": False,
        "timeout_graceful_shutdown": 30,
    }
    if settings.workers > 1:
        os.environ[SETTINGS_ENV] = settings.to_json()
        uvicorn.run(
            "triton_embed_server.gateway.app:create_app_from_env",
            factory=True,
            workers=settings.workers,
            **options,
        )
    else:
        uvicorn.run(create_app(settings), **options)


def run_from_args(args: argparse.Namespace) -> None:
    """:func:`run` with the settings of parsed :func:`triton_embed.cli.add_gateway_args` flags.

    Raises:
        ValueError: a malformed ``--upstream`` entry or limit.
        OSError: a key file cannot be read.
    """
    run(GatewaySettings.from_args(args))


def main(argv: list[str] | None = None) -> int:
    """``python -m triton_embed_server.gateway [flags]``; returns the exit code."""
    from triton_embed.cli import add_gateway_args

    parser = argparse.ArgumentParser(
        prog="python -m triton_embed_server.gateway",
        description="OpenAI- and TEI-compatible HTTP gateway in front of Triton embedding "
        "ensembles (the same as: triton-embed gateway).",
    )
    add_gateway_args(parser)
    args = parser.parse_args(argv)
    try:
        run_from_args(args)
    except (OSError, ValueError) as exc:
        print(f"gateway: error: {exc}", file=sys.stderr)
        return 1
    return 0
