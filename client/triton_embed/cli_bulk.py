"""``triton-embed embed INPUT -o OUT_DIR`` (streaming, resumable) and ``triton-embed verify``.

The flags are declared here and added to the ``embed`` and ``verify`` parsers of
:mod:`triton_embed.cli`; ``embed`` with an ``-o`` that does not end in ``.npy`` comes here
(:func:`run_bulk`). Guide: docs/bulk.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from triton_embed.cli_args import add_output_kind_arg, add_sparse_option_args, positive_int
from triton_embed.errors import EmbedClientError, InvalidInputError
from triton_embed.options import RequestOptions

# The server's hints name request parameters; the CLI sets them with its own flags.
_FLAG_HINTS = (
    ("set the request parameter allow_empty=true", "pass --allow-empty"),
    ("set the request parameter truncation=", "pass --truncation "),
)


def with_cli_flags(message: str) -> str:
    """``message`` with the request parameters of its hints replaced by the CLI's flags."""
    for parameter, flag in _FLAG_HINTS:
        message = message.replace(parameter, flag)
    return message


#: Records per shard by default (:data:`triton_embed.bulk.settings.DEFAULT_SHARD_ROWS`).
DEFAULT_SHARD_ROWS = 10_000


def add_bulk_args(p: argparse.ArgumentParser) -> None:
    """The ``embed`` flags of the streaming output.

    A sparse model's ``--top-k`` and ``--threshold`` are among them, and a hybrid model's
    ``--output-kind``: only an output folder holds sparse or token vectors.
    """
    add_sparse_option_args(p)
    add_output_kind_arg(p)
    p.add_argument(
        "--shard-rows",
        type=positive_int,
        default=DEFAULT_SHARD_ROWS,
        help="records per Parquet shard of an output folder (default %(default)s)",
    )
    p.add_argument(
        "--include-text",
        action="store_true",
        help="also write each record's text into the shards of an output folder",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace another job's output in the -o folder instead of refusing",
    )


def add_verify_parser(sub) -> argparse.ArgumentParser:
    """``triton-embed verify OUT_DIR [INPUT]``."""
    v = sub.add_parser(
        "verify",
        help="check an output folder of 'embed' (or of the Ray Data job)",
        description="Check a finished output folder: every shard readable and unchanged "
        "(SHA-256 of the manifest), the columns, one dimension, ids unique, rows as the "
        "manifest says; with INPUT also that the ids are exactly the input's. Exit 0 when "
        "good, 1 with one line per problem.",
    )
    v.add_argument("output", type=Path, help="the output folder")
    v.add_argument("input", type=Path, nargs="?", help="the input it was made from")
    v.add_argument("--format", choices=("auto", "text", "jsonl", "parquet"), default="auto")
    v.add_argument("--field", default="text", help="JSONL key or Parquet column of the text")
    v.add_argument("--id-field", default="id", help="JSONL key or Parquet column of the id")
    v.add_argument("--json", action="store_true", help="print the verdict as JSON")
    return v


def _source(args: argparse.Namespace):
    from triton_embed.bulk.sources import InputError, Source

    try:
        return Source(args.input, args.format, args.field, args.id_field)
    except InputError as exc:
        raise EmbedClientError(str(exc)) from None


def _default_retry(args: argparse.Namespace) -> bool:
    """Whether the retry flags were left at their defaults (a bulk job then waits longer)."""
    from triton_embed.retry import DEFAULT_MAX_WAIT_S, DEFAULT_RETRIES

    return args.retries == DEFAULT_RETRIES and args.retry_max_wait_s == DEFAULT_MAX_WAIT_S


