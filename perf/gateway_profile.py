"""Where the CPU goes while the gateway serves 50-token texts: processes, and py-spy inside it.

Starts the server and the gateway in front of it (:class:`~perf.contenders.gateway.GatewayServer`)
and measures, at one load (50-token texts, ``--batch`` per request, ``--concurrency`` in
flight):

* pass 0: the server alone, loaded by perf_analyzer (C++, gRPC);
* pass 1: the gateway, loaded with the benchmark's load generator (``encoding_format`` base64
  by default, in a thread of this process);
* in both, CPU seconds per process over ``--seconds`` (psutil: the gateway, ``tritonserver``,
  each stub, the load generator) and the machine's busy cores, so that what other processes
  took shows (``other processes``); the tokens/s the server counted and the embedder's
  texts per execution (its dynamic batches), from Triton's metrics;
* pass 2: ``py-spy record --nonblocking`` of the gateway (it never stops the process), as
  collapsed stacks and a flame graph, summarized by where the samples' innermost frames
  fall: our gateway code, the gRPC client, the HTTP server, JSON and base64, the event loop.

    .venv/bin/python -m perf.gateway_profile --out perf/gateway/profile
    .venv/bin/python -m perf.gateway_profile --batch 16 --concurrency 8 --out /tmp/p16
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from triton_embed_server.run.launcher import TritonServer

from perf.contenders.gateway import GatewayServer, gateway_load
from perf.contenders.triton_pa import (
    background_load_options,
    perf_analyzer_command,
    write_input_data,
)
from perf.corpora import exact_texts

# Where a sampled stack belongs: the category of its innermost frame that matches one.
CATEGORIES = (
    ("gateway code (triton_embed_server/gateway)", ("triton_embed_server/gateway/",)),
    ("our client package (codec, options)", ("triton_embed/",)),
    ("gRPC client (tritonclient, grpc.aio, protobuf)", ("tritonclient/", "grpc/", "protobuf/")),
    ("HTTP server (uvicorn, starlette, httptools)", ("uvicorn/", "starlette/", "httptools", "h11")),
    ("JSON and base64", ("orjson", "json/", "base64")),
    ("numpy", ("numpy/",)),
    ("Prometheus metrics", ("prometheus_client/",)),
    ("event loop (asyncio, uvloop)", ("asyncio/", "uvloop")),
)


def categorize(stack: str) -> str:
    """Category of one collapsed stack (frames joined by ';', outermost first)."""
    for frame in reversed(stack.split(";")):
        for name, patterns in CATEGORIES:
            if any(p in frame for p in patterns):
                return name
    return "other"


def summarize_collapsed(path: Path, top: int = 15) -> dict:
    """Fractions of samples per category, and the innermost frames with the most samples.

    Args:
        path: a py-spy ``--format raw`` file (``frame;frame;... count`` per line).
        top: how many innermost frames to list.

    Returns:
        ``{"samples": n, "categories": {name: fraction}, "top_frames": {frame: fraction}}``.
    """
    categories: collections.Counter[str] = collections.Counter()
    frames: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        categories[categorize(stack)] += int(n)
        frames[_short(stack.split(";")[-1])] += int(n)
    total = sum(categories.values()) or 1
    return {
        "samples": total,
        "categories": {k: round(v / total, 3) for k, v in categories.most_common()},
        "top_frames": {k: round(v / total, 3) for k, v in frames.most_common(top)},
    }


def _short(frame: str) -> str:
    """``func (/long/path/site-packages/pkg/mod.py:12)`` -> ``func (pkg/mod.py:12)``."""
    for marker in ("site-packages/", "/server/", "/client/", "/lib/python3"):
        if marker in frame:
            head, _, tail = frame.partition(marker)
            return f"{head.split('(')[0]}({tail}"
    return frame


def busy_cores_s() -> float:
    """CPU seconds all cores of the machine have been busy so far."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)


def server_processes(server: TritonServer) -> dict[str, psutil.Process]:
    """``tritonserver`` and its stubs (``tokenizer_0_0``, ``embedder_0_0``, ...) by name."""
    procs = {}
    for p in psutil.Process(server.process.pid).children(recursive=True):
        cmd = p.cmdline()
        if not cmd:
            continue
        if cmd[0].endswith("tritonserver"):
            procs["tritonserver"] = p
        elif "triton_python_backend_stub" in cmd[0]:
            name = next((a for a in cmd if a.startswith(("tokenizer_", "embedder_"))), None)
            if name:
                procs[name] = p
    return procs


def served(server: TritonServer) -> dict[str, float]:
    """Triton's request counters so far: texts (``nv_inference_count``) and executions.

    Returns:
        ``{"tokenizer texts", "embedder texts", "embedder executions"}``.
    """
    wanted = {
        ("nv_inference_count_total", "tokenizer"): "tokenizer texts",
        ("nv_inference_count_total", "embedder"): "embedder texts",
        ("nv_inference_exec_count_total", "embedder"): "embedder executions",
    }
    out = dict.fromkeys(wanted.values(), 0.0)
    for sample in server.metric_samples():
        key = wanted.get((sample.name, sample.labels.get("model")))
        if key:
            out[key] += sample.value
    return out


