"""Side-by-side embedding throughput on one machine: our ensemble vs vLLM's server vs the engine.

Contenders (``perf/contenders/``), each started by this script, loaded with the same texts,
and stopped:

* ``engine``: the in-process vLLM pooling engine on token IDs (no server): the ceiling.
* ``triton_pa``: the ``embed`` ensemble over gRPC, driven by ``perf_analyzer`` 2.51.
* ``triton_client``: the same ensemble driven by our client library (decodes every vector).
* ``vllm_float`` / ``vllm_base64``: vLLM's OpenAI-compatible server
  (``python -m vllm.entrypoints.openai.api_server --runner pooling``) over HTTP, driven by an
  asyncio/aiohttp load generator that decodes every response.

Texts are real (Debian fortunes) cut to an exact token count with the model's tokenizer
(special tokens included), so tokens/s are real counts, never word estimates.

    .venv/bin/python -m perf.bench --mode quick          # minutes: every contender runs once
    .venv/bin/python -m perf.bench --mode full           # the sweep behind perf/README.md
    .venv/bin/python -m perf.bench --compare perf/reference_cpu2.json  # >10% drop = exit 1
    .venv/bin/python -m perf.bench --ablation instances   # embedder instance count 1/2/4
    .venv/bin/python -m perf.bench --ablation incremental # the design, one optimization at a time
    .venv/bin/python -m perf.bench --ablation batching    # embedder dynamic-batching delay

Lengths: exactly 50 or 256 tokens, and ``mixed`` (length 0 in the rows): real fortunes as
they are, truncated at 256 tokens; their tokens/s use the tokenizer's mean token count.

Writes ``<out>/results.json`` and ``<out>/results.csv`` (every run), ``<out>/summary.md`` and
``<out>/*.png``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from triton_embed_server.launcher import REPO_ROOT, TritonServer

from perf.config_ablations import ABLATIONS, config_ablation
from perf.contenders.engine import engine_ceiling
from perf.contenders.triton_client import client_library
from perf.contenders.triton_pa import perf_analyzer
from perf.contenders.vllm_server import VllmServer, vllm_load
from perf.corpora import MIXED, corpus, label, mixed_corpus, parse_lengths
from perf.report import compare, save, summarize

# (texts per request, requests in flight) pairs. 64 texts per request stop at 8 in flight:
# 512 texts in flight already saturate two cores.
MODES = {
    "quick": {"lengths": [50], "grid": [(1, 8)], "duration_s": 6},
    "full": {
        "lengths": [50, 256, 0],
        "grid": [
            (1, 1),
            (1, 8),
            (1, 32),
            (1, 64),
            (16, 1),
            (16, 8),
            (16, 32),
            (64, 1),
            (64, 4),
            (64, 8),
        ],
        "duration_s": 8,
    },
}


def run(mode: str, out_dir: Path, lengths: list[int] | None = None) -> list[dict]:
    """Every contender over the mode's sweep (only ``lengths`` if given); returns the rows."""
    cfg = dict(MODES[mode], lengths=lengths or MODES[mode]["lengths"])
    texts = {n: corpus(n) for n in cfg["lengths"]}
    rows: list[dict] = []

    def record(contender, length, batch, conc, result):
        # the mean over the texts actually sent where the contender measured it (mixed
        # lengths), else the corpus's (exact-length texts)
        per_text = result.pop("tokens_per_text", None) or texts[length][1]
        row = {
            "contender": contender,
            "length": length,
            "batch": batch,
            "concurrency": conc,
            "tokens_per_text": per_text,
            **result,
            "tokens_s": result["texts_s"] * per_text,
        }
        rows.append(row)
        print(
            f"{contender:14s} len={label(length):>5s} batch={batch:2d} conc={conc:2d} "
            f"{row['tokens_s']:9.0f} tokens/s  p99={row['p99_ms'] or 0:8.1f} ms  "
            f"errors={row['errors']}",
            flush=True,
        )

    replicas = min(2, len(os.sched_getaffinity(0)))
    for n in cfg["lengths"]:
        record("engine", n, 0, 1, engine_ceiling(n, cfg["duration_s"], 1))
        if replicas > 1:
            record("engine", n, 0, replicas, engine_ceiling(n, cfg["duration_s"], replicas))
    with TritonServer() as server:
        for n in cfg["lengths"]:
            for b, c in cfg["grid"]:
                record(
                    "triton_pa",
                    n,
                    b,
                    c,
                    perf_analyzer(
                        server,
                        texts[n][0],
                        b,
                        c,
                        cfg["duration_s"],
                        tokens_per_text=texts[n][1],
                        count_tokens=n == MIXED,
                    ),
                )
                record(
                    "triton_client",
                    n,
                    b,
                    c,
                    client_library(server, texts[n][0], b, c, cfg["duration_s"]),
                )
    counts = {MIXED: list(mixed_corpus()[1])} if MIXED in cfg["lengths"] else {}
    with VllmServer() as vllm:
        url = f"http://127.0.0.1:{vllm.port}/v1/embeddings"
        for n in cfg["lengths"]:
            for b, c in cfg["grid"]:
                for fmt in ("float", "base64"):
                    result = vllm_load(
                        url,
                        texts[n][0],
                        b,
                        c,
                        cfg["duration_s"],
                        fmt,
                        text_tokens=counts.get(n),
                    )
                    record(f"vllm_{fmt}", n, b, c, result)
    save(rows, out_dir, "results", mode=mode)
    return rows


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``--mode``, ``--out``, ``--compare``, ``--ablation``, ``--lengths``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "results")
    parser.add_argument(
        "--compare", type=Path, help="reference results.json; exit 1 on a >10%% drop"
    )
    parser.add_argument(
        "--ablation",
        choices=sorted(ABLATIONS),
        help="run only this ablation: instances (embedder count 1/2/4), incremental "
        "(the design one optimization at a time), batching (embedder delay)",
    )
    parser.add_argument(
        "--lengths",
        type=parse_lengths,
        help="only these lengths of the mode's sweep, e.g. 50,mixed",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the sweep or one ablation; exit status 1 on errors or a regression."""
    args = build_parser().parse_args(argv)
    if args.ablation:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        rows = config_ablation(args.ablation, ABLATIONS[args.ablation], args.out)
        return 1 if any(r["errors"] for r in rows) else 0
    # SIGTERM unwinds like Ctrl-C, so the servers this run started are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = run(args.mode, args.out, args.lengths)
    print()
    print(summarize(rows, args.out))
    failed = [r for r in rows if r["errors"]]
    if failed:
        details = [(r["contender"], r.get("detail", "")) for r in failed]
        print(f"{len(failed)} runs had errors: {details}")
        return 1
    if args.compare:
        drops = compare(rows, args.compare)
        for d in drops:
            print(f"REGRESSION {d}")
        return 1 if drops else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
