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
import errno
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from triton_embed.admin import grpc_headers, read_admin_key, read_key_file
from triton_embed.client import (
    DEFAULT_MODEL,
    DEFAULT_URL,
    EmbeddingClient,
    _map_error,
    check_url,
)
from triton_embed.corpus import read_texts, read_texts_and_lines
from triton_embed.errors import EmbedClientError, InvalidInputError
from triton_embed.options import DEFAULT_TRUNCATION, Truncation
from triton_embed.retry import DEFAULT_MAX_WAIT_S, DEFAULT_RETRIES, RetryPolicy


def positive_int(raw: str) -> int:
    """Argparse type: a whole number >= 1 (argparse names the flag in its error)."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(raw: str) -> int:
    """Argparse type: a whole number >= 0."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(raw: str) -> float:
    """Argparse type: a finite number > 0."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {raw}")
    return value


def _plural(n: int, word: str) -> str:
    """``1 text``, ``2 texts``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# The server's hints name request parameters; the CLI sets them with its own flags.
_FLAG_HINTS = (
    ("set the request parameter allow_empty=true", "pass --allow-empty"),
    ("set the request parameter truncation=", "pass --truncation "),
)


def _with_cli_flags(message: str) -> str:
    """``message`` with the request parameters of its hints replaced by the CLI's flags."""
    for parameter, flag in _FLAG_HINTS:
        message = message.replace(parameter, flag)
    return message


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
    """The ``[n, dim]`` array of a .npy written by ``triton-embed embed``.

    Raises:
        EmbedClientError: one line naming ``--embeddings``, the file and what it must be.
    """
    what = "it must be a .npy file written by 'triton-embed embed' (its -o file)"
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


def _retry_policy(args: argparse.Namespace) -> RetryPolicy:
    """The client's retry policy from ``--retries`` and ``--retry-max-wait-s``."""
    initial = min(RetryPolicy().initial_wait_s, args.retry_max_wait_s)
    return RetryPolicy(args.retries, initial, args.retry_max_wait_s)


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


def _key_from_file(args: argparse.Namespace) -> str | None:
    """The admin key in ``--admin-key-file``; ``None`` without the flag."""
    return None if args.admin_key_file is None else read_key_file(args.admin_key_file)


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
    """``triton-embed embed``: returns the closing summary."""
    from tqdm import tqdm

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
    with EmbeddingClient(
        args.url,
        args.model,
        timeout_s=args.timeout_s,
        max_concurrency=args.concurrency,
        batch_size=args.batch_size,
        truncation=args.truncation,
        allow_empty=args.allow_empty,
        admin_key=_key_from_file(args),  # None: the client reads the environment
        retry=_retry_policy(args),
    ) as client:
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
                    pa.array(result.embeddings.reshape(-1), type=pa.float32()), dim
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
    with EmbeddingClient(
        args.url,
        args.model,
        timeout_s=args.timeout_s,
        truncation=args.truncation,
        allow_empty=args.allow_empty,
        admin_key=_key_from_file(args),  # None: the client reads the environment
        retry=_retry_policy(args),
    ) as client:
        try:
            qv = client.embed(args.queries)
        except InvalidInputError as exc:
            raise _text_error(exc, lambda i: f"query {i + 1}") from None
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


def run_repository(args: argparse.Namespace) -> None:
    """``triton-embed repository load|unload NAME``: one repository call over gRPC.

    Raises:
        AccessDeniedError: the server refused it (no admin key, or a wrong one).
        EmbedClientError: any other failure (unknown model, load error, unreachable server).
    """
    import tritonclient.grpc as grpcclient

    check_url(args.url)
    headers = grpc_headers(_key_from_file(args) or read_admin_key()) or None
    client = grpcclient.InferenceServerClient(args.url)
    try:
        if args.action == "load":
            client.load_model(args.name, headers=headers, client_timeout=args.timeout_s)
        else:
            client.unload_model(args.name, headers=headers, client_timeout=args.timeout_s)
    except Exception as exc:  # tritonclient / grpc errors
        raise _map_error(exc, args.url) from None
    finally:
        client.close()
    print(f"{args.action}ed {args.name!r} at {args.url}")


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
