"""The main job: serve the model with a real tritonserver and embed a real text corpus.

Builds a JSONL corpus from Debian's ``fortunes`` files (human-written quotations, jokes and
aphorisms of varied length), starts ``tritonserver`` on free loopback ports, embeds the
corpus with ``triton-embed embed`` (the client library over gRPC), answers a few
nearest-neighbour queries with ``triton-embed query``, and stops the server it started.

    .venv/bin/python scripts/main_job.py [--max-texts 6000] [--out-dir out]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from triton_embed import cli
from triton_embed.admin import ADMIN_KEY_ENV
from triton_embed.corpus import read_fortunes, write_jsonl
from triton_embed_server.launcher import REPO_ROOT, TritonServer

QUERIES = [
    "a computer program that does not work",
    "advice about love and marriage",
    "what the law says about crime",
]


def main() -> int:
    """Build the corpus, serve, embed, query, stop; see the module docstring."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--max-texts",
        type=cli.non_negative_int,
        default=6000,
        help="texts taken from the corpus (seeded sample; 0 = all, about 15,000)",
    )
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "out")
    parser.add_argument("--concurrency", type=cli.positive_int, default=8)
    parser.add_argument("--batch-size", type=cli.positive_int, default=16)
    args = parser.parse_args()

    args.out_dir.mkdir(parents=True, exist_ok=True)
    fortunes = read_fortunes()
    if args.max_texts and len(fortunes) > args.max_texts:
        fortunes = random.Random(0).sample(fortunes, args.max_texts)
    corpus = args.out_dir / "fortunes.jsonl"
    write_jsonl(corpus, [{"source": db, "text": text} for db, text in fortunes])
    print(f"corpus: {len(fortunes)} fortunes from Debian's fortunes package -> {corpus}")

    server = TritonServer(log_path=args.out_dir / "tritonserver.log")
    print(f"starting tritonserver (gRPC {server.grpc_url}); log: {server.log_path}")
    t0 = time.perf_counter()
    with server:
        print(f"server ready in {time.perf_counter() - t0:.1f} s")
        # The client reads max_batch_size (a restricted API) with the server's admin key.
        os.environ[ADMIN_KEY_ENV] = server.admin_key
        embeddings = args.out_dir / "fortunes.npy"
        common = ["--url", server.grpc_url]
        summary = cli.run_embed(
            cli.build_parser().parse_args(
                [
                    "embed",
                    str(corpus),
                    "-o",
                    str(embeddings),
                    "--parquet",
                    str(args.out_dir / "fortunes.parquet"),
                    "--concurrency",
                    str(args.concurrency),
                    "--batch-size",
                    str(args.batch_size),
                    "--summary-json",
                    str(args.out_dir / "summary.json"),
                    *common,
                ]
            )
        )
        print()
        cli.run_query(
            cli.build_parser().parse_args(
                [
                    "query",
                    *QUERIES,
                    "--embeddings",
                    str(embeddings),
                    "--corpus",
                    str(corpus),
                    "-k",
                    "3",
                    *common,
                ]
            )
        )
    print(f"\nserver stopped. figures: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
