"""The flags several ``triton-embed`` commands share, and the argparse number types.

Used by :mod:`triton_embed.cli` (the parser), :mod:`triton_embed.cli_bulk`, the server
package's subcommands and the Ray job's parser (:mod:`triton_embed.bulk.ray_job`): the
request options' flags (:func:`add_request_option_args`), ``--url`` and ``--model`` are
defined here only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from triton_embed.client import DEFAULT_MODEL, DEFAULT_URL
from triton_embed.options import DEFAULT_TRUNCATION, EmbeddingType, Truncation, parse_flag
from triton_embed.rerank_options import (
    DEFAULT_PAIR_TRUNCATION,
    MAX_INSTRUCTION_CHARS,
    PairTruncation,
)
from triton_embed.retry import DEFAULT_MAX_WAIT_S, DEFAULT_RETRIES


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


def flag(raw: str) -> bool:
    """Argparse type: ``true``/``false`` (or ``1``/``0``), case-insensitive."""
    try:
        return parse_flag(raw, "value")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def add_retry_args(p: argparse.ArgumentParser) -> None:
    """``--retries``, ``--retry-max-wait-s``: how a refused request is sent again."""
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


def add_url_arg(
    p: argparse.ArgumentParser,
    several: str = "'embed' into a folder takes several, comma-separated, and balances over them",
) -> None:
    """``--url``: the server's gRPC ``host:port``, by default ``DEFAULT_URL``.

    Args:
        p: the parser.
        several: the help's last words, on whether the command takes several servers.
    """
    p.add_argument(
        "--url",
        default=DEFAULT_URL,
        help="the server's gRPC port as host:port, without http:// (default %(default)s); "
        + several,
    )


def add_key_args(p: argparse.ArgumentParser, several: str | None = None) -> None:
    """``--url`` and ``--admin-key-file``.

    Args:
        p: the parser.
        several: the ``--url`` help's last words (``None``: :func:`add_url_arg`'s).
    """
    if several is None:
        add_url_arg(p)
    else:
        add_url_arg(p, several)
    p.add_argument(
        "--admin-key-file",
        type=Path,
        default=None,
        help="file holding the server's admin key (default: TRITON_EMBED_ADMIN_KEY, the file "
        "TRITON_EMBED_ADMIN_KEY_FILE, the server's default key file)",
    )


def add_model_arg(p: argparse.ArgumentParser, default: str = DEFAULT_MODEL) -> None:
    """``--model``: the ensemble (default :data:`~triton_embed.client.DEFAULT_MODEL`).

    Args:
        p: the parser.
        default: the default ensemble (``rerank``'s: a reranker).
    """
    p.add_argument("--model", default=default, help="ensemble name (default %(default)s)")


def add_pair_option_args(p: argparse.ArgumentParser) -> None:
    """A reranker's request options' flags, defined once (:mod:`triton_embed.rerank_options`).

    ``--truncation``, ``--raw-scores``, ``--max-document-tokens``, ``--instruction``; each
    not given leaves the server's default (``--raw-scores`` is off unless given).
    """
    p.add_argument(
        "--truncation",
        type=str.lower,
        choices=[t.value for t in PairTruncation],
        default=None,
        help="a pair over the model's token budget: longest_first = cut the longer of query "
        "and document first, only_second = cut the document only, none = error (default: "
        f"the server's, {DEFAULT_PAIR_TRUNCATION.value})",
    )
    p.add_argument(
        "--raw-scores",
        action="store_true",
        help="print the model's logits instead of its activated scores (a sigmoid)",
    )
    p.add_argument(
        "--max-document-tokens",
        type=positive_int,
        default=None,
        help="cut each document to N tokens before the pair is truncated (default: no cut)",
    )
    p.add_argument(
        "--instruction",
        default=None,
        help="a decoder reranker's instruction (Qwen3-Reranker's <Instruct> line), at most "
        f"{MAX_INSTRUCTION_CHARS} characters (default: the model's)",
    )


def add_request_option_args(
    p: argparse.ArgumentParser, input_type_default: str, embedding_type: bool = False
) -> None:
    """The request options' flags, defined once (:mod:`triton_embed.options`).

    ``--truncation``, ``--allow-empty``, ``--input-type``, ``--dimensions``, ``--normalize``,
    and with ``embedding_type`` also ``--embedding-type``; each defaults to ``None`` (not
    set: the server's default). :meth:`triton_embed.options.RequestOptions.from_args` reads
    them.

    Args:
        p: the parser.
        input_type_default: the help's words on the default ``--input-type``, e.g.
            ``"document"``.
        embedding_type: also add ``--embedding-type`` (a command that writes vectors out;
            ``query`` compares float vectors and has none).
    """
    p.add_argument(
        "--truncation",
        type=str.upper,
        choices=[t.value for t in Truncation],
        default=None,
        help="over-long texts: NONE = error, END = keep the start, START = keep the "
        "end, CHUNK = embed them whole in windows and average (default: the server's, "
        f"{DEFAULT_TRUNCATION.value} unless configured)",
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        default=None,
        help="embed empty texts instead of rejecting them",
    )
    p.add_argument(
        "--input-type",
        default=None,
        help="the model's prompt to put in front of each text: query, document or a prompt "
        f"name of the model (default: {input_type_default})",
    )
    p.add_argument(
        "--dimensions",
        type=positive_int,
        default=None,
        help="cut vectors to their first N values, L2-normalized again (one of the model's "
        "Matryoshka dimensions; query with the dimensions the corpus was embedded with)",
    )
    if embedding_type:
        p.add_argument(
            "--embedding-type",
            choices=[t.value for t in EmbeddingType],
            default=None,
            help="float32 (default), float16 or ubinary (sign bits packed 8 per byte)",
        )
    p.add_argument(
        "--normalize",
        type=flag,
        default=None,
        metavar="{true,false}",
        help="false = the pooled vectors without L2 normalization (as TEI's normalize=false); "
        "true = L2-normalized (default: the model's own, normalized for all-MiniLM-L6-v2)",
    )


def _parsed(parse):
    """An argparse type of an option parser that raises ``OptionError`` (a ``ValueError``)."""

    def convert(raw: str):
        try:
            return parse(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def add_sparse_option_args(p: argparse.ArgumentParser) -> None:
    """A sparse model's own request options' flags (:mod:`triton_embed.sparse_options`).

    ``--top-k`` (a whole number >= 1) and ``--threshold`` (a finite number >= 0); each
    defaults to ``None`` (the server's: every non-zero weight). An embedding model refuses
    them (:func:`triton_embed.bulk.kinds.request_options`).
    """
    from triton_embed.sparse_options import parse_threshold, parse_top_k

    p.add_argument(
        "--top-k",
        type=_parsed(parse_top_k),
        default=None,
        help="a sparse model: keep each text's N largest weights (default: every weight)",
    )
    p.add_argument(
        "--threshold",
        type=_parsed(parse_threshold),
        default=None,
        help="a sparse model: keep the weights above this number (default 0: every non-zero one)",
    )


#: The values of ``--output-kind`` (:class:`triton_embed.bulk.kinds.OutputKind`'s).
OUTPUT_KINDS = ("dense", "sparse", "tokens")


def add_output_kind_arg(p: argparse.ArgumentParser) -> None:
    """``--output-kind dense|sparse|tokens``: the head of a hybrid model a bulk job writes.

    Default ``None``: a hybrid model's dense vectors; another model takes only its own kind
    (:func:`triton_embed.bulk.kinds.model_view`).
    """
    p.add_argument(
        "--output-kind",
        choices=OUTPUT_KINDS,
        type=str.lower,
        default=None,
        help="a hybrid model (BGE-M3): the vectors to write, dense (column 'embedding'), "
        "sparse (column 'sparse') or tokens (its ColBERT vectors, column 'tokens'); only that "
        "head is computed (default: dense, as 'embed' of the client and /v1/embeddings give). "
        "Other models write their own kind",
    )


def add_connection_args(p: argparse.ArgumentParser, embedding_type: bool = False) -> None:
    """The server, model, deadline, request options and retries of a command that embeds.

    Args:
        p: the parser.
        embedding_type: also add ``--embedding-type`` (``embed``).
    """
    add_key_args(p)
    add_model_arg(p)
    p.add_argument(
        "--timeout-s",
        type=positive_float,
        default=120.0,
        help="per-request deadline, seconds (default %(default)s)",
    )
    add_request_option_args(
        p,
        "document for 'embed'; for 'query', query when the model has a query prompt",
        embedding_type,
    )
    add_retry_args(p)


def add_corpus_args(p: argparse.ArgumentParser, records: bool = True) -> None:
    """``--format``, ``--field``, ``--id-field``: how an input file is read.

    Args:
        p: the parser.
        records: also Parquet and ``--id-field`` (the commands that write records); without,
            text or JSONL only (``rerank``'s documents).
    """
    if not records:
        p.add_argument(
            "--format",
            choices=("auto", "text", "jsonl"),
            default="auto",
            help="input format; auto = jsonl for .jsonl/.ndjson, else one text per line",
        )
        p.add_argument(
            "--field", default="text", help="JSONL key holding the text (default %(default)s)"
        )
        return
    p.add_argument(
        "--format",
        choices=("auto", "text", "jsonl", "parquet"),
        default="auto",
        help="input format; auto = jsonl for .jsonl/.ndjson, parquet for .parquet/.pq, else one "
        "text per line (parquet needs an output folder)",
    )
    p.add_argument(
        "--field",
        default="text",
        help="JSONL key or Parquet column holding the text (default %(default)s)",
    )
    p.add_argument(
        "--id-field",
        default="id",
        help="JSONL key or Parquet column of each record's id, used when present; else the "
        "0-based line (row) number (default %(default)s)",
    )


def add_priority_arg(p: argparse.ArgumentParser, default: str) -> None:
    """``--priority interactive|batch`` (:mod:`triton_embed.priority`), default ``default``."""
    from triton_embed.priority import Priority

    p.add_argument(
        "--priority",
        choices=[c.value for c in Priority],
        default=default,
        help="request class: interactive requests are served first in every step's queue, "
        "batch ones when none waits (default %(default)s)",
    )
