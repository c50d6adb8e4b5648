"""``triton-embed repository add|list|remove|load|unload``: its flags, their check, its body.

Registered as a ``triton-embed`` subcommand by the entry point ``triton_embed.commands``
(:func:`register`). One parser takes every action's flags (all listed by
``triton-embed repository --help``); :func:`repository_flag_error` then refuses a flag the
action does not take.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from triton_embed.admin import read_key_file
from triton_embed.cli_args import non_negative_int, positive_float, positive_int
from triton_embed.client import DEFAULT_URL
from triton_embed.model_control import ModelControl

from triton_embed_server.models.accuracy import gate_for_add
from triton_embed_server.models.repository.add import KINDS, add_model, memory_warnings
from triton_embed_server.models.repository.listing import format_table, list_models
from triton_embed_server.models.repository.remove import removable, remove_model
from triton_embed_server.models.repository.render import (
    DEFAULT_INSTANCES,
    DEFAULT_MAX_CHUNKS,
    DTYPES,
    ModelOptions,
)

#: Deadline of a load (until the model is ready) or an unload, seconds.
DEFAULT_REPOSITORY_TIMEOUT_S = 600.0

REPOSITORY_USAGE = """\
actions and their flags:
  add     --repository DIR --model PATH --name NAME [--instances N] [--device cpu|gpu]
          [--max-length N] [--pooling mean|cls|lasttoken] [--normalize | --no-normalize]
          [--dimensions any|LIST] [--max-chunks N] [--served-model-name NAME] [--replace]
          [--dtype float32|bfloat16|float16] [--accept-accuracy]
          [--kind embedding|reranker|sparse|multivector|hybrid]
          write the ensemble NAME and its steps NAME_tokenizer and NAME_embedder (the
          ensemble embed keeps the steps tokenizer and embedder) from the model folder PATH;
          a reranker (a cross-encoder folder, or a causal LM with --kind reranker) gets the
          steps NAME_tokenizer and NAME_scorer (docs/rerank.md); a sparse model (a SPLADE
          SparseEncoder folder or *ForMaskedLM checkpoint) NAME_tokenizer and
          NAME_sparse_encoder (docs/sparse.md); a multi-vector model (a ColBERT folder, or
          any embedding folder with --kind multivector) NAME_tokenizer and
          NAME_token_encoder (docs/sparse.md); a hybrid model (BGE-M3: colbert_linear.pt
          and sparse_linear.pt next to the encoder) NAME_tokenizer and NAME_hybrid_encoder
  list    --repository DIR [--json]
          the embedding, reranker, sparse and multi-vector models of the repository and what their
          folders say
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
        | {"max_chunks", "served_model_name", "replace", "dtype", "accept_accuracy", "kind"},
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