def account(
    procs: dict[str, psutil.Process], server: TritonServer, seconds: float, tokens_per_text: int
) -> dict:
    """CPU per process over ``seconds``, what other processes took, and what the server served.

    Returns:
        ``cores`` (CPU seconds per second, per process, and ``other processes``: the machine's
        busy cores minus those), ``machine_busy_cores``, ``served_tokens_s`` (the tokenizer
        step's texts x ``tokens_per_text``, per second) and ``embedder_batch`` (texts per
        embedder execution: the dynamic batches).
    """
    before = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
    machine_before, counts_before = busy_cores_s(), served(server)
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    after = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
    machine = (busy_cores_s() - machine_before) / wall
    counts = {k: v - counts_before[k] for k, v in served(server).items()}
    cores = {k: (after[k] - before[k]) / wall for k in procs}
    cores["other processes"] = max(0.0, machine - sum(cores.values()))
    return {
        "cores": {k: round(v, 3) for k, v in cores.items()},
        "machine_busy_cores": round(machine, 3),
        "served_tokens_s": round(counts["tokenizer texts"] * tokens_per_text / wall),
        "embedder_batch": round(
            counts["embedder texts"] / max(1.0, counts["embedder executions"]), 1
        ),
    }


def py_spy(pid: int, seconds: float, raw: Path, svg: Path) -> None:
    """``py-spy record --nonblocking`` of ``pid``, twice at once.

    Collapsed stacks go to ``raw`` (``--format raw``), a flame graph to ``svg``.
    """
    spy = str(Path(sys.prefix) / "bin" / "py-spy")
    record = [spy, "record", "--pid", str(pid), "--nonblocking", "--rate", "100"]
    spies = [
        subprocess.Popen(
            [*record, "--duration", str(int(seconds)), "--format", fmt, "--output", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for fmt, path in (("raw", raw), ("flamegraph", svg))
    ]
    for proc in spies:
        proc.wait(timeout=seconds + 120)
        if proc.returncode:
            print(f"py-spy: exit {proc.returncode}: {proc.stderr.read()[-500:]}")
    if svg.exists():  # the title holds py-spy's command line: no machine paths
        svg.write_text(svg.read_text().replace(f"{sys.prefix}/bin/py-spy", ".venv/bin/py-spy"))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("perf/gateway/profile"))
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--batch", type=int, default=1, help="texts per request")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--encoding", choices=("base64", "float"), default="base64")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    length, warmup_s = 50, 5.0
    texts = exact_texts(length)
    report: dict = {
        "case": f"{length} tokens, {args.batch} text(s)/request, {args.concurrency} in flight",
        "cores": len(psutil.Process().cpu_affinity()),
    }
    with (
        TritonServer() as server,
        GatewayServer(server) as gateway,
        tempfile.TemporaryDirectory() as tmp,
    ):
        # pass 0: perf_analyzer (C++, gRPC) at the same load: the server without the gateway
        data = write_input_data(Path(tmp, "data.json"), texts)
        analyzer = subprocess.Popen(
            perf_analyzer_command(
                server.grpc_url,
                data,
                "-b",
                str(args.batch),
                *background_load_options(args.concurrency, args.seconds),
                admin_key=server.admin_key,
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(warmup_s)
            procs = {**server_processes(server), "perf_analyzer": psutil.Process(analyzer.pid)}
            report["perf_analyzer (gRPC)"] = account(procs, server, args.seconds, length)
        finally:
            analyzer.terminate()
            analyzer.wait(timeout=60)
        # pass 1: the gateway, CPU accounting alone (sampling adds its own overhead);
        # pass 2: py-spy of the gateway under the same load
        result: dict = {}
        load = threading.Thread(
            target=lambda: result.update(
                gateway_load(
                    gateway.url,
                    texts,
                    args.batch,
                    args.concurrency,
                    warmup_s + 2 * args.seconds + 5,
                    args.encoding,
                )
            )
        )
        load.start()
        time.sleep(warmup_s)
        procs = {"gateway": psutil.Process(gateway.proc.pid), **server_processes(server)}
        procs["load generator (this process)"] = psutil.Process()
        report[f"gateway ({args.encoding})"] = account(procs, server, args.seconds, length)
        raw = Path(tmp, "gateway.txt")
        py_spy(gateway.proc.pid, args.seconds, raw, args.out / "gateway.svg")
        load.join()
        if raw.exists():
            report["gateway_profile"] = summarize_collapsed(raw)
    report["gateway load generator"] = {
        "tokens_s": round(result.get("texts_s", 0.0) * length),
        "p50_ms": result.get("p50_ms"),
        "p99_ms": result.get("p99_ms"),
        "errors": result.get("errors"),
    }
    (args.out / "profile.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
