"""The bulk job as a Ray Data program: ``python -m triton_embed.bulk.ray_job INPUT OUTPUT``.

Reads Parquet (a file, a folder, or any ``pyarrow`` filesystem URI such as ``s3://...``)
with a text and an id column, embeds it with an actor pool of
:class:`~triton_embed.bulk.ray_data.TritonEmbedder` against the Triton servers named by
``--url`` (or the server on each node, ``--node-local-port``), and writes Parquet with the
CLI's columns to OUTPUT; then ``triton-embed verify OUTPUT INPUT`` checks it. Run on a
cluster with ``ray job submit -- python -m triton_embed.bulk.ray_job ...`` or as the
entrypoint of a KubeRay ``RayJob`` (deploy/ray/rayjob.yaml). Guide: docs/ray.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from triton_embed.cli_args import (
    add_model_arg,
    add_output_kind_arg,
    add_request_option_args,
    add_sparse_option_args,
    add_url_arg,
)
from triton_embed.options import OptionError, RequestOptions
from triton_embed.sparse_options import SparseOptions

#: The keyword arguments of :func:`~triton_embed.bulk.ray_data.embed_dataset` that are flags
#: of the job, under the same names.
DATASET_FLAGS = ("model", "concurrency", "batch_size", "text_column", "id_column",
                 "include_text", "node_local_port", "output_kind")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The command line of the Ray job.

    ``--url``, ``--model`` and the request options' flags are those of ``triton-embed embed``
    (:mod:`triton_embed.cli_args`): the same defaults, bounds and choices.
    """
    p = argparse.ArgumentParser(prog="python -m triton_embed.bulk.ray_job", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("input", help="Parquet file, folder or URI with a text and an id column")
    p.add_argument("output", help="folder or URI for the output Parquet files")
    add_url_arg(p, several="several, comma-separated, are balanced over")
    p.add_argument("--node-local-port", type=int, default=None,
                   help="each actor uses the server on its own node at this gRPC port")  # fmt: skip
    add_model_arg(p)
    p.add_argument("--concurrency", type=int, default=2, help="actors (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=256,
                   help="rows per map_batches batch (default %(default)s)")  # fmt: skip
    p.add_argument("--blocks", type=int, default=None,
                   help="blocks the input is read into (default: 4 x --concurrency)")  # fmt: skip
    p.add_argument("--text-field", dest="text_column", metavar="COLUMN", default="text",
                   help="text column (default %(default)s)")  # fmt: skip
    p.add_argument("--id-field", dest="id_column", metavar="COLUMN", default="id",
                   help="id column (default %(default)s)")  # fmt: skip
    p.add_argument("--include-text", action="store_true", help="keep the texts in the output")
    add_request_option_args(p, input_type_default="document", embedding_type=True)
    add_sparse_option_args(p)
    add_output_kind_arg(p)
    p.add_argument("--address", default=None,
                   help="Ray cluster address (default: RAY_ADDRESS, or a local Ray)")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the job; prints a JSON summary line. Returns the exit code.

    A request option outside its allowed values (a blank ``--input-type``) is a usage error:
    the parser's message, exit code 2.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        # A corpus is documents.
        options = RequestOptions.from_args(args, input_type_default="document")
    except OptionError as exc:
        parser.error(str(exc))

    import ray

    from triton_embed.admin import read_admin_key
    from triton_embed.bulk.ray_data import embed_dataset

    # A local path is read and written by tasks on other nodes, in other working folders.
    args.input, args.output = (p if "://" in p else os.path.abspath(p)
                               for p in (args.input, args.output))  # fmt: skip
    ray.init(address=args.address, log_to_driver=False)
    t0 = time.perf_counter()
    # Blocks to read: several per actor, so a single input file still feeds every actor.
    ds = ray.data.read_parquet(args.input, override_num_blocks=args.blocks or 4 * args.concurrency)
    # The driver's key goes to the actors with their constructor arguments (workers started
    # without TRITON_EMBED_ADMIN_KEY in their environment, as a local cluster's, need it).
    flags = {name: getattr(args, name) for name in DATASET_FLAGS}
    sparse = SparseOptions(top_k=args.top_k, threshold=args.threshold).to_parameters()
    out = embed_dataset(
        ds, args.url, **flags, admin_key=read_admin_key(), **options.to_parameters(), **sparse
    )
    out.write_parquet(args.output)
    seconds = time.perf_counter() - t0
    rows = ray.data.read_parquet(args.output).count()
    print(json.dumps({"rows": rows, "seconds": round(seconds, 2), "output": args.output}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