def run_bulk(args: argparse.Namespace, options: RequestOptions, key: str | None, retry) -> dict:
    """``embed`` into an output folder; prints and returns the closing summary.

    Args:
        args: the parsed ``embed`` flags.
        options: the request options of every request
            (:meth:`~triton_embed.options.RequestOptions.from_args` of ``args``).
        key: the admin key of ``--admin-key-file``; ``None`` reads the environment.
        retry: the retry policy of the retry flags (left at their defaults: the bulk job's
            patient :data:`~triton_embed.bulk.pool_embedder.BULK_RETRY`).
    """
    from triton_embed.admin import read_admin_key
    from triton_embed.bulk.job import BulkJob
    from triton_embed.bulk.kinds import OutputKind
    from triton_embed.bulk.pool_embedder import BULK_RETRY
    from triton_embed.bulk.settings import JobSettings
    from triton_embed.bulk.sources import InputError
    from triton_embed.priority import Priority
    from triton_embed.sparse_options import SparseOptions

    settings = JobSettings(
        model=args.model,
        options=options,
        sparse=SparseOptions(top_k=args.top_k, threshold=args.threshold),
        output=OutputKind.parse(args.output_kind),
        shard_rows=args.shard_rows,
        include_text=args.include_text,
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        timeout_s=args.timeout_s,
        admin_key=key or read_admin_key(),
        retry=BULK_RETRY if _default_retry(args) else retry,
        priority=Priority.parse(args.priority or Priority.BATCH),
    )
    # The system allocator gives a written shard's buffers back to the OS (pyarrow's default
    # pool keeps them): peak RSS stays one shard's worth. This process only runs the job.
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    job = BulkJob(
        _source(args),
        args.output,
        args.url,
        settings,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    if job.resumed_rows_at_start and not job.manifest["complete"]:
        print(
            f"resuming {args.output}: {len(job.manifest['shards'])} shards "
            f"({job.resumed_rows_at_start} records) already written",
            file=sys.stderr,
        )
    try:
        summary = job.run()
    except (InputError, InvalidInputError) as exc:
        raise EmbedClientError(with_cli_flags(str(exc))) from None
    except KeyboardInterrupt:
        raise EmbedClientError(
            f"interrupted; {len(job.manifest['shards'])} shards are complete in {args.output}: "
            "run the same command again to continue"
        ) from None
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary, indent=2))
    if summary["already_complete"]:
        print(
            f"{args.output} is already complete ({summary['rows']} rows in {summary['shards']} "
            "shards); nothing to do (--overwrite embeds it again)"
        )
        return summary
    retried = f"; {summary['retries']} requests sent again" if summary["retries"] else ""
    vectors = {"sparse": "sparse", "multivector": f"token vectors of dim {summary['dim']}"}.get(
        summary["kind"], f"dim {summary['dim']}"
    )
    print(
        f"embedded {summary['texts']} texts ({summary['tokens']} tokens, {vectors}) "
        f"in {summary['seconds']:.2f} s: {summary['texts_per_s']:.1f} texts/s, "
        f"{summary['tokens_per_s']:.0f} tokens/s; request latency p50 {summary['p50_ms']:.1f} ms,"
        f" p99 {summary['p99_ms']:.1f} ms{retried} -> {args.output} ({summary['rows']} rows in "
        f"{summary['shards']} shards)"
    )
    return summary


def run_verify(args: argparse.Namespace) -> dict:
    """``verify``: prints the verdict; raises with every problem when there is one."""
    from triton_embed.bulk.verify import verify

    source = _source(args) if args.input is not None else None
    verdict = verify(args.output, source)
    result = {
        "ok": verdict.ok,
        "rows": verdict.rows,
        "shards": verdict.shards,
        "embedding_width": verdict.dim,
        "column": verdict.column,
        "sparse_weights": verdict.weights,
        "problems": verdict.problems,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    elif verdict.ok:
        against = f", ids exactly those of {args.input}" if source is not None else ""
        vectors = f"{verdict.dim} values per embedding"
        if verdict.column == "sparse":
            mean = verdict.weights / max(verdict.rows, 1)
            vectors = f"sparse vectors of {mean:.1f} weights on average"
        print(
            f"{args.output}: OK, {verdict.rows} rows in {verdict.shards} shards, {vectors}{against}"
        )
    if not verdict.ok:
        raise EmbedClientError(
            f"{args.output} failed verification:\n  " + "\n  ".join(verdict.problems)
        )
    return result
