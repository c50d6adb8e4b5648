"""Contender ``engine`` of :mod:`perf.rerank`: in-process vLLM engines scoring token IDs.

No server: the reranker's ceiling on this machine. :func:`rerank_engine_ceiling` writes
the pre-tokenized pairs (token IDs and segment starts, from the cross-encoder's own
tokenizer) to a file and runs one engine per CPU slice side by side
(:func:`perf.contenders.engine.pinned_replicas`, the layout of our scorer instances),
summed. Each replica (``python -m perf.contenders.rerank_engine``) calls the engine as our
scorer step does (:class:`triton_embed_server.steps.vllm_scorer.ScoringEngine`):
``LLM.encode(TokensPrompt(ids), pooling_task="classify")`` with each pair's segment start
in ``PoolingParams(use_activation=False, extra_kwargs={SEGMENT_KEY: k})``, 256 pairs per
call (the scorer's ``max_batch_size``), and prints ``RESULT {"pairs_s", "tokens_per_pair"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from triton_embed_server.steps.vllm_scorer import SEGMENT_KEY

from perf.contenders.engine import measure_when_told, pinned_replicas
from perf.corpora import PairCorpus

#: Pairs per engine call: the scorer step's ``max_batch_size`` (its largest dynamic batch).
PAIRS_PER_CALL = 256


def tokenized_pairs(model: Path, corpus: PairCorpus, count: int = PAIRS_PER_CALL) -> dict:
    """``count`` pairs of ``corpus`` as the pair tokenizer step hands them to the scorer.

    Returns:
        ``{"token_ids": [[int, ...], ...], "segment_starts": [int, ...]}``: each pair's
        ``[CLS] query [SEP] document [SEP]`` IDs and the index of its first segment-1 token.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    queries = [corpus.queries[k % len(corpus.queries)] for k in range(count)]
    enc = tok(queries, [corpus.documents[k % len(corpus.documents)] for k in range(count)])
    return {
        "token_ids": enc["input_ids"],
        "segment_starts": [types.index(1) for types in enc["token_type_ids"]],
    }


def rerank_engine_ceiling(
    model: Path, corpus: PairCorpus, seconds: float, replicas: int, options: dict | None = None
) -> dict:
    """Pairs/s of in-process vLLM engines scoring pre-tokenized pairs, summed over replicas.

    Args:
        model: the cross-encoder's folder.
        corpus: the pairs (exactly ``corpus.length`` tokens each).
        seconds: measurement time.
        replicas: engines side by side, each pinned to its own CPU slice (1: one engine
            with every CPU).
        options: further ``vllm.LLM`` arguments over :func:`replica`'s defaults.

    Returns:
        A rerank contender result: summed ``pairs_s``, ``tokens_per_pair`` counted from the
        token IDs scored, no latencies.

    Raises:
        RuntimeError: a replica failed to start or to report.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="rerank-pairs-") as f:
        json.dump(tokenized_pairs(model, corpus), f)
        f.flush()
        args = ["--model", str(model), "--pairs", f.name, "--seconds", str(seconds)]
        results = pinned_replicas(
            "perf.contenders.rerank_engine",
            [*args, "--options", json.dumps(options or {})],
            replicas,
        )
    return {
        "pairs_s": sum(r["pairs_s"] for r in results),
        "tokens_per_pair": results[-1]["tokens_per_pair"],
        "tokens_counted_by": "engine",
        "p50_ms": None,
        "p99_ms": None,
        "errors": 0,
    }


def replica(cpus: set[int], model: Path, pairs: dict, seconds: float, options: dict) -> None:
    """One engine replica (the child process): see the module docstring."""
    os.sched_setaffinity(0, cpus)  # before torch starts its threads
    from vllm import LLM, PoolingParams
    from vllm.inputs import TokensPrompt

    from perf.cross_encoder import MAX_LENGTH

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in pairs["token_ids"]]
    params = [
        PoolingParams(use_activation=False, extra_kwargs={SEGMENT_KEY: int(k)})
        for k in pairs["segment_starts"]
    ]
    kwargs = {
        "model": str(model),
        "runner": "pooling",
        "dtype": "float32",
        "enforce_eager": True,
        "gpu_memory_utilization": 0.1,
        "max_model_len": MAX_LENGTH,
    }
    llm = LLM(**{**kwargs, **options})

    def score(n: int = len(prompts)) -> int:
        out = llm.encode(
            prompts[:n], pooling_params=params[:n], use_tqdm=False, pooling_task="classify"
        )
        return len(out)

    score(16)  # warm-up
    pairs_s = measure_when_told(score, seconds)
    tokens = sum(map(len, pairs["token_ids"])) / len(prompts)
    print("RESULT " + json.dumps({"pairs_s": pairs_s, "tokens_per_pair": tokens}), flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.contenders.rerank_engine --cpus 0 --model DIR --pairs FILE ...``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cpus", required=True, help="comma-separated CPUs to pin to")
    parser.add_argument("--model", type=Path, required=True, help="the cross-encoder folder")
    parser.add_argument("--pairs", type=Path, required=True, help="tokenized_pairs() JSON")
    parser.add_argument("--seconds", type=float, required=True, help="measurement time")
    parser.add_argument("--options", type=json.loads, default={}, help="vllm.LLM arguments, JSON")
    args = parser.parse_args(argv)
    pairs = json.loads(args.pairs.read_text())
    cpus = {int(c) for c in args.cpus.split(",")}
    replica(cpus, args.model, pairs, args.seconds, args.options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
