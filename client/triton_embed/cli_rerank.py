"""``triton-embed rerank``: rank the documents of a file by their relevance to a query.

``triton-embed rerank "what is a panda?" --documents docs.txt`` reads the documents (one
per line, or JSONL with ``--field``, as ``embed`` and ``query`` read a corpus), scores each
against the query with a reranker ensemble (:meth:`triton_embed.client.EmbeddingClient.rerank`,
docs/rerank.md) and prints the ranking, best first: rank, the document's index in the file
(0-based, blank lines skipped), its score and its first characters; ``--json`` prints the
same as JSON with the whole documents.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from triton_embed.cli_args import (
    add_corpus_args,
    add_key_args,
    add_model_arg,
    add_pair_option_args,
    add_retry_args,
    positive_float,
    positive_int,
)
from triton_embed.cli_bulk import with_cli_flags
from triton_embed.cli_commands import _key_from_file, _retry_policy
from triton_embed.client import EmbeddingClient
from triton_embed.corpus import read_texts_and_lines
from triton_embed.errors import EmbedClientError, InvalidInputError
from triton_embed.reranking import MAX_DOCUMENTS
from triton_embed.transport.addresses import DEFAULT_RERANKER

#: Characters of a document printed in the ranking (``--json`` prints it whole).
SHOWN_CHARS = 100


def add_rerank_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``rerank`` to the ``triton-embed`` subcommands."""
    r = sub.add_parser("rerank", help="rank the documents of a file by relevance to a query")
    r.add_argument("query", help="the query the documents are ranked against")
    r.add_argument(
        "--documents",
        type=str,
        required=True,
        help="text file (one document per line; blank lines are skipped) or JSONL (--field)",
    )
    r.add_argument(
        "-n",
        "--top-n",
        type=positive_int,
        default=None,
        help="print the best N (default: every document)",
    )
    r.add_argument("--json", action="store_true", help="print the ranking as JSON")
    r.add_argument(
        "--max-documents",
        type=positive_int,
        default=MAX_DOCUMENTS,
        help="the most documents one call reranks (default %(default)s)",
    )
    r.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="pairs per request (default: the server's max_batch_size)",
    )
    r.add_argument(
        "--concurrency",
        type=positive_int,
        default=4,
        help="requests in flight (default %(default)s)",
    )
    r.add_argument(
        "--timeout-s",
        type=positive_float,
        default=120.0,
        help="per-request deadline, seconds (default %(default)s)",
    )
    add_key_args(r, "one server")
    add_model_arg(r, default=DEFAULT_RERANKER)
    add_pair_option_args(r)
    add_retry_args(r)
    add_corpus_args(r, records=False)


def _one_line(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters (``...`` when cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def run_rerank(args: argparse.Namespace) -> dict[str, Any]:
    """``triton-embed rerank``: prints and returns the ranking.

    Returns:
        ``{"query", "model", "tokens", "results": [{"rank", "index", "score", "document"}]}``,
        best first; ``index`` counts the file's documents from 0.

    Raises:
        EmbedClientError: no documents, a refused document (named by its line), or the
            client's errors.
        ValueError, OSError: the file cannot be read.
    """
    texts, lines = read_texts_and_lines(args.documents, args.format, args.field)
    if not texts:
        raise EmbedClientError(f"{args.documents} holds no documents")
    client = EmbeddingClient(
        args.url,
        args.model,
        timeout_s=args.timeout_s,
        max_concurrency=args.concurrency,
        batch_size=args.batch_size,
        admin_key=_key_from_file(args),
        retry=_retry_policy(args),
    )
    with client:
        try:
            result = client.rerank(
                args.query,
                texts,
                top_n=args.top_n,
                raw_scores=args.raw_scores,
                truncation=args.truncation,
                max_document_tokens=args.max_document_tokens,
                instruction=args.instruction,
                max_documents=args.max_documents,
            )
        except InvalidInputError as exc:
            where = f"{args.documents}:{lines[exc.index]}: " if exc.index is not None else ""
            raise EmbedClientError(f"{where}{with_cli_flags(str(exc))}") from None
    ranking = {
        "query": args.query,
        "model": args.model,
        "tokens": int(result.num_tokens.sum()),
        "results": [
            {"rank": r + 1, "index": int(i), "score": float(s), "document": texts[i]}
            for r, (i, s) in enumerate(zip(result.indices, result.scores, strict=True))
        ],
    }
    if args.json:
        print(json.dumps(ranking, ensure_ascii=False, indent=2))
        return ranking
    print(f"query: {args.query}")
    for hit in ranking["results"]:
        shown = _one_line(hit["document"])
        print(f"  {hit['rank']}. [{hit['score']:.4f}] #{hit['index']}: {shown}")
    return ranking
