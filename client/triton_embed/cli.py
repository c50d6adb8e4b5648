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

from triton_embed.cli_bulk import add_bulk_args, add_verify_parser, run_verify
from triton_embed.cli_commands import (
    nearest,
    run_embed,
    run_gateway,
    run_query,
    run_repository,
    summarize,
)
from triton_embed.client import DEFAULT_MODEL, DEFAULT_URL
from triton_embed.errors import EmbedClientError
from triton_embed.options import DEFAULT_TRUNCATION, EmbeddingType, Truncation
from triton_embed.retry import DEFAULT_MAX_WAIT_S, DEFAULT_RETRIES

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
        help="the server's gRPC port as host:port, without http:// (default %(default)s); "
        "'embed' into a folder takes several, comma-separated, and balances over them",
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
        "name of the model (default: document for 'embed'; for 'query', query when the "
        "model has a query prompt)",
    )
    p.add_argument(
        "--dimensions",
        type=positive_int,
        default=None,
        help="cut vectors to their first N values, L2-normalized again (one of the model's "
        "Matryoshka dimensions; query with the dimensions the corpus was embedded with)",
    )
    _add_retry_args(p)


REPOSITORY_USAGE = """\
actions and their flags:
  add     --repository DIR --model PATH --name NAME [--instances N] [--device cpu|gpu]
          [--max-length N] [--pooling mean|cls|lasttoken] [--normalize | --no-normalize]
          [--dimensions any|LIST] [--max-chunks N] [--served-model-name NAME] [--replace]
          write the ensemble NAME and its steps NAME_tokenizer and NAME_embedder (the
          ensemble embed keeps the steps tokenizer and embedder) from the model folder PATH
  list    --repository DIR [--json]
          the embedding models of the repository and what their folders say
  remove  --repository DIR --name NAME [--url HOST:PORT]
          delete the ensemble NAME and its two steps; with --url, unload it first
  load    --name NAME [--url HOST:PORT]    (or: load NAME)
  unload  --name NAME [--url HOST:PORT]    (or: unload NAME)
          load (and wait until ready) or unload a model of the running server
"""

# The flags of each `repository` action: (required, optional), as argparse dests. The
# flags share one parser (they are all listed by `triton-embed repository --help`); a flag
# that the action does not take is an error, not ignored.
_CONNECTION = {"url", "admin_key_file", "timeout_s"}
REPOSITORY_FLAGS = {
    "add": (
        {"repository", "model", "name"},
        {"instances", "device", "max_length", "pooling", "normalize", "dimensions"}
        | {"max_chunks", "served_model_name", "replace"},
    ),
    "list": ({"repository"}, {"json"}),
    "remove": ({"repository", "name"}, _CONNECTION),
    "load": ({"name"}, _CONNECTION),
    "unload": ({"name"}, _CONNECTION),
}


def repository_flag_error(args: argparse.Namespace) -> str | None:
    """Why the flags of a ``repository`` command do not fit its action, or ``None``.

    Also merges the positional ``NAME`` into ``args.name``.
    """
    action = args.action
    if args.model_name is not None:
        if args.name is not None and args.name != args.model_name:
            return f"repository {action}: NAME {args.model_name!r} and --name {args.name!r} differ"
        args.name = args.model_name
    required, optional = REPOSITORY_FLAGS[action]
    for dest in sorted(required):
        if getattr(args, dest) is None:
            return f"repository {action} needs --{dest.replace('_', '-')}"
    every = {dest for req, opt in REPOSITORY_FLAGS.values() for dest in req | opt}
    extra = sorted(d for d in every - required - optional if getattr(args, d) is not None)
    if extra:
        takes = [a for a, (req, opt) in REPOSITORY_FLAGS.items() if extra[0] in req | opt]
        flag = "--" + extra[0].replace("_", "-")
        return f"repository {action} takes no {flag} (a flag of: {', '.join(takes)})"
    return None


def _add_repository_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("action", choices=tuple(REPOSITORY_FLAGS), help="what to do")
    r.add_argument(
        "model_name", nargs="?", metavar="NAME", help="the model's name (the same as --name)"
    )
    r.add_argument("--repository", type=Path, help="the model repository folder")
    r.add_argument("--name", help="the model's (ensemble's) name in the model repository")
    r.add_argument(
        "--model",
        help="add: the model folder: a local path (written absolute) or pkg://<package>/<subdir>",
    )
    r.add_argument(
        "--instances",
        type=positive_int,
        help="add: embedder instances (per GPU with --device gpu; default 2 on cpu, 4 on gpu)",
    )
    r.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        help="add: cpu (config.pbtxt for CPUs and configs/gpu.pbtxt) or gpu (default cpu)",
    )
    r.add_argument(
        "--max-length",
        type=non_negative_int,
        help="add: token budget per text; 0 = the model's own limit (default 0)",
    )
    r.add_argument(
        "--pooling",
        type=str.lower,
        choices=("mean", "cls", "lasttoken"),
        help="add: pooling (default: what the folder's modules.json states)",
    )
    r.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        help="add: L2-normalize the vectors or not (default: what the folder states)",
    )
    r.add_argument(
        "--dimensions",
        help="add: the dimensions a request may ask for: any, or a list such as 64,128 "
        "(default: the Matryoshka dimensions of the folder's config.json)",
    )
    r.add_argument(
        "--max-chunks",
        type=positive_int,
        help="add: the most windows one text is cut into with truncation=CHUNK (default 16)",
    )
    r.add_argument(
        "--served-model-name",
        help="add: another name clients may use for the model, e.g. its Hugging Face id "
        "(default: the folder's name; sentence-transformers/all-MiniLM-L6-v2 for the shipped "
        "model)",
    )
    r.add_argument(
        "--replace",
        action="store_true",
        default=None,
        help="add: overwrite a model of this name written by repository add",
    )
    r.add_argument(
        "--json", action="store_true", default=None, help="list: print JSON, not a table"
    )
    r.add_argument(
        "--url",
        help="the server's gRPC port as host:port, without http:// (load, unload: default "
        f"{DEFAULT_URL}; remove: unload the model there first)",
    )
    r.add_argument(
        "--admin-key-file",
        type=Path,
        help="file holding the server's admin key (default: TRITON_EMBED_ADMIN_KEY, the file "
        "TRITON_EMBED_ADMIN_KEY_FILE, the server's default key file)",
    )
    r.add_argument(
        "--timeout-s",
        type=positive_float,
        help="deadline of a load (until ready) or unload, seconds (default 600)",
    )


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
        default=16.0,
        help="largest request body, MiB; larger ones are answered 413 (default %(default)s)",
    )
    p.add_argument(
        "--max-in-flight",
        type=positive_int,
        default=512,
        help="requests handled at once; more are answered 429 (default %(default)s)",
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


def _add_corpus_args(p: argparse.ArgumentParser) -> None:
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
        "--embedding-type",
        choices=[t.value for t in EmbeddingType],
        default=None,
        help="float32 (default), float16 or ubinary (sign bits packed 8 per byte)",
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
    _add_connection_args(e)
    _add_corpus_args(e)
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
    _add_repository_args(r)

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
            from triton_embed_server.doctor import run_doctor

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
