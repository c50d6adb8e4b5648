"""``triton-embed``: the command-line tool over the client library.

Subcommands:
    embed   embed a text file (one text per line), JSONL or Parquet into Parquet shards of an
            output folder (streamed, resumable, over one or several servers; docs/bulk.md),
            or a small corpus into one .npy
    verify  check an output folder of embed (or of the Ray Data job) against its input
    query   the nearest texts of an embedded corpus to one or more queries
    doctor  the host's GPU/CPU/NUMA topology and a placement plan for embedder instances;
            Helm chart values for the host; inside a pod, a NUMA alignment check
    repository add|list|remove
            write, list or delete the Triton models of an embedding model in a model
            repository folder (the ensemble NAME and its steps NAME_tokenizer, NAME_embedder)
    repository load|unload
            load or unload a model through the server's repository API (needs the admin key)
    gateway an OpenAI- and TEI-compatible HTTP gateway in front of one or more servers
            (docs/operations.md, "Gateway"; needs the server package)

The admin key (docs/operations.md, "Restricted APIs") is read from TRITON_EMBED_ADMIN_KEY,
the file TRITON_EMBED_ADMIN_KEY_FILE or --admin-key-file, or the server's default key file;
it is never taken on the command line, where other users of the host could read it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from triton_embed.cli_args import (
    add_connection_args,
    add_corpus_args,
    non_negative_int,
    positive_float,
    positive_int,
)
from triton_embed.cli_bulk import add_bulk_args, add_verify_parser, run_verify
from triton_embed.cli_commands import (
    nearest,
    run_embed,
    run_gateway,
    run_query,
    run_repository,
    summarize,
)
from triton_embed.cli_repository import (
    REPOSITORY_USAGE,
    add_repository_args,
    repository_flag_error,
)
from triton_embed.client import DEFAULT_MODEL
from triton_embed.errors import EmbedClientError

__all__ = [
    "add_gateway_args",
    "build_parser",
    "main",
    "nearest",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "repository_flag_error",
    "run_embed",
    "run_gateway",
    "run_query",
    "run_repository",
    "run_verify",
    "summarize",
]


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    """The flags of the gateway, defined once.

    ``triton-embed gateway`` and ``python -m triton_embed_server.gateway`` both take them
    (:class:`triton_embed_server.gateway.settings.GatewaySettings` reads them). No flag
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
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument(
        "--port", type=positive_int, default=8080, help="port to listen on (default %(default)s)"
    )
    p.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help="file holding the key clients must send as 'Authorization: Bearer <key>' "
        "(default: TRITON_EMBED_GATEWAY_API_KEY; neither: no key, every route open)",
    )
    p.add_argument(
        "--admin-key-file",
        type=Path,
        default=None,
        help="file holding the servers' admin key, needed to list their models and read "
        "their configs (default: TRITON_EMBED_ADMIN_KEY, the file TRITON_EMBED_ADMIN_KEY_FILE, "
        "the server's default key file)",
    )
    p.add_argument(
        "--max-body-mb",
        type=positive_float,
        default=None,
        help="largest request body, MiB; larger ones are answered 413 (default: 2,048 inputs "
        "of the tokenizer's default character cap, 16,384 bytes, plus JSON: about 32.1 MiB)",
    )
    p.add_argument(
        "--max-request-tokens",
        type=positive_int,
        default=131072,
        help="tokens one embedding request may hold in all; more are answered 400 "
        "(default %(default)s: 9-26 s of the engine on 2 cores; docs/operations.md)",
    )
    p.add_argument(
        "--header-timeout-s",
        type=positive_float,
        default=20.0,
        help="seconds a request's headers may take; past it 408 and the connection closes "
        "(default %(default)s)",
    )
    p.add_argument(
        "--body-timeout-s",
        type=positive_float,
        default=20.0,
        help="seconds a request's body may take, plus 1 s per 64 KiB received; past it 408 "
        "and the connection closes (default %(default)s)",
    )
    p.add_argument(
        "--max-in-flight",
        type=positive_int,
        default=512,
        help="requests handled at once; more are answered 429 (default %(default)s)",
    )
    p.add_argument(
        "--merge-in-flight",
        type=non_negative_int,
        default=0,
        help="upstream calls per model and request options before further small text "
        "requests wait and are merged into one call; an idle gateway sends at once (default "
        "%(default)s: no merging, which measured as fast on 2 cores; perf/README.md)",
    )
    p.add_argument(
        "--default-model",
        default=DEFAULT_MODEL,
        help="the model of the TEI routes /embed, /tokenize, /info (default %(default)s)",
    )
    p.add_argument(
        "--timeout-s",
        type=positive_float,
        default=60.0,
        help="deadline of one upstream call, seconds; past it 504 (default %(default)s)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="uvicorn worker processes (default %(default)s; each has its own limits and metrics)",
    )
    p.add_argument(
        "--log-level",
        choices=("critical", "error", "warning", "info", "debug"),
        default="info",
        help="log level (default %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``triton-embed``."""
    parser = argparse.ArgumentParser(
        prog="triton-embed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    e = sub.add_parser(
        "embed", help="embed a text/JSONL/Parquet corpus into Parquet shards (small ones: .npy)"
    )
    e.add_argument(
        "input",
        type=Path,
        help="text file (one text per line; blank lines are skipped), JSONL or Parquet",
    )
    e.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="output folder: Parquet shards part-NNNNN.parquet and _manifest.json, streamed and "
        "resumable (run the same command again after a crash); or a .npy file, held in memory "
        "([n, dim] float32; float16, or uint8 [n, dim/8] for ubinary)",
    )
    e.add_argument(
        "--parquet",
        type=Path,
        help="with a .npy output: also write one Parquet file (text, num_tokens, embedding)",
    )
    e.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="texts per request (default: the server's max_batch_size)",
    )
    e.add_argument(
        "--concurrency",
        type=positive_int,
        default=4,
        help="requests in flight (default %(default)s)",
    )
    e.add_argument("--summary-json", type=Path, help="also write the closing summary as JSON")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_connection_args(e, embedding_type=True)
    add_corpus_args(e)
    add_bulk_args(e)
    add_verify_parser(sub)

    q = sub.add_parser("query", help="nearest texts of an embedded corpus to a query")
    q.add_argument("queries", nargs="+", help="query text(s)")
    q.add_argument(
        "--embeddings",
        type=Path,
        required=True,
        help=".npy or output folder written by 'embed' (rows in corpus order)",
    )
    q.add_argument("--corpus", type=Path, required=True, help="the file that was embedded")
    q.add_argument(
        "-k",
        "--top-k",
        type=positive_int,
        default=5,
        help="results per query (default %(default)s)",
    )
    q.add_argument("--json", action="store_true", help="print results as JSON")
    add_connection_args(q)
    add_corpus_args(q)

    d = sub.add_parser(
        "doctor", help="host topology (GPUs, NUMA nodes, cores) and a placement plan"
    )
    d.add_argument("--json", action="store_true", help="print JSON (keys: host, plan, warnings)")
    d.add_argument(
        "--from-dir",
        type=Path,
        default=None,
        help="read captured outputs instead of running the commands: topo_m.txt "
        "(nvidia-smi topo -m), p2p.txt (nvidia-smi topo -p2p w|r), lscpu.txt (lscpu), "
        "numactl.txt (numactl --hardware)",
    )
    d.add_argument(
        "--instances-per-gpu",
        type=positive_int,
        default=4,
        help="embedder instances per GPU (default %(default)s)",
    )
    d.add_argument(
        "--cpu-instances",
        type=positive_int,
        default=None,
        help="embedder instances on a CPU-only host, spread over NUMA nodes (default 2; with "
        "--chart-values 2 per NUMA node)",
    )
    d.add_argument("--plan-out", type=Path, default=None, help="also write the plan as JSON")
    d.add_argument(
        "--chart-values",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE|-",
        help="Helm values of deploy/helm/triton-embed for this host (pods per node, CPUs, "
        "memory and GPUs per pod) as YAML, to FILE or, with - or no FILE, to standard output "
        "instead of the report (docs/kubernetes.md)",
    )
    d.add_argument(
        "--reserved-cores",
        type=positive_int,
        default=1,
        help="with --chart-values: physical cores held back on every NUMA node for the "
        "kubelet, the system and other pods (default %(default)s; twice that on a host with "
        "one NUMA node)",
    )
    d.add_argument(
        "--in-pod",
        "--check-pod",
        dest="in_pod",
        action="store_true",
        help="inside a pod: check that the container's CPUs (cpuset), memory nodes "
        "(Mems_allowed_list) and GPUs are on one NUMA node; exit 0 ALIGNED, 1 NOT ALIGNED",
    )

    r = sub.add_parser(
        "repository",
        help="add, list or remove an embedding model's Triton models; load or unload them",
        description="Write, list or remove the Triton models of an embedding model in a model "
        "repository folder; load or unload models of a running server (sends the admin key).",
        epilog=REPOSITORY_USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_repository_args(r)

    g = sub.add_parser(
        "gateway",
        help="OpenAI- and TEI-compatible HTTP gateway in front of one or more servers",
        description="Serve POST /v1/embeddings, GET /v1/models (OpenAI) and /embed, "
        "/tokenize, /info, /health (text-embeddings-inference) over HTTP, calling the "
        "servers' embedding ensembles over gRPC (docs/operations.md, 'Gateway').",
    )
    add_gateway_args(g)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``triton-embed``; returns the exit code (1 on a reported error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command
    if command == "repository":
        command = f"repository {args.action}"
        problem = repository_flag_error(args)
        if problem:
            parser.error(problem)
    try:
        if args.command == "embed":
            run_embed(args)
        elif args.command == "verify":
            run_verify(args)
        elif args.command == "query":
            run_query(args)
        elif args.command == "doctor":
            # The doctor reads the serving host; the client never imports it otherwise.
            from triton_embed_server.host.doctor import run_doctor

            if run_doctor(args).get("aligned") is False:
                return 1  # --in-pod: NOT ALIGNED
        elif args.command == "repository":
            run_repository(args)
        elif args.command == "gateway":
            run_gateway(args)
    except (EmbedClientError, OSError, ValueError) as exc:
        print(f"triton-embed {command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
