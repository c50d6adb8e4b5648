"""Contender ``sentence_transformers``: ``SentenceTransformer.encode`` in-process, plain PyTorch.

The reference a user compares a server with: the model's own library, no server, no HTTP, its
own length-sorted batching (``encode`` sorts the texts of a call by length and pads each
batch to its longest text). :func:`sentence_transformers_encode` runs it in a child process
(``python -m perf.contenders.sentence_transformers``) with torch using every core of this
process (``OMP_NUM_THREADS`` = CPUs, the library's default on an unset variable), tries each
batch size of :data:`BATCH_SIZES` for the measurement time and reports the best, with every
size's figure in ``batch_sizes``.

The child prints ``RESULT {"texts_s": ..., "tokens_per_text": ..., "batch_size": ...,
"batch_sizes": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from triton_embed_server.run.launcher import REPO_ROOT

#: The batch sizes tried; 32 is ``encode``'s default.
BATCH_SIZES = (16, 32, 64, 128)
#: Texts per ``encode`` call: whole passes over the corpus, so mixed lengths are embedded in
#: their true proportions and ``encode`` sorts a realistic amount of work.
TEXTS_PER_CALL = 512


def sentence_transformers_encode(
    length: int, seconds: float, batch_sizes: tuple[int, ...] = BATCH_SIZES
) -> dict:
    """Texts/s of ``SentenceTransformer.encode`` at its best batch size.

    Args:
        length: length key of the corpus (tokens per text, or ``MIXED``).
        seconds: measurement time per batch size.
        batch_sizes: the batch sizes tried.

    Returns:
        A contender result: the best ``texts_s``, no latencies, ``tokens_per_text`` of the
        corpus, ``batch_size`` (the best) and ``batch_sizes`` ({size: texts/s}).

    Raises:
        RuntimeError: the child process failed.
    """
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS=str(len(os.sched_getaffinity(0))),
        TOKENIZERS_PARALLELISM="true",
    )
    cmd = [
        sys.executable,
        "-m",
        "perf.contenders.sentence_transformers",
        "--length",
        str(length),
        "--seconds",
        str(seconds),
        "--batch-sizes",
        ",".join(map(str, batch_sizes)),
    ]
    done = subprocess.run(
        cmd, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=600, check=False
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"sentence-transformers contender failed:\n{done.stderr[-2000:]}")
    result = json.loads(line[7:])
    return {"p50_ms": None, "p99_ms": None, "errors": 0, **result}


def measure(length: int, seconds: float, batch_sizes: list[int]) -> dict:
    """The child's work: every batch size for ``seconds``; see the module docstring."""
    from sentence_transformers import SentenceTransformer

    from perf.corpora import MAX_TOKENS, MODEL, corpus

    model = SentenceTransformer(str(MODEL), device="cpu")
    model.max_seq_length = MAX_TOKENS
    texts = corpus(length)[0]
    tokens = [min(len(x), MAX_TOKENS) for x in model.tokenizer(texts)["input_ids"]]
    batch = (texts * (TEXTS_PER_CALL // len(texts) + 1))[:TEXTS_PER_CALL]
    model.encode(batch[:64], batch_size=32)  # warm-up
    rates = {}
    for size in batch_sizes:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            model.encode(batch, batch_size=size, convert_to_numpy=True)
            n += len(batch)
        rates[size] = n / (time.perf_counter() - t0)
    best = max(rates, key=rates.get)
    return {
        "texts_s": rates[best],
        # whole passes over the corpus: its mean is the mean of what was embedded
        "tokens_per_text": sum(tokens) / len(tokens),
        "batch_size": best,
        "batch_sizes": {str(k): round(v, 1) for k, v in rates.items()},
    }


def main(argv: list[str] | None = None) -> int:
    """The child: ``python -m perf.contenders.sentence_transformers --length 50 ...``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--length", type=int, required=True, help="length key of the corpus")
    parser.add_argument("--seconds", type=float, required=True, help="time per batch size")
    parser.add_argument("--batch-sizes", required=True, help="comma-separated batch sizes")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    print("RESULT " + json.dumps(measure(args.length, args.seconds, sizes)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