def add_repository_args(r: argparse.ArgumentParser) -> None:
    """Every flag of every ``repository`` action (one parser; see :data:`REPOSITORY_FLAGS`)."""
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
        help="add: embedder instances (per GPU with --device gpu; default "
        f"{DEFAULT_INSTANCES['cpu']} on cpu, {DEFAULT_INSTANCES['gpu']} on gpu)",
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
        help="add: the most windows one text is cut into with truncation=CHUNK (default "
        f"{DEFAULT_MAX_CHUNKS})",
    )
    r.add_argument(
        "--served-model-name",
        help="add: another name clients may use for the model, e.g. its Hugging Face id "
        "(default: the folder's name; sentence-transformers/all-MiniLM-L6-v2 for the shipped "
        "model)",
    )
    r.add_argument(
        "--dtype",
        choices=sorted({d for ds in DTYPES.values() for d in ds}),
        help="add: the engine's precision (cpu: float32 or bfloat16; gpu: float16, bfloat16 "
        "or float32; default: float32 on cpu, float16 on gpu; an int8 copy: the dtype "
        "triton-embed quantize gated it at). A reduced precision on cpu is checked against "
        "float32 on real text first (the accuracy gate; docs/precision.md)",
    )
    r.add_argument(
        "--kind",
        choices=KINDS,
        help="add: what the model is (default: a *ForSequenceClassification folder is a "
        "reranker, a SPLADE folder (SpladePooling, or *ForMaskedLM) a sparse model, a ColBERT "
        "folder (HF_ColBERT, or PyLate's Dense) a multi-vector model, a BGE-M3 folder "
        "(colbert_linear.pt, sparse_linear.pt) a hybrid model, anything else an "
        "embedding model); reranker on a causal LM of the Qwen3-Reranker kind serves it as a "
        "decoder reranker; multivector on an embedding model serves its token embeddings",
    )
    r.add_argument(
        "--accept-accuracy",
        action="store_true",
        default=None,
        help="add: write a --dtype that fails the accuracy gate anyway (the figures are printed)",
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
        help="deadline of a load (until ready) or unload, seconds (default "
        f"{DEFAULT_REPOSITORY_TIMEOUT_S:g})",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``repository`` to the ``triton-embed`` subcommands (entry point of the CLI).

    A flag the action does not take exits 2 with argparse's usage and the reason.
    """
    r = subparsers.add_parser(
        "repository",
        help="add, list or remove an embedding model's Triton models; load or unload them",
        description="Write, list or remove the Triton models of an embedding model in a model "
        "repository folder; load or unload models of a running server (sends the admin key).",
        epilog=REPOSITORY_USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_repository_args(r)

    def run(args: argparse.Namespace) -> None:
        problem = repository_flag_error(args)
        if problem:
            r.error(problem)
        run_repository(args)

    r.set_defaults(run=run)


def run_repository(args: argparse.Namespace) -> None:
    """``triton-embed repository add|list|remove|load|unload`` (flags checked by the parser).

    ``add``, ``list`` and ``remove`` read and write model folders
    (:mod:`~triton_embed_server.models.repository`); ``load`` and ``unload`` call the server's
    repository API through :class:`triton_embed.model_control.ModelControl`.

    Raises:
        ValueError: a model, name or folder that cannot be added, listed or removed (one line).
        AccessDeniedError: the server refused a load or unload (no admin key, or a wrong one).
        EmbedClientError: any other failure of a load or unload (Triton's message).
    """
    if args.action in ("load", "unload"):
        with _model_control(args) as control:
            getattr(control, f"{args.action}_model")(args.name)
        print(f"{args.action}ed {args.name!r} at {control.url}")
        return
    if args.action == "list":
        models = list_models(args.repository)
        if args.json:
            print(json.dumps([m.to_json() for m in models], indent=2))
        elif models:
            print(format_table(models))
        else:
            print(f"no embedding models or rerankers in {args.repository}")
    elif args.action == "remove":
        removable(args.repository, args.name)  # refuse before unloading anything
        if args.url is not None:
            with _model_control(args) as control:
                control.unload_model(args.name)
            print(f"unloaded {args.name!r} at {control.url}")
        removed = remove_model(args.repository, args.name)
        print(f"removed {args.name!r} from {args.repository}: {_names(removed)}")
    else:
        given = {
            "instances": args.instances,
            "device": args.device,
            "max_length": args.max_length,
            "pooling": args.pooling,
            "normalize": args.normalize,
            "dimensions": args.dimensions,
            "max_chunks": args.max_chunks,
            "served_model_name": args.served_model_name,
            "dtype": args.dtype,
            "kind": args.kind,
        }
        options = ModelOptions(
            name=args.name,
            model=args.model,
            **{key: value for key, value in given.items() if value is not None},
        )
        verb = "replaced" if (args.repository / args.name).exists() else "added"
        gate = gate_for_add(bool(args.accept_accuracy), print)
        written = add_model(args.repository, options, replace=bool(args.replace), accuracy=gate)
        print(
            f"{verb} {args.name!r} in {args.repository}: {_names(written)}; a running server "
            f"loads it with: triton-embed repository load {args.name} --url HOST:PORT"
        )
        for warning in memory_warnings(args.repository):
            print(f"warning: {warning}", file=sys.stderr)


def _names(folders: list[Path]) -> str:
    return ", ".join(folder.name for folder in folders)


def _model_control(args: argparse.Namespace) -> ModelControl:
    """The repository API client of ``--url``, ``--admin-key-file``, ``--timeout-s``."""
    return ModelControl(
        args.url or DEFAULT_URL,
        # None: ModelControl reads the key from the environment
        admin_key=None if args.admin_key_file is None else read_key_file(args.admin_key_file),
        timeout_s=args.timeout_s or DEFAULT_REPOSITORY_TIMEOUT_S,
    )
