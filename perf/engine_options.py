"""vLLM's CPU engine against a plain PyTorch forward pass, one engine option at a time.

    .venv/bin/python -m perf.engine_options                       # about 12 min on 2 cores
    .venv/bin/python -m perf.engine_options --lengths 50 --rounds 3

In each round, for each length, every variant of :data:`VARIANTS` runs in turn: the
in-process vLLM engine on token IDs (:func:`perf.contenders.engine.engine_ceiling`, one
engine with every core, or our embedder's layout of one engine per core) with the options
of that variant, and ``SentenceTransformer.encode`` (plain PyTorch) at batch sizes 32 and
128. The summary gives each variant's best and median tokens/s over the rounds and its ratio
to sentence-transformers (median / median), so the machine's drift does not decide it.

Writes ``<out>/results.json`` and ``<out>/summary.md`` (default ``perf/engine_options/``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from triton_embed_server.run.launcher import REPO_ROOT

from perf.contenders.engine import engine_ceiling
from perf.contenders.sentence_transformers import sentence_transformers_encode
from perf.corpora import corpus, label, parse_lengths
from perf.report import save

#: What the embedder ships (server/triton_embed_server/steps/config.py): eager, 256 sequences and
#: 16384 tokens per engine step.
SHIPPED = {"enforce_eager": True, "max_num_seqs": 256, "max_num_batched_tokens": 16384}
#: variant -> (engine replicas, vllm.LLM options); replicas 0 = sentence-transformers.
VARIANTS: dict[str, tuple[int, dict]] = {
    "sentence_transformers": (0, {}),
    "vllm shipped, 1 engine x all cores": (1, SHIPPED),
    "vllm shipped, 1 engine per core (our layout)": (2, SHIPPED),
    "vllm compiled (enforce_eager=False)": (1, {**SHIPPED, "enforce_eager": False}),
    "vllm 4096 tokens / 128 seqs per step": (
        1,
        {**SHIPPED, "max_num_batched_tokens": 4096, "max_num_seqs": 128},
    ),
    "vllm 2048 tokens / 64 seqs per step": (
        1,
        {**SHIPPED, "max_num_batched_tokens": 2048, "max_num_seqs": 64},
    ),
}


def run(lengths: list[int], rounds: int, seconds: float) -> list[dict]:
    """Every variant in turn, ``rounds`` times per length; one row per measurement."""
    rows = []
    cpus = len(os.sched_getaffinity(0))
    for k in range(1, rounds + 1):
        for n in lengths:
            per_text = corpus(n)[1]
            for name, (replicas, options) in VARIANTS.items():
                if replicas == 0:
                    result = sentence_transformers_encode(n, seconds, (32, 128))
                else:
                    result = engine_ceiling(n, seconds, min(replicas, cpus), options)
                tokens_s = result["texts_s"] * (result.get("tokens_per_text") or per_text)
                rows.append(
                    {"variant": name, "length": n, "round": k, "tokens_s": tokens_s, **result}
                )
                print(f"round {k} len {label(n):>5s} {name:48s} {tokens_s:9,.0f} tokens/s",
                      flush=True)  # fmt: skip
    return rows


def summarize(rows: list[dict]) -> str:
    """Markdown: per length, each variant's best / median tokens/s and its ratio to ST."""
    lines = []
    for n in sorted({r["length"] for r in rows}):
        values = {
            name: [r["tokens_s"] for r in rows if r["variant"] == name and r["length"] == n]
            for name in VARIANTS
        }
        reference = statistics.median(values["sentence_transformers"])
        lines += [
            f"Length {label(n)} tokens/s over {len(values['sentence_transformers'])} rounds:",
            "",
            "| variant | best | median | median / sentence_transformers median |",
            "|---|---|---|---|",
        ]
        for name, vals in values.items():
            med = statistics.median(vals)
            lines.append(f"| {name} | {max(vals):,.0f} | {med:,.0f} | {med / reference:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.engine_options [--lengths 50,256] [--rounds 2] [--seconds 10]``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", type=parse_lengths, default=[50, 256])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "engine_options")
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    rows = run(args.lengths, args.rounds, args.seconds)
    text = summarize(rows)
    save(rows, args.out, "results", started=started, variants=list(VARIANTS))
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
