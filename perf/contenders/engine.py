"""Contender ``engine``: in-process vLLM pooling engines on token IDs, no server: the ceiling.

:func:`engine_ceiling` starts ``replicas`` child processes, each running this module
(``python -m perf.contenders.engine``) pinned to its own CPU slice. A replica loads its
engine, prints ``READY``, waits for a line on stdin (so every replica starts together),
embeds whole passes over the corpus for the given seconds, and prints
``RESULT {"texts_s": ..., "tokens_per_text": ...}``. :func:`pinned_replicas` and
:func:`measure_when_told` are the two sides of that protocol, shared with the reranking
benchmark's engine (:mod:`perf.contenders.rerank_engine`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

from triton_embed_server.run.launcher import REPO_ROOT


def engine_ceiling(length: int, seconds: float, replicas: int, options: dict | None = None) -> dict:
    """Texts/s of in-process vLLM engines on token IDs, no server: the machine's ceiling.

    Args:
        length: length key of the corpus (tokens per text, or ``MIXED``).
        seconds: measurement time.
        replicas: ``1``: one engine with every CPU (``OMP_NUM_THREADS`` = CPUs); ``k``:
            ``k`` engines side by side, each pinned to its own CPU slice, summed (the layout
            of our ``embedder`` instances).
        options: further ``vllm.LLM`` arguments, overriding the defaults of :func:`replica`
            (e.g. ``{"enforce_eager": False}``; ``perf/engine_options.py``).

    Returns:
        A contender result: summed ``texts_s``, no latencies, ``tokens_per_text`` of the
        corpus the replicas embedded.

    Raises:
        RuntimeError: a replica failed to start or to report.
    """
    args = ["--length", str(length), "--seconds", str(seconds)]
    results = pinned_replicas(
        "perf.contenders.engine", args + ["--options", json.dumps(options or {})], replicas
    )
    return {
        "texts_s": sum(r["texts_s"] for r in results),
        "p50_ms": None,
        "p99_ms": None,
        "errors": 0,
        "tokens_per_text": results[-1]["tokens_per_text"],
    }


def pinned_replicas(module: str, args: list[str], replicas: int) -> list[dict]:
    """Run ``replicas`` engine child processes side by side, each on its own CPU slice.

    Each child is ``python -m <module> --cpus <its slice> <args>`` with ``OMP_NUM_THREADS``
    and ``VLLM_CPU_OMP_THREADS_BIND`` set to its slice; it follows the protocol of
    :func:`measure_when_told`. Every replica is told to start once all are ready; the
    children are killed at the end, also on failure.

    Args:
        module: the child's module (it takes ``--cpus``).
        args: its further arguments.
        replicas: how many (``1``: one child with every CPU of this process).

    Returns:
        Each replica's ``RESULT`` object, in replica order.

    Raises:
        RuntimeError: a replica failed to start or to report.
    """
    from triton_embed_server.host.placement.slicing import cpu_slice

    cpus = sorted(os.sched_getaffinity(0))
    procs = []
    try:
        for i in range(replicas):
            mine = cpu_slice(cpus, i, replicas)
            env = dict(
                os.environ,
                VLLM_ENABLE_V1_MULTIPROCESSING="0",
                HF_HUB_OFFLINE="1",
                OMP_NUM_THREADS=str(len(mine)),
                VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, mine)),
            )
            cmd = [sys.executable, "-m", module, "--cpus", ",".join(map(str, mine)), *args]
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=REPO_ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=env,
                )
            )
        for p in procs:
            for line in p.stdout:
                if line.startswith("READY"):
                    break
            else:
                raise RuntimeError(f"an engine replica ({module}) failed to start")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            line = next((x for x in p.stdout if x.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError(f"an engine replica ({module}) failed")
            results.append(json.loads(line[7:]))
        return results
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
            p.wait()


def measure_when_told(work: Callable[[], int], seconds: float) -> float:
    """A replica's side of :func:`pinned_replicas`: items/s of ``work`` once told to start.

    Prints ``READY``, waits for a line on stdin (so every replica starts together), then
    calls ``work`` (which returns the items it did) until ``seconds`` have passed. The
    caller prints ``RESULT {...}`` with the rate.
    """
    print("READY", flush=True)
    sys.stdin.readline()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += work()
    return n / (time.perf_counter() - t0)


def replica(cpus: set[int], length: int, seconds: float, options: dict | None = None) -> None:
    """One engine replica (the child process); see the module docstring for its protocol."""
    os.sched_setaffinity(0, cpus)  # before torch starts its threads
    from transformers import AutoTokenizer
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from perf.corpora import MAX_TOKENS, MODEL, corpus

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    ids = [tok(t, truncation=True, max_length=MAX_TOKENS)["input_ids"] for t in corpus(length)[0]]
    # whole passes over the corpus, so mixed lengths are embedded in their true proportions
    prompts = [TokensPrompt(prompt_token_ids=x) for x in ids] * max(1, 256 // len(ids))
    tokens_per_text = sum(map(len, ids)) / len(ids)
    kwargs = {
        "model": str(MODEL),
        "runner": "pooling",
        "dtype": "float32",
        "enforce_eager": True,
        "gpu_memory_utilization": 0.1,
        "max_model_len": MAX_TOKENS,
    }
    llm = LLM(**{**kwargs, **(options or {})})
    llm.embed(prompts[:16], use_tqdm=False)
    texts_s = measure_when_told(lambda: len(llm.embed(prompts, use_tqdm=False)), seconds)
    result = {"texts_s": texts_s, "tokens_per_text": tokens_per_text}
    print("RESULT " + json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of one replica: ``python -m perf.contenders.engine --cpus 0,1 ...``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cpus", required=True, help="comma-separated CPUs to pin to")
    parser.add_argument("--length", type=int, required=True, help="length key of the corpus")
    parser.add_argument("--seconds", type=float, required=True, help="measurement time")
    parser.add_argument("--options", type=json.loads, default={}, help="vllm.LLM arguments, JSON")
    args = parser.parse_args(argv)
    replica({int(c) for c in args.cpus.split(",")}, args.length, args.seconds, args.options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
