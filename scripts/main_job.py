"""The main job: serve the model with a real tritonserver and embed a real text corpus.

Builds a JSONL corpus from Debian's ``fortunes`` files (human-written quotations, jokes and
aphorisms of varied length), starts ``tritonserver`` on free loopback ports, embeds the
corpus with ``triton-embed embed`` into an output folder (the streaming path: Parquet shards
and a manifest, over gRPC; docs/bulk.md), checks it with ``triton-embed verify``, then starts
the HTTP
gateway in front of the server and answers a few nearest-neighbour queries through it with
the official ``openai`` SDK: the query vectors must be bit-identical to the gRPC path's, and
the corpus is ranked by cosine similarity as ``triton-embed query`` ranks it. The gateway and
the server it started are stopped at the end.

    .venv/bin/python scripts/main_job.py [--max-texts 6000] [--out-dir out] [--dtype float32]

The shipped repository runs its engine at bfloat16 (float32 on CPUs without bfloat16
instructions; docs/precision.md); ``--dtype float32`` serves a copy of it at float32.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from triton_embed import EmbeddingClient, cli
from triton_embed.admin import ADMIN_KEY_ENV
from triton_embed.bulk.shards import read_vectors
from triton_embed.cli_args import non_negative_int, positive_int
from triton_embed.corpus import read_fortunes, read_texts, write_jsonl
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import REPO_ROOT, Gateway, TritonServer

QUERIES = [
    "a computer program that does not work",
    "advice about love and marriage",
    "what the law says about crime",
]
#: Corpus texts shown per query.
TOP_K = 3


def query_through_gateway(server: TritonServer, embeddings: Path, corpus: Path, log: Path) -> int:
    """Embed :data:`QUERIES` through the gateway with the ``openai`` SDK; print the nearest texts.

    The same queries are embedded over gRPC first (:class:`triton_embed.EmbeddingClient`);
    the SDK's vectors (base64, its default encoding) must equal them bit for bit. The
    shipped model has no ``query`` prompt, so both paths embed the queries as they are.

    Returns:
        0, or 1 when the gateway's vectors differ from the gRPC path's.
    """
    import openai

    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key) as client:
        grpc_vectors = client.embed(QUERIES)
    t0 = time.perf_counter()
    with Gateway([server.grpc_url], server.admin_key, log_path=log) as gw:
        url = gw.base_url
        ready_s = time.perf_counter() - t0
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        t1 = time.perf_counter()
        response = sdk.embeddings.create(model="embed", input=QUERIES)
        call_ms = (time.perf_counter() - t1) * 1000
    vectors = np.array([d.embedding for d in response.data], dtype=np.float32)
    print(
        f"queries answered by the gateway ({url}/v1/embeddings, ready in {ready_s:.1f} s; "
        f"log {log}) through the OpenAI SDK {openai.__version__} in {call_ms:.0f} ms, "
        f"{response.usage.prompt_tokens} tokens"
    )
    if not np.array_equal(vectors, grpc_vectors):
        worst = float(np.abs(vectors - grpc_vectors).max())
        print(
            f"error: the gateway's query vectors differ from the gRPC path's (max |diff| {worst})"
        )
        return 1
    rows, dim = vectors.shape
    print(f"query vectors: bit-identical to the gRPC path's ({rows} x {dim} float32)")
    texts = read_texts(corpus)
    corpus_vectors = read_vectors(embeddings)
    for query, hits in zip(QUERIES, cli.nearest(corpus_vectors, vectors, TOP_K), strict=True):
        print(f"query: {query}")
        for rank, (index, cosine) in enumerate(hits, start=1):
            one_line = " ".join(texts[index].split())
            short = one_line if len(one_line) <= 110 else one_line[:107] + "..."
            print(f"  {rank}. [{cosine:.3f}] #{index}: {short}")
    return 0


def main() -> int:
    """Build the corpus, serve, embed, query, stop; see the module docstring."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--max-texts",
        type=non_negative_int,
        default=6000,
        help="texts taken from the corpus (seeded sample; 0 = all, about 15,000)",
    )
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "out")
    parser.add_argument("--concurrency", type=positive_int, default=8)
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="the engine's precision (default: the shipped repository's, bfloat16)",
    )
    args = parser.parse_args()

    args.out_dir.mkdir(parents=True, exist_ok=True)
    fortunes = read_fortunes()
    if args.max_texts and len(fortunes) > args.max_texts:
        fortunes = random.Random(0).sample(fortunes, args.max_texts)
    corpus = args.out_dir / "fortunes.jsonl"
    write_jsonl(corpus, [{"source": db, "text": text} for db, text in fortunes])
    print(f"corpus: {len(fortunes)} fortunes from Debian's fortunes package -> {corpus}")

    repository = REPO_ROOT / "model_repository"
    if args.dtype:
        shutil.rmtree(args.out_dir / "model_repository", ignore_errors=True)  # an earlier run's
        repository = copy_repository(args.out_dir / "model_repository")
        edit_config(repository / "embedder" / "config.pbtxt", parameters={"dtype": args.dtype})
    print(f"engine dtype: {args.dtype or 'as shipped: bfloat16 (float32 on CPUs without it)'}")
    server = TritonServer(model_repository=repository, log_path=args.out_dir / "tritonserver.log")
    print(f"starting tritonserver (gRPC {server.grpc_url}); log: {server.log_path}")
    t0 = time.perf_counter()
    try:
        server.start()
    except RuntimeError as exc:  # exited, stalled (the supervisor's line) or not ready in time
        print(f"main job: {exc}", file=sys.stderr)
        return 1
    with server:
        print(f"server ready in {time.perf_counter() - t0:.1f} s")
        # The client reads max_batch_size (a restricted API) with the server's admin key.
        os.environ[ADMIN_KEY_ENV] = server.admin_key
        embeddings = args.out_dir / "fortunes_embeddings"
        parser = cli.build_parser()
        summary = cli.run_embed(
            parser.parse_args(
                [
                    "embed",
                    str(corpus),
                    "-o",
                    str(embeddings),
                    "--overwrite",  # a new run embeds again (and prints its figures)
                    "--shard-rows",
                    "1000",
                    "--concurrency",
                    str(args.concurrency),
                    "--batch-size",
                    str(args.batch_size),
                    "--summary-json",
                    str(args.out_dir / "summary.json"),
                    "--url",
                    server.grpc_url,
                ]
            )
        )
        cli.run_verify(parser.parse_args(["verify", str(embeddings), str(corpus)]))
        print()
        code = query_through_gateway(server, embeddings, corpus, args.out_dir / "gateway.log")
    print(f"\ngateway and server stopped. figures: {json.dumps(summary)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
