"""Streaming bulk output against the in-memory path, side by side on one server.

``python -m perf.bulk`` starts one real tritonserver (the shipped ``model_repository``), builds
corpora of real short texts (Debian fortunes' first 80 characters, repeated in order with
distinct ids) of each ``--sizes``, and runs ``triton-embed embed`` as a user runs it, in turn:

* ``npy``: ``-o corpus.npy``, the in-memory path (every text and vector held, one file at the
  end);
* ``stream``: ``-o folder/``, the streaming path (Parquet shards of 10,000 rows and a manifest).

Both with the same flags (``--concurrency 8 --batch-size 64``), alternated A, B, A, B for
``--rounds`` rounds so that a drift of the machine does not decide the ratio. Per run: texts/s
of the embedding phase (the CLI's own summary), texts/s over the whole command (process start
to exit: reading, fingerprinting and writing included), and peak RSS of the CLI process
(sampled every 20 ms). The figures go to ``perf/bulk/results.json`` and ``summary.md``.

    .venv/bin/python -m perf.bulk                       # 6,000 and 60,000 texts, 2 rounds
    .venv/bin/python -m perf.bulk --sizes 6000 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from triton_embed.corpus import read_fortunes, write_jsonl
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

OUT = REPO_ROOT / "perf" / "bulk"
FLAGS = ["--concurrency", "8", "--batch-size", "64", "--no-progress"]
CONTENDERS = ("npy", "stream")


def corpus(path: Path, n: int) -> Path:
    """``n`` JSONL records ``{"id": i, "text": ...}`` of real short texts."""
    lines = [" ".join(t.split())[:80] for _, t in read_fortunes()]
    lines = [line for line in lines if len(line) > 20]
    write_jsonl(path, [{"id": i, "text": lines[i % len(lines)]} for i in range(n)])
    return path


def measure(args: list[str], env: dict[str, str]) -> tuple[int, str, int, float]:
    """Run a command; ``(exit code, output, peak RSS in bytes, wall seconds)``.

    RSS is sampled every 20 ms (``psutil``); the output is stdout and stderr together.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = 0
    try:
        ps = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                peak = max(peak, ps.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(0.02)
        output = proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return proc.returncode, output, peak, time.perf_counter() - t0


def run(
    contender: str, source: Path, work: Path, server: TritonServer, flags: list[str] = FLAGS
) -> dict:
    """One ``triton-embed embed`` run with ``flags``; its figures."""
    output = work / ("out.npy" if contender == "npy" else "out")
    summary = work / "summary.json"
    for old in (output, summary):
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink(missing_ok=True)
    args = [sys.executable, "-m", "triton_embed.cli", "embed", str(source), "-o", str(output),
            "--url", server.grpc_url, "--summary-json", str(summary), *flags]  # fmt: skip
    env = {**os.environ, "TRITON_EMBED_ADMIN_KEY": server.admin_key}
    code, text, peak, wall = measure(args, env)
    if code != 0:
        raise RuntimeError(f"{contender} failed: {text}")
    figures = json.loads(summary.read_text())
    return {
        "contender": contender,
        "texts": figures["texts"],
        "tokens": figures["tokens"],
        "texts_per_s": figures["texts_per_s"],
        "tokens_per_s": figures["tokens_per_s"],
        "wall_s": round(wall, 2),
        "wall_texts_per_s": round(figures["texts"] / wall, 1),
        "peak_rss_mb": round(peak / 2**20, 1),
    }


def summarize(results: list[dict], sizes: list[int]) -> str:
    """Best and median of each contender per size, and the stream/npy ratios."""
    rows = ["| texts | contender | texts/s best | texts/s median | whole command texts/s (median) "
            "| peak RSS MB (max) |", "|---|---|---|---|---|---|"]  # fmt: skip
    ratios = []
    for n in sizes:
        by = {c: [r for r in results if r["texts"] == n and r["contender"] == c]
              for c in CONTENDERS}  # fmt: skip
        for c in CONTENDERS:
            runs = by[c]
            rows.append(
                f"| {n:,} | {c} | {max(r['texts_per_s'] for r in runs):,.1f} | "
                f"{statistics.median(r['texts_per_s'] for r in runs):,.1f} | "
                f"{statistics.median(r['wall_texts_per_s'] for r in runs):,.1f} | "
                f"{max(r['peak_rss_mb'] for r in runs):,.1f} |"
            )
        best = max(r["texts_per_s"] for r in by["stream"]) / max(
            r["texts_per_s"] for r in by["npy"]
        )
        median = statistics.median(r["texts_per_s"] for r in by["stream"]) / statistics.median(
            r["texts_per_s"] for r in by["npy"]
        )
        wall = statistics.median(r["wall_texts_per_s"] for r in by["stream"]) / statistics.median(
            r["wall_texts_per_s"] for r in by["npy"]
        )
        ratios.append(
            f"- {n:,} texts: stream/npy {best:.3f} (best), {median:.3f} (median), whole "
            f"command {wall:.3f} (median); target >= 0.95: {'met' if median >= 0.95 else 'NOT met'}"
        )
    return "\n".join(rows) + "\n\n" + "\n".join(ratios) + "\n"


def main() -> int:
    """Serve, run the contenders in turn, write the results."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="6000,60000", help="corpus sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="A,B alternations per size")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp, TritonServer() as server:
        work = Path(tmp)
        run("stream", corpus(work / "warm.jsonl", 500), work, server)  # warm the engines
        for n in sizes:
            source = corpus(work / f"c{n}.jsonl", n)
            for round_ in range(args.rounds):
                for contender in CONTENDERS if round_ % 2 == 0 else CONTENDERS[::-1]:
                    result = run(contender, source, work, server)
                    result["round"] = round_
                    results.append(result)
                    print(json.dumps(result), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    text = summarize(results, sizes)
    machine = f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    (args.out / "summary.md").write_text(
        f"# Bulk: streaming shards vs the in-memory .npy path\n\n`python -m perf.bulk "
        f"--sizes {args.sizes} --rounds {args.rounds}` on {machine}; flags {' '.join(FLAGS)}.\n\n"
        + text
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
