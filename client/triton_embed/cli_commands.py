"""The bodies of ``triton-embed embed`` and ``query``.

With the helpers they share: where a refused text came from, writing and pre-checking the
output files, reading the ``--embeddings`` file, the retry policy and admin key from the flags.
The parser and the entry point are in :mod:`triton_embed.cli`.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from triton_embed.admin import read_key_file
from triton_embed.cli_bulk import run_bulk
from triton_embed.cli_bulk import with_cli_flags as _with_cli_flags
from triton_embed.client import EmbeddingClient
from triton_embed.corpus import read_texts, read_texts_and_lines
from triton_embed.errors import EmbedClientError, InvalidInputError
from triton_embed.options import RequestOptions
from triton_embed.retry import RetryPolicy


def _plural(n: int, word: str) -> str:
    """``1 text``, ``2 texts``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _text_error(exc: InvalidInputError, where: Callable[[int], str]) -> EmbedClientError:
    """A refused text as the CLI reports it: where it came from, what is wrong, which flag.

    Args:
        exc: the client library's error.
        where: the text's origin from its index, e.g. ``corpus.jsonl:7`` or ``query 2``.
    """
    if exc.index is None or exc.reason is None:  # not about one text
        return EmbedClientError(_with_cli_flags(str(exc)))
    return EmbedClientError(f"{where(exc.index)}: the text {_with_cli_flags(exc.reason)}")


def _check_writable(flag: str, path: Path) -> None:
    """Fail now, before any embedding, if ``path`` cannot be written.

    Creates the missing parent folders; a file that did not exist is not left behind.

    Raises:
        EmbedClientError: names the flag, the path and why.
    """
    try:
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with open(path, "ab"):  # appending truncates nothing
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        raise EmbedClientError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None


def _write(flag: str, path: Path, write: Callable[[Path], None]) -> None:
    """Run ``write(path)``; an ``OSError`` becomes one line naming the flag and the path."""
    try:
        write(path)
    except OSError as exc:
        raise EmbedClientError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None


def _save_npy(path: Path, array: np.ndarray) -> None:
    """Write ``array`` as .npy under exactly ``path`` (``np.save(name)`` would add ``.npy``)."""
    with open(path, "wb") as f:
        np.save(f, array)


def _load_embeddings(path: Path) -> np.ndarray:
    """The ``[n, dim]`` array of a .npy or an output folder written by ``triton-embed embed``.

    Raises:
        EmbedClientError: one line naming ``--embeddings``, the file and what it must be.
    """
    what = "it must be a .npy file written by 'triton-embed embed' (its -o file)"
    if path.is_dir():
        from triton_embed.bulk.shards import read_vectors

        try:
            return read_vectors(path)
        except ValueError as exc:
            raise EmbedClientError(f"--embeddings {exc}") from None
    if not path.exists():
        npy = path.with_name(path.name + ".npy")
        guess = f"; did you mean {npy}?" if npy.is_file() else ""
        raise EmbedClientError(f"--embeddings {path}: no such file{guess}")
    try:
        vectors = np.load(path, allow_pickle=False)
    except (ValueError, EOFError) as exc:  # not .npy: numpy would try it as a pickle
        raise EmbedClientError(f"--embeddings {path} is not a .npy file; {what}") from exc
    except OSError as exc:
        raise EmbedClientError(f"cannot read --embeddings {path}: {exc.strerror or exc}") from exc
    if isinstance(vectors, np.lib.npyio.NpzFile):
        vectors.close()
        raise EmbedClientError(f"--embeddings {path} is a .npz archive, not a .npy file; {what}")
    if vectors.ndim != 2 or not np.issubdtype(vectors.dtype, np.number):
        raise EmbedClientError(
            f"--embeddings {path} does not hold a [n, dim] array of numbers (it holds "
            f"{vectors.dtype} {list(vectors.shape)}); {what}"
        )
    return vectors


def _retry_policy(args: argparse.Namespace) -> RetryPolicy:
    """The client's retry policy from ``--retries`` and ``--retry-max-wait-s``."""
    initial = min(RetryPolicy().initial_wait_s, args.retry_max_wait_s)
    return RetryPolicy(args.retries, initial, args.retry_max_wait_s)


def _key_from_file(args: argparse.Namespace) -> str | None:
    """The admin key in ``--admin-key-file``; ``None`` without the flag."""
    return None if args.admin_key_file is None else read_key_file(args.admin_key_file)


