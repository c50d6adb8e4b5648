"""``triton-embed``: the command-line tool over the client library.

Subcommands:
    embed   embed a text file (one text per line) or JSONL into .npy (and optionally Parquet)
    query   the nearest texts of an embedded corpus to one or more queries
    doctor  the host's GPU/CPU/NUMA topology and a placement plan for embedder instances
    repository load|unload NAME
            load or unload a model through the server's repository API (needs the admin key)

The admin key (docs/operations.md, "Restricted APIs") is read from TRITON_EMBED_ADMIN_KEY,
the file TRITON_EMBED_ADMIN_KEY_FILE or --admin-key-file, or the server's default key file;
it is never taken on the command line, where other users of the host could read it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from triton_embed.cli_commands import (
    nearest,
    run_embed,
    run_query,
    run_repository,
    summarize,
)
from triton_embed.client import DEFAULT_MODEL, DEFAULT_URL
from triton_embed.errors import EmbedClientError
from triton_embed.options import DEFAULT_TRUNCATION, Truncation
from triton_embed.retry import DEFAULT_MAX_WAIT_S, DEFAULT_RETRIES

__all__ = [
    "build_parser",
    "main",
    "nearest",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "run_embed",
    "run_query",
    "run_repository",
    "summarize",
]


def _int_at_least(raw: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def positive_int(raw: str) -> int:
    """Argparse type: a whole number >= 1 (argparse names the flag in its error)."""
    return _int_at_least(raw, 1)


def non_negative_int(raw: str) -> int:
    """Argparse type: a whole number >= 0."""
    return _int_at_least(raw, 0)


def positive_float(raw: str) -> float:
    """Argparse type: a finite number > 0."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {raw}")
    return value


def _add_retry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--retries",
        type=non_negative_int,
        default=DEFAULT_RETRIES,
        help="send a request the server refused as overloaded or unavailable again up to N "
        "times, after random waits that double each time (default %(default)s; 0 = never)",
    )
    p.add_argument(
        "--retry-max-wait-s",
        type=positive_float,
        default=DEFAULT_MAX_WAIT_S,
        help="cap of one wait between retries, seconds (default %(default)s)",
    )


def _add_key_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=DEFAULT_URL,
        help="the server's gRPC port as host:port, without http:// (default %(default)s)",
    )
    p.add_argument(
        "--admin-key-file",
        type=Path,
        default=None,
        help="file holding the server's admin key (default: TRITON_EMBED_ADMIN_KEY, the file "
        "TRITON_EMBED_ADMIN_KEY_FILE, the server's default key file)",
    )


def _add_connection_args(p: argparse.ArgumentParser) -> None:
    _add_key_args(p)
    p.add_argument("--model", default=DEFAULT_MODEL, help="ensemble name (default %(default)s)")
    p.add_argument(
        "--timeout-s",
        type=positive_float,
        default=120.0,
        help="per-request deadline, seconds (default %(default)s)",
    )
    p.add_argument(
        "--truncation",
        type=str.upper,
        choices=[t.value for t in Truncation],
        default=None,
        help="over-long texts: NONE = error, END = keep the start, START = keep the "
        f"end (default: the server's, {DEFAULT_TRUNCATION.value} unless configured)",
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        default=None,
        help="embed empty texts instead of rejecting them",
    )
    _add_retry_args(p)


def _add_corpus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=("auto", "text", "jsonl"),
        default="auto",
        help="input format; auto = jsonl for .jsonl/.ndjson, else one text per line",
    )
    p.add_argument(
        "--field", default="text", help="JSONL key holding the text (default %(default)s)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``triton-embed``."""
    parser = argparse.ArgumentParser(
        prog="triton-embed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    e = sub.add_parser("embed", help="embed a text/JSONL file into .npy (and Parquet)")
    e.add_argument(
        "input", type=Path, help="text file (one text per line; blank lines are skipped) or JSONL"
    )
    e.add_argument(
        "-o", "--output", type=Path, required=True, help="output .npy (float32 [n, dim])"
    )
    e.add_argument(
        "--parquet", type=Path, help="also write a Parquet file (text, num_tokens, embedding)"
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
    _add_connection_args(e)
    _add_corpus_args(e)

    q = sub.add_parser("query", help="nearest texts of an embedded corpus to a query")
    q.add_argument("queries", nargs="+", help="query text(s)")
    q.add_argument("--embeddings", type=Path, required=True, help=".npy written by 'embed'")
    q.add_argument("--corpus", type=Path, required=True, help="the file that was embedded")
    q.add_argument(
        "-k",
        "--top-k",
        type=positive_int,
        default=5,
        help="results per query (default %(default)s)",
    )
    q.add_argument("--json", action="store_true", help="print results as JSON")
    _add_connection_args(q)
    _add_corpus_args(q)

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
        default=2,
        help="embedder instances on a CPU-only host, spread over NUMA nodes (default %(default)s)",
    )
    d.add_argument("--plan-out", type=Path, default=None, help="also write the plan as JSON")

    r = sub.add_parser(
        "repository", help="load or unload a model on the server (sends the admin key)"
    )
    r.add_argument("action", choices=("load", "unload"), help="what to do with the model")
    r.add_argument("name", help="the model's name in the server's model repository")
    r.add_argument(
        "--timeout-s",
        type=positive_float,
        default=600.0,
        help="deadline, seconds (default %(default)s)",
    )
    _add_key_args(r)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``triton-embed``; returns the exit code (1 on a reported error)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "embed":
            run_embed(args)
        elif args.command == "query":
            run_query(args)
        elif args.command == "doctor":
            # The doctor reads the serving host; the client never imports it otherwise.
            from triton_embed_server.doctor import run_doctor

            run_doctor(args)
        elif args.command == "repository":
            run_repository(args)
    except (EmbedClientError, OSError, ValueError) as exc:
        print(f"triton-embed {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
