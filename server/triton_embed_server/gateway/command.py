"""The command line: ``triton-embed gateway``, ``python -m triton_embed_server.gateway``.

Both take the flags of :func:`add_gateway_args` and end in :func:`run`:
uvicorn serving :func:`~triton_embed_server.gateway.routes.create_app`, with uvloop when it is
installed and the gateway's HTTP protocol (uvicorn's httptools or h11 protocol with a
request-header timeout, :mod:`~triton_embed_server.gateway.protocol`), one worker process
unless ``--workers N``. With ``--workers N`` (N > 1) this process creates a private folder
(mode 0700) that the workers share: their tenants' buckets, slots and usage
(:mod:`~triton_embed_server.gateway.shared`) and their Prometheus multiprocess files
(:mod:`~triton_embed_server.gateway.metrics`), and removes it when uvicorn returns.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

from triton_embed.cli_args import non_negative_int, positive_float, positive_int

from triton_embed_server.gateway.settings import GatewaySettings, configure_logging

log = logging.getLogger("triton_embed.gateway")

#: The flags' defaults: the settings' field defaults, stated once there.
_DEFAULT = {f.name: f.default for f in fields(GatewaySettings)}


#: The gateway's flags but ``--upstream`` and ``--log-level``: (flag, type, help); each
#: flag's default is its settings field's (``--max-in-flight``: ``max_in_flight``).
_FLAGS = (
    ("--host", str, "address to listen on (default %(default)s)"),
    ("--port", positive_int, "port to listen on (default %(default)s)"),
    (
        "--api-key-file",
        Path,
        "file holding the key clients must send as 'Authorization: Bearer <key>' "
        "(default: TRITON_EMBED_GATEWAY_API_KEY; neither: no key, every route open)",
    ),
    (
        "--tenants",
        Path,
        "tenants file (YAML): per tenant its keys' SHA-256 digests, priority class "
        "(interactive or batch), models, tokens_per_minute and burst, max_concurrency, "
        "weight; re-read on SIGHUP and when it changes (docs/tenants.md). Replaces "
        "--api-key-file",
    ),
    (
        "--admin-key-file",
        Path,
        "file holding the servers' admin key, needed to list their models and read "
        "their configs (default: TRITON_EMBED_ADMIN_KEY, the file TRITON_EMBED_ADMIN_KEY_FILE, "
        "the server's default key file)",
    ),
    (
        "--max-body-mb",
        positive_float,
        "largest request body, MiB; larger ones are answered 413 (default: 2,048 inputs "
        "of the tokenizer's default character cap, 16,384 bytes, plus JSON: about 32.1 MiB)",
    ),
    (
        "--max-request-tokens",
        positive_int,
        "tokens one embedding request may hold in all; more are answered 400 "
        "(default %(default)s: 9-26 s of the engine on 2 cores; docs/operations.md)",
    ),
    (
        "--header-timeout-s",
        positive_float,
        "seconds a request's headers may take; past it 408 and the connection closes "
        "(default %(default)s)",
    ),
    (
        "--body-timeout-s",
        positive_float,
        "seconds a request's body may take, plus 1 s per 64 KiB received; past it 408 "
        "and the connection closes (default %(default)s)",
    ),
    (
        "--max-in-flight",
        positive_int,
        "requests handled at once; more are answered 429 (default %(default)s)",
    ),
    (
        "--merge-in-flight",
        non_negative_int,
        "upstream calls per model and request options before further small text "
        "requests wait and are merged into one call; an idle gateway sends at once (default "
        "%(default)s: no merging, which measured as fast on 2 cores; perf/README.md)",
    ),
    (
        "--max-upstream-calls",
        positive_int,
        "calls in flight to one model on one upstream; a request's further pieces wait in "
        "the gateway, instead of past the server's queue (max_queue_size 70, answered 429) "
        "(default %(default)s)",
    ),
    (
        "--max-upstream-requests",
        positive_int,
        "requests doing upstream work at once; more wait in the gateway, interactive "
        "tenants first, then fair shares by tokens within a class (default %(default)s)",
    ),
    (
        "--default-model",
        str,
        "the model of the TEI routes /embed, /tokenize, /decode, /info (default %(default)s)",
    ),
    (
        "--default-reranker",
        str,
        "the reranker of TEI's /rerank and of rerank or score requests without a model "
        "(default: the only reranker the servers have)",
    ),
    (
        "--timeout-s",
        positive_float,
        "deadline of one upstream call, seconds; past it 504 (default %(default)s)",
    ),
    (
        "--workers",
        positive_int,
        "uvicorn worker processes (default %(default)s); tenants' limits, usage and the "
        "metrics hold for all of them together (docs/tenants.md)",
    ),
    (
        "--otlp-endpoint",
        str,
        "OTLP/HTTP URL to export request spans to (an OpenTelemetry Collector, Jaeger, "
        "Tempo: http://collector:4318; /v1/traces is added without a path); a request's "
        "W3C traceparent is their parent and goes on to the servers (default: no tracing; "
        "docs/operations.md, 'Traces')",
    ),
)


#: Flags whose settings field is not the flag's name.
_FIELD_OF = {"--tenants": "tenants_file"}


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    """The flags of the gateway, defined once.

    ``triton-embed gateway`` (:func:`register`) and ``python -m triton_embed_server.gateway``
    (:func:`main`) both take them; :meth:`GatewaySettings.from_args` reads them. No flag
    takes a key itself: keys come from files or the environment.
    """
    p.add_argument(
        "--upstream",
        action="append",
        required=True,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="gRPC address(es) of the Triton servers; a host name is resolved to all its "
        "addresses every few seconds (a headless Kubernetes Service); may be repeated",
    )
    for flag, kind, text in _FLAGS:
        field = _FIELD_OF.get(flag, flag[2:].replace("-", "_"))
        p.add_argument(flag, type=kind, default=_DEFAULT[field], dest=field, help=text)
    p.add_argument(
        "--log-level",
        choices=("critical", "error", "warning", "info", "debug"),
        default=_DEFAULT["log_level"],
        help="log level (default %(default)s)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``gateway`` to the ``triton-embed`` subcommands (entry point ``triton_embed.commands``).

    Its ``run`` default is :func:`run_from_args`.
    """
    g = subparsers.add_parser(
        "gateway",
        help="OpenAI- and TEI-compatible HTTP gateway in front of one or more servers",
        description="Serve POST /v1/embeddings, GET /v1/models (OpenAI), /embed, "
        "/tokenize, /decode, /rerank, /info, /health (text-embeddings-inference), POST /v1/rerank, "
        "/v2/rerank (Cohere, Jina) and /score (vLLM) over HTTP, calling the servers' "
        "embedding and reranker ensembles over gRPC (docs/operations.md, 'Gateway').",
    )
    add_gateway_args(g)
    g.set_defaults(run=run_from_args)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def run(settings: GatewaySettings) -> None:
    """Serve the gateway until SIGINT or SIGTERM.

    Raises:
        OSError, ValueError: a key file cannot be read or holds no usable key (checked
            before anything listens).
    """
    import uvicorn

    from triton_embed_server.gateway.metrics import MULTIPROC_ENV
    from triton_embed_server.gateway.protocol import protocol_class
    from triton_embed_server.gateway.routes import SETTINGS_ENV, create_app

    configure_logging(settings.log_level)
    settings.tenant_registry()  # fail now, with the file's name and line, not in a worker
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
        shared_dir = tempfile.mkdtemp(prefix="triton-embed-gateway-")  # mode 0700
        try:
            os.environ[MULTIPROC_ENV] = shared_dir  # before the workers import prometheus_client
            shared = dataclasses.replace(settings, shared_dir=shared_dir)
            os.environ[SETTINGS_ENV] = shared.to_json()
            uvicorn.run(
                "triton_embed_server.gateway.routes:create_app_from_env",
                factory=True,
                workers=settings.workers,
                **options,
            )
        finally:
            shutil.rmtree(shared_dir, ignore_errors=True)
    else:
        uvicorn.run(create_app(settings), **options)


def run_from_args(args: argparse.Namespace) -> None:
    """:func:`run` with the settings of parsed :func:`add_gateway_args` flags.

    Raises:
        ValueError: a malformed ``--upstream`` entry or limit.
        OSError: a key file cannot be read.
    """
    run(GatewaySettings.from_args(args))


def main(argv: list[str] | None = None) -> int:
    """``python -m triton_embed_server.gateway [flags]``; returns the exit code."""
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