def _client(args: argparse.Namespace, options: RequestOptions, **sizes) -> EmbeddingClient:
    """The client of ``--url``, ``--model``, ``--timeout-s``, ``--admin-key-file``, the retries.

    Args:
        args: the parsed flags of ``embed`` or ``query``.
        options: its request options.
        **sizes: ``max_concurrency`` and ``batch_size``, if given.
    """
    return EmbeddingClient(
        args.url,
        args.model,
        timeout_s=args.timeout_s,
        admin_key=_key_from_file(args),  # None: the client reads the environment
        retry=_retry_policy(args),
        options=options,
        priority=getattr(args, "priority", None),
        **sizes,
    )


def summarize(num_texts: int, num_tokens: int, elapsed_s: float, latencies_s: list[float]) -> dict:
    """Closing figures of an embedding run.

    Returns:
        ``texts``, ``tokens``, ``seconds``, ``texts_per_s``, ``tokens_per_s``,
        ``p50_ms``, ``p99_ms`` (request latency percentiles, numpy's linear interpolation).
    """
    lat = np.asarray(latencies_s) * 1000.0 if latencies_s else np.zeros(1)
    return {
        "texts": num_texts,
        "tokens": num_tokens,
        "seconds": round(elapsed_s, 3),
        "texts_per_s": round(num_texts / elapsed_s, 1) if elapsed_s else 0.0,
        "tokens_per_s": round(num_tokens / elapsed_s, 1) if elapsed_s else 0.0,
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
    }


def run_embed(args: argparse.Namespace) -> dict:
    """``triton-embed embed``: returns the closing summary.

    An ``-o`` that does not end in ``.npy`` is an output folder: the streaming, resumable path
    (:func:`triton_embed.cli_bulk.run_bulk`). A ``.npy`` holds the corpus in memory.
    """
    from tqdm import tqdm

    options = RequestOptions.from_args(args, input_type_default="document")  # a corpus is documents
    if args.output.suffix.lower() != ".npy":
        if args.parquet:
            raise EmbedClientError(
                "--parquet goes with a .npy -o; an output folder is already Parquet"
            )
        return run_bulk(args, options, _key_from_file(args), _retry_policy(args))
    for flag, given in (("--include-text", args.include_text), ("--overwrite", args.overwrite),
                        ("--format parquet", args.format == "parquet"),
                        ("--top-k", args.top_k is not None),
                        ("--threshold", args.threshold is not None),
                        ("--output-kind", args.output_kind is not None)):  # fmt: skip
        if given:
            raise EmbedClientError(f"{flag} needs an output folder (-o DIR), not a .npy file")
    if "," in args.url:
        raise EmbedClientError(
            "several --url need an output folder (-o DIR); a .npy output uses one server"
        )
    texts, lines = read_texts_and_lines(args.input, args.format, args.field)
    if not texts:
        raise EmbedClientError(f"{args.input} holds no texts")
    outputs = {"-o": args.output, "--parquet": args.parquet, "--summary-json": args.summary_json}
    given = {flag: out for flag, out in outputs.items() if out is not None}
    seen: dict[Path, str] = {}
    for flag, out in given.items():
        other = seen.setdefault(out.resolve(), flag)
        if other != flag:
            raise EmbedClientError(f"{other} and {flag} name the same file, {out}")
        _check_writable(flag, out)
    if args.parquet:
        import pyarrow  # noqa: F401 - fail before embedding when it is missing
    sizes = {"max_concurrency": args.concurrency, "batch_size": args.batch_size}
    with _client(args, options, **sizes) as client:
        # None: tqdm hides the bar when stderr is not a terminal (logs get no \r updates)
        bar = tqdm(
            total=len(texts),
            unit="text",
            disable=True if args.no_progress else None,
            file=sys.stderr,
        )

        def progress(n_texts: int, n_tokens: int) -> None:
            bar.update(n_texts)

        t0 = time.perf_counter()
        try:
            result = client.embed_with_details(texts, on_batch_done=progress)
        except InvalidInputError as exc:
            raise _text_error(exc, lambda i: f"{args.input}:{lines[i]}") from None
        finally:
            bar.close()
        elapsed = time.perf_counter() - t0
    _write("-o", args.output, lambda path: _save_npy(path, result.embeddings))
    if args.parquet:
        import pyarrow as pa
        import pyarrow.parquet as pq

        dim = result.embeddings.shape[1]
        table = pa.table(
            {
                "text": texts,
                "num_tokens": result.num_tokens,
                "embedding": pa.FixedSizeListArray.from_arrays(
                    pa.array(
                        result.embeddings.reshape(-1),
                        type=pa.from_numpy_dtype(result.embeddings.dtype),
                    ),
                    dim,
                ),
            }
        )
        _write("--parquet", args.parquet, lambda path: pq.write_table(table, path))
    summary = summarize(len(texts), int(result.num_tokens.sum()), elapsed, result.latencies_s)
    summary["dim"] = int(result.embeddings.shape[1])
    summary["retries"] = result.retries
    retried = (
        f"; {_plural(result.retries, 'request')} sent again after the server refused "
        f"{'it' if result.retries == 1 else 'them'} (overloaded)"
        if result.retries
        else ""
    )
    if args.summary_json:
        text = json.dumps(summary, indent=2)
        _write("--summary-json", args.summary_json, lambda path: path.write_text(text))
    print(
        f"embedded {_plural(summary['texts'], 'text')} ({_plural(summary['tokens'], 'token')}, "
        f"dim {summary['dim']}) "
        f"in {summary['seconds']:.2f} s: {summary['texts_per_s']:.1f} texts/s, "
        f"{summary['tokens_per_s']:.0f} tokens/s; request latency p50 {summary['p50_ms']:.1f} ms, "
        f"p99 {summary['p99_ms']:.1f} ms{retried} -> {args.output}"
    )
    return summary


