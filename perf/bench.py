"""Side-by-side embedding throughput on one machine: our ensemble vs vLLM's server vs the engine.

Contenders (``perf/contenders/``), each started by this script, loaded with the same texts,
and stopped:

* ``engine``: the in-process vLLM pooling engine on token IDs (no server): the ceiling.
* ``triton_pa``: the ``embed`` ensemble over gRPC, driven by ``perf_analyzer`` 2.51.
* ``triton_client``: the same ensemble driven by our client library (decodes every vector).
* ``gateway_float`` / ``gateway_base64``: our HTTP gateway
  (``python -m triton_embed_server.gateway``) in front of that same server, OpenAI
  ``/v1/embeddings`` over HTTP, driven by the load generator that drives vLLM's server.
* ``vllm_float`` / ``vllm_base64``: vLLM's OpenAI-compatible server
  (``python -m vllm.entrypoints.openai.api_server --runner pooling``) over HTTP, driven by an
  asyncio/aiohttp load generator that decodes every response.

Texts are real (Debian fortunes) cut to an exact token count with the model's tokenizer
(special tokens included), so tokens/s are real counts, never word estimates.

    .venv/bin/python -m perf.bench --mode quick          # minutes: every contender runs once
    .venv/bin/python -m perf.bench --mode smoke          # quick's points for 2 s (the test's)
    .venv/bin/python -m perf.bench --mode full           # the sweep behind perf/README.md
    .venv/bin/python -m perf.bench --mode gateway        # gateway vs vLLM vs gRPC in turn, 3x
    .venv/bin/python -m perf.bench --mode alternatives   # vs sentence-transformers, Infinity, vLLM
    .venv/bin/python -m perf.bench --compare perf/reference_cpu2.json  # >10% drop = exit 1
    .venv/bin/python -m perf.bench --ablation instances   # embedder instance count 1/2/4
    .venv/bin/python -m perf.bench --ablation incremental # the design, one optimization at a time
    .venv/bin/python -m perf.bench --ablation batching    # embedder dynamic-batching delay

Lengths: exactly 50 or 256 tokens, and ``mixed`` (length 0 in the rows): real fortunes as
they are, truncated at 256 tokens; their tokens/s use the tokenizer's mean token count.

``--mode gateway`` measures the gateway's headline points (50 tokens, 1 and 16 texts per
request) with every server up at once and the contenders in turn at each point
(gateway_base64, vLLM float, vLLM base64, triton_client, gateway_float), the whole sweep
repeated in rounds, so that the machine's drift over minutes hits them alike; its summary
gives each contender's best and median over the rounds.

Writes ``<out>/results.json`` and ``<out>/results.csv`` (every run), ``<out>/summary.md`` and
``<out>/*.png``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

from perf.alternatives import run_alternatives, summarize_alternatives
from perf.config_ablations import ABLATIONS, config_ablation
from perf.contenders.engine import engine_ceiling
from perf.contenders.gateway import GatewayServer, gateway_load
from perf.contenders.triton_client import client_library
from perf.contenders.triton_pa import perf_analyzer
from perf.contenders.vllm_server import VllmServer, vllm_load
from perf.corpora import MIXED, corpus, mixed_corpus, parse_lengths
from perf.report import compare, recorder, save, summarize, summarize_rounds

FORMATS = ("float", "base64")  # the OpenAI encoding_format values, both measured
# --mode gateway: the order of the contenders at each point of each round
ALTERNATION = ("gateway_base64", "vllm_float", "vllm_base64", "triton_client", "gateway_float")

# (texts per request, requests in flight) pairs. 64 texts per request stop at 8 in flight:
# 512 texts in flight already saturate two cores.
MODES = {
    "quick": {"lengths": [50], "grid": [(1, 8)], "duration_s": 6},
    # quick's contenders and point for 2 s each: that every one starts, runs and stops
    # cleanly (tests/integration/test_bench_smoke.py); too short for figures
    "smoke": {"lengths": [50], "grid": [(1, 8)], "duration_s": 2},
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
    # The gateway's headline points (issue 13), every contender in turn at each, 3 rounds.
    # Concurrency 1 gives the latency; 32-64 (1 text) and 8-16 (16 texts) hold the best
    # throughput of every contender in the full runs.
    "gateway": {
        "lengths": [50],
        "grid": [(1, 1), (1, 32), (1, 64), (16, 8), (16, 16)],
        "duration_s": 10,
        "rounds": 3,
    },
    # Ours against sentence-transformers, Infinity and vLLM's server, alternated in rounds
    # (issue 16): perf/alternatives.py holds its plan.
    "alternatives": {"lengths": [50, 256, 0], "rounds": 2},
}


def shipped_dtype() -> str:
    """The dtype the shipped embedder's engine runs on this host.

    Its ``dtype`` parameter (``model_repository/embedder``), float32 where these CPUs lack
    bfloat16 instructions, as the embedder decides (``host.cpu_features.engine_dtype``).
    """
    from triton_embed_server.host.cpu_features import cpu_flags, engine_dtype
    from triton_embed_server.models.instance_group import read_config_pbtxt

    config = read_config_pbtxt(REPO_ROOT / "model_repository" / "embedder" / "config.pbtxt")
    return engine_dtype(config["parameters"]["dtype"]["string_value"], cpu_flags())[0]


def run(mode: str, out_dir: Path, lengths: list[int] | None = None) -> list[dict]:
    """Every contender over the mode's sweep (only ``lengths`` if given); returns the rows."""
    cfg = dict(MODES[mode], lengths=lengths or MODES[mode]["lengths"])
    texts = {n: corpus(n) for n in cfg["lengths"]}
    rows: list[dict] = []
    record = recorder(texts, rows)
    counts = {MIXED: list(mixed_corpus()[1])} if MIXED in cfg["lengths"] else {}

    replicas = min(2, len(os.sched_getaffinity(0)))
    options = {"dtype": shipped_dtype()}  # the engine at the precision the ensemble serves
    for n in cfg["lengths"]:
        record("engine", n, 0, 1, engine_ceiling(n, cfg["duration_s"], 1, options))
        if replicas > 1:
            ceiling = engine_ceiling(n, cfg["duration_s"], replicas, options)
            record("engine", n, 0, replicas, ceiling)
    with TritonServer() as server, GatewayServer(server) as gateway:
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
                for fmt in FORMATS:
                    result = gateway_load(
                        gateway.url,
                        texts[n][0],
                        b,
                        c,
                        cfg["duration_s"],
                        fmt,
                        text_tokens=counts.get(n),
                    )
                    record(f"gateway_{fmt}", n, b, c, result)
    with VllmServer() as vllm:
        url = f"http://127.0.0.1:{vllm.port}/v1/embeddings"
        for n in cfg["lengths"]:
            for b, c in cfg["grid"]:
                for fmt in FORMATS:
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


