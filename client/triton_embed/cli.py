"""``triton-embed``: the command-line tool over the client library.

Subcommands:
    embed   embed a text file (one text per line), JSONL or Parquet into Parquet shards of an
            output folder (streamed, resumable, over one or several servers; docs/bulk.md),
            or a small corpus into one .npy
    verify  check an output folder of embed (or of the Ray Data job) against its input
    query   the nearest texts of an embedded corpus to one or more queries
    rerank  rank the documents of a file by relevance to a query, with a reranker ensemble
            (docs/rerank.md)
    usage   tokens and cost per tenant and hour, from a gateway's GET /admin/usage
            (docs/tenants.md)
    doctor  the host's GPU/CPU/NUMA topology and a placement plan for embedder instances;
            Helm chart values for the host; inside a pod, a NUMA alignment check
    repository add|list|remove
            write, list or delete the Triton models of an embedding model in a model
            repository folder (the ensemble NAME and its steps NAME_tokenizer, NAME_embedder)
    repository load|unload
            load or unload a model through the server's repository API (needs the admin key)
    gateway an OpenAI- and TEI-compatible HTTP gateway in front of one or more servers
            (docs/operations.md, "Gateway"; needs the server package)

doctor, repository and gateway belong to the serving host: the server package registers them
(entry points :data:`COMMANDS_GROUP`); the client package never imports it.

The admin key (docs/operations.md, "Restricted APIs") is read from TRITON_EMBED_ADMIN_KEY,
the file TRITON_EMBED_ADMIN_KEY_FILE or --admin-key-file, or the server's default key file;
it is never taken on the command line, where other users of the host could read it.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from pathlib import Path

from triton_embed.cli_args import (
    add_connection_args,
    add_corpus_args,
    add_priority_arg,
    positive_int,
)
from triton_embed.cli_bulk import add_bulk_args, add_verify_parser, run_verify
from triton_embed.cli_commands import nearest, run_embed, run_query, summarize
from triton_embed.cli_rerank import add_rerank_parser, run_rerank
from triton_embed.cli_usage import add_usage_parser, run_usage
from triton_embed.errors import EmbedClientError

__all__ = [
    "COMMANDS_GROUP",
    "add_server_commands",
    "build_parser",
    "main",
    "nearest",
    "run_embed",
    "run_query",
    "run_rerank",
    "run_verify",
    "summarize",
]

#: The entry-point group of the serving host's subcommands (``doctor``, ``repository``,
#: ``gateway``; pyproject.toml). Each entry is ``register(subparsers)``: it adds one subparser
#: whose ``run`` default takes the parsed arguments and returns the exit status (``None``: 0).
#: The server package registers them, so the client never imports it.
COMMANDS_GROUP = "triton_embed.commands"


def add_server_commands(sub: argparse._SubParsersAction) -> None:
    """Add the subcommands registered under :data:`COMMANDS_GROUP`, in name order.

    A registration that cannot be imported (the server package or its dependencies are
    missing) still adds its subcommand, which then fails with one line naming what to install.
    """
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            register = entry.load()
        except ImportError as exc:
            # Its flags are unknown: it takes any (no prefix character matches), then fails.
            missing = sub.add_parser(
                entry.name, help=f"(not installed: {exc})", prefix_chars="\0", add_help=False
            )
            missing.add_argument("rest", nargs=argparse.REMAINDER)
            missing.set_defaults(run=_not_installed(entry.name, exc))
            continue
        register(sub)


def _not_installed(name: str, exc: ImportError):
    def run(args: argparse.Namespace) -> None:
        raise EmbedClientError(
            f"{name} needs the server package and its dependencies ({exc}); install "
            "triton-embed[gateway,serve] on the serving host"
        )

    return run


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
    add_priority_arg(e, "batch")
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
    add_priority_arg(q, "interactive")
    add_corpus_args(q)
    add_rerank_parser(sub)
    add_usage_parser(sub)

    add_server_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``triton-embed``; returns the exit code (1 on a reported error)."""
    args = build_parser().parse_args(argv)
    command = " ".join(filter(None, (args.command, getattr(args, "action", None))))
    try:
        if args.command == "embed":
            run_embed(args)
        elif args.command == "verify":
            run_verify(args)
        elif args.command == "query":
            run_query(args)
        elif args.command == "rerank":
            run_rerank(args)
        elif args.command == "usage":
            run_usage(args)
        else:  # a server command (COMMANDS_GROUP)
            return args.run(args) or 0
    except (EmbedClientError, OSError, ValueError) as exc:
        print(f"triton-embed {command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