def nearest(
    corpus_vectors: np.ndarray, query_vectors: np.ndarray, k: int
) -> list[list[tuple[int, float]]]:
    """Top-``k`` corpus rows by cosine similarity for each query.

    Args:
        corpus_vectors: float ``[n, dim]``.
        query_vectors: float ``[q, dim]``.
        k: results per query (capped at ``n``).

    Raises:
        ValueError: ``k`` < 1.

    Returns:
        Per query, ``(row, cosine)`` pairs, best first.
    """

    def unit(m: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        return m / np.where(norms == 0, 1, norms)

    scores = unit(query_vectors.astype(np.float32)) @ unit(corpus_vectors.astype(np.float32)).T
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, corpus_vectors.shape[0])
    out = []
    for row in scores:
        top = np.argsort(-row, kind="stable")[:k]
        out.append([(int(i), float(row[i])) for i in top])
    return out


def _embed_queries(client, queries: list[str], input_type: str | None) -> np.ndarray:
    """Embed queries with ``input_type``; by default ``query`` if the model has that prompt.

    A model without a ``query`` prompt (all-MiniLM-L6-v2 has no prompts) refuses
    ``input_type=query`` naming its input types; the queries are then embedded as they are.
    """
    if input_type is not None:
        return client.embed(queries, input_type=input_type)
    try:
        return client.embed(queries, input_type="query")
    except InvalidInputError as exc:
        if "input_type='query' is not a prompt of this model" not in str(exc):
            raise
        return client.embed(queries)


def run_query(args: argparse.Namespace) -> list[dict]:
    """``triton-embed query``: prints and returns the hits."""
    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    vectors = _load_embeddings(args.embeddings)
    texts = read_texts(args.corpus, args.format, args.field)
    if len(texts) != len(vectors):
        raise EmbedClientError(
            f"{args.corpus} has {len(texts)} texts but {args.embeddings} has {len(vectors)} "
            "embeddings; pass the file that was embedded"
        )
    options = RequestOptions.from_args(args)  # no --input-type: query, if the model has it
    with _client(args, options) as client:
        try:
            qv = _embed_queries(client, args.queries, options.input_type)
        except InvalidInputError as exc:
            raise _text_error(exc, lambda i: f"query {i + 1}") from None
    if qv.shape[1] != vectors.shape[1]:
        raise EmbedClientError(
            f"the queries have {qv.shape[1]} dimensions but {args.embeddings} has "
            f"{vectors.shape[1]}; pass the --model and --dimensions the corpus was embedded with"
        )
    results = []
    for query, hits in zip(args.queries, nearest(vectors, qv, args.top_k), strict=True):
        results.append(
            {
                "query": query,
                "hits": [
                    {"rank": r + 1, "index": i, "cosine": round(s, 4), "text": texts[i]}
                    for r, (i, s) in enumerate(hits)
                ],
            }
        )
    if args.json:
        print(json.dumps(results, ensure_ascii=False, indent=2))
    else:
        for res in results:
            print(f"query: {res['query']}")
            for hit in res["hits"]:
                one_line = " ".join(hit["text"].split())
                short = one_line if len(one_line) <= 110 else one_line[:107] + "..."
                print(f"  {hit['rank']}. [{hit['cosine']:.3f}] #{hit['index']}: {short}")
    return results
