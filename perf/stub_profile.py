"""Where the CPU goes while the ensemble serves 50-token texts, one per request.

That is the case below target. This measures CPU seconds per process and takes py-spy
profiles of the Python-backend stubs under perf_analyzer load (gRPC, 1 text per request,
concurrency 32):

* CPU seconds of every process over the measurement window (psutil): ``tritonserver``, each
  stub (tokenizer, embedder replicas), the load generator;
* ``py-spy record --nonblocking`` of each stub (it never stops the stub: a stopped stub can
  leave the server waiting on a shared-memory lock it holds), as a flame graph
  SVG and as collapsed stacks, summarized by where the samples fall: the model forward
  (torch), the rest of vLLM, our code, Triton's stub glue (pb_utils / IPC), idle waiting.

    .venv/bin/python -m perf.stub_profile --out perf/profiles
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from triton_embed_server.run.launcher import TritonServer

from perf.contenders.triton_pa import (
    background_load_options,
    perf_analyzer_command,
    write_input_data,
)
from perf.corpora import exact_texts

# Where a sampled stack belongs, by the first matching frame pattern, innermost first.
CATEGORIES = (
    (
        "model forward (torch ops)",
        ("torch/nn/", "torch/_ops", "at::", "torch::", "libtorch", "mkl", "dnnl", "gemm", "_C."),
    ),
    ("vLLM scheduler/runner", ("vllm/",)),
    ("tokenizer (HF tokenizers)", ("tokenizers", "transformers/tokenization")),
    ("our serving code", ("triton_embed/", "triton_embed_server/")),
    (
        "stub glue (pb_utils, IPC, numpy)",
        (
            "triton_python_backend",
            "pb_utils",
            "numpy",
            "SharedMemory",
            "MessageQueue",
            "bi::",
            "boost::",
        ),
    ),
)


def categorize(stack: str) -> str:
    """Category of one collapsed stack (frames joined by ';', outermost first)."""
    frames = stack.split(";")
    for frame in reversed(frames):
        for name, patterns in CATEGORIES:
            if any(p in frame for p in patterns):
                return name
    if any(w in stack for w in ("wait", "poll", "futex", "sem_", "recv", "Wait", "condition")):
        return "waiting (idle)"
    return "other"


def summarize_collapsed(path: Path) -> dict[str, float]:
    """Fractions of samples per category in a py-spy ``--format raw`` file."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if n.isdigit():
            counts[categorize(stack)] += int(n)
    total = sum(counts.values()) or 1
    return {k: round(v / total, 3) for k, v in counts.most_common()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("perf/profiles"))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    texts = exact_texts(50)
    report: dict = {"case": f"50 tokens, 1 text/request, concurrency {args.concurrency}"}
    with TritonServer() as server, tempfile.TemporaryDirectory() as tmp:
        data = write_input_data(Path(tmp, "data.json"), texts)
        load = subprocess.Popen(
            perf_analyzer_command(
                server.grpc_url,
                data,
                *background_load_options(args.concurrency, args.seconds),
                admin_key=server.admin_key,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        time.sleep(5)  # warm up
        server_proc = psutil.Process(server.process.pid)
        procs = {
            "tritonserver": next(
                p
                for p in server_proc.children(recursive=True)
                if p.name().startswith("tritonserver")
                or "tritonserver" in " ".join(p.cmdline()[:1])
            )
        }
        for p in server_proc.children(recursive=True):
            cmd = p.cmdline()
            if cmd and "triton_python_backend_stub" in cmd[0]:
                name = next((a for a in cmd if a.startswith(("tokenizer_", "embedder_"))), None)
                if name:
                    procs[name] = p
        procs["perf_analyzer (load)"] = psutil.Process(load.pid)
        # pass 1: CPU accounting alone (sampling would add its own overhead)
        before = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
        t0 = time.monotonic()
        time.sleep(args.seconds)
        wall = time.monotonic() - t0
        after = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
        # pass 2: collapsed stacks of every stub; pass 3: flame graphs of one stub per model
        spy = str(Path(sys.prefix) / "bin" / "py-spy")
        stubs = [n for n in procs if n.startswith(("tokenizer_", "embedder_"))]
        for fmt, ext, names in (
            ("raw", "txt", stubs),
            ("flamegraph", "svg", [n for n in stubs if n.endswith("_0_0")]),
        ):
            spies = [
                (
                    name,
                    subprocess.Popen(
                        [
                            spy,
                            "record",
                            "--pid",
                            str(procs[name].pid),
                            "--nonblocking",
                            "--rate",
                            "50",
                            "--duration",
                            str(int(args.seconds)),
                            "--format",
                            fmt,
                            "--output",
                            str(args.out / f"{name}.{ext}"),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    ),
                )
                for name in names
            ]
            for name, proc in spies:
                proc.wait(timeout=args.seconds + 120)
                if proc.returncode:
                    print(
                        f"py-spy {name} {fmt}: exit {proc.returncode}: {proc.stderr.read()[-500:]}",
                        file=sys.stderr,
                    )
        load.terminate()
        load.wait(timeout=60)
    for svg in args.out.glob("*.svg"):  # the title holds py-spy's command line: no machine paths
        svg.write_text(svg.read_text().replace(f"{sys.prefix}/bin/py-spy", ".venv/bin/py-spy"))
    cores = len(psutil.Process().cpu_affinity())
    report["cpu_seconds_per_wall_second"] = {
        k: round((after[k] - before[k]) / wall, 3) for k in procs
    }
    report["cores"] = cores
    report["stub_profiles"] = {
        n: summarize_collapsed(args.out / f"{n}.txt")
        for n in stubs
        if (args.out / f"{n}.txt").exists()
    }
    (args.out / "profile.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