def run_rounds(mode: str, out_dir: Path, lengths: list[int] | None = None) -> list[dict]:
    """The contenders of :data:`ALTERNATION` in turn at each point, the sweep in rounds.

    The Triton server, the gateway in front of it and vLLM's server all run for the whole
    measurement; each row carries its ``round`` (1, 2, ...). Before the first round the
    machine's CPU use with every server up and idle is measured (:func:`idle_cpu`;
    ``idle_cpu_percent`` and ``idle_server_cores`` in the JSON).

    Returns:
        The rows.
    """
    cfg = dict(MODES[mode], lengths=lengths or MODES[mode]["lengths"])
    texts = {n: corpus(n) for n in cfg["lengths"]}
    rows: list[dict] = []
    record = recorder(texts, rows)
    counts = {MIXED: list(mixed_corpus()[1])} if MIXED in cfg["lengths"] else {}
    seconds = cfg["duration_s"]
    with TritonServer() as server, GatewayServer(server) as gateway, VllmServer() as vllm:
        vllm_url = f"http://127.0.0.1:{vllm.port}/v1/embeddings"

        def measure(contender: str, n: int, b: int, c: int) -> dict:
            if contender == "triton_client":
                return client_library(server, texts[n][0], b, c, seconds)
            fmt = contender.split("_")[1]
            if contender.startswith("gateway_"):
                return gateway_load(
                    gateway.url, texts[n][0], b, c, seconds, fmt, text_tokens=counts.get(n)
                )
            return vllm_load(vllm_url, texts[n][0], b, c, seconds, fmt, text_tokens=counts.get(n))

        idle, servers = idle_cpu(
            {"triton": server.process.pid, "gateway": gateway.proc.pid, "vllm": vllm.proc.pid}
        )
        print(
            f"with every server up and idle: machine CPU {idle:.1f}%, the servers' cores "
            + ", ".join(f"{k} {v:.3f}" for k, v in servers.items()),
            flush=True,
        )
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        for k in range(1, cfg["rounds"] + 1):
            for n in cfg["lengths"]:
                for b, c in cfg["grid"]:
                    for contender in ALTERNATION:
                        record(contender, n, b, c, measure(contender, n, b, c), round=k)
    save(
        rows,
        out_dir,
        "results",
        mode=mode,
        started=started,
        rounds=cfg["rounds"],
        order=list(ALTERNATION),
        duration_s=seconds,
        idle_cpu_percent=idle,
        idle_server_cores=servers,
        cpus=len(os.sched_getaffinity(0)),
    )
    return rows


def idle_cpu(pids: dict[str, int], seconds: float = 5.0) -> tuple[float, dict[str, float]]:
    """CPU use over ``seconds``: the machine's, and each process tree's (a server's).

    Args:
        pids: name -> PID of a process whose tree (it and its descendants) to measure.
        seconds: the measurement time.

    Returns:
        ``(machine percent of all cores, {name: cores used})``.
    """
    import psutil

    def cpu_s(pid: int) -> float:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
        total = 0.0
        for proc in procs:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    before = {k: cpu_s(pid) for k, pid in pids.items()}
    psutil.cpu_percent()
    t0 = time.perf_counter()
    time.sleep(seconds)
    machine = psutil.cpu_percent()
    dt = time.perf_counter() - t0
    return machine, {k: (cpu_s(pid) - before[k]) / dt for k, pid in pids.items()}


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
        "--rounds", type=int, help="--mode alternatives: how many rounds (default 2)"
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
    if args.mode == "alternatives":
        rows = run_alternatives(args.out, args.lengths, args.rounds or MODES[args.mode]["rounds"])
        print()
        print(summarize_alternatives(rows, args.out))
    elif MODES[args.mode].get("rounds"):
        rows = run_rounds(args.mode, args.out, args.lengths)
        print()
        print(summarize_rounds(rows, args.out))
    else:
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
