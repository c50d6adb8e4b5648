"""The steps' dynamic batching side by side: preferred batch size and queue delays.

Three studies: the embedder's ``preferred_batch_size``; the tokenizer's and embedder's
``max_queue_delay_microseconds``; the embedder's ``max_batch_size`` (``max_batch``).

    .venv/bin/python -m perf.dynamic_batching --study preferred   # about 8 min on 2 cores
    .venv/bin/python -m perf.dynamic_batching --study delay       # about 8 min on 2 cores

Each variant is a copy of ``model_repository`` with the study's knobs changed
(:func:`variant_repository`). In each round every variant is served in turn (the order
reversed in even rounds) and loaded through our client library
(:func:`perf.contenders.triton_client.client_library`) at the study's points; rows go to
``<out>/dynamic_batching_<study>.json`` and each is printed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

from perf.contenders.triton_client import client_library
from perf.corpora import corpus
from perf.report import recorder, save


class Variant(NamedTuple):
    """Knobs of one variant; ``None`` keeps the shipped value."""

    #: the embedder's ``preferred_batch_size``; 0 removes the line.
    preferred: int | None = None
    #: ``max_queue_delay_microseconds`` of the tokenizer and of the embedder.
    tokenizer_delay_us: int | None = None
    embedder_delay_us: int | None = None
    #: the embedder's ``max_batch_size``: texts one batch may hold.
    max_batch_size: int | None = None
    #: the embedder's ``batch_call_tokens`` (steps/engine_queue.py; 0: batch work is not cut).
    batch_call_tokens: int | None = None
    #: the embedder's ``interactive_window_s`` (steps/engine_queue.py).
    interactive_window_s: float | None = None


#: study -> (variant name -> knobs, points as (tokens per text, texts per request, in flight)).
STUDIES = {
    "preferred": (
        {"none": Variant(preferred=0), "32 (shipped)": Variant(), "64": Variant(preferred=64)},
        ((50, 16, 8), (50, 1, 32), (256, 16, 8), (256, 1, 16)),
    ),
    "delay": (
        {
            "500/1000 us (shipped)": Variant(),
            "500/0 us": Variant(embedder_delay_us=0),
            "0/0 us": Variant(tokenizer_delay_us=0, embedder_delay_us=0),
        },
        ((50, 1, 1), (256, 1, 1), (50, 1, 4), (50, 1, 32), (50, 16, 8), (256, 16, 8)),
    ),
    "max_batch": (
        {"256": Variant(max_batch_size=256), "64": Variant(max_batch_size=64)},
        ((50, 16, 8), (50, 64, 4), (256, 16, 8), (256, 64, 2), (50, 1, 32)),
    ),
}
LINE = re.compile(r"^\s*preferred_batch_size:.*\n", re.M)
MAX_BATCH = re.compile(r"^max_batch_size: \d+$", re.M)


def variant_repository(root: Path, variant: Variant) -> Path:
    """A copy of the shipped repository with the variant's knobs set (the rest as shipped)."""
    repo = root / "model_repository"
    copy_repository(repo)
    config = repo / "embedder" / "config.pbtxt"
    if variant.preferred is not None:
        text = config.read_text()
        if not LINE.search(text):
            raise ValueError(f"{config}: no preferred_batch_size line to change")
        line = f"  preferred_batch_size: [ {variant.preferred} ]\n" if variant.preferred else ""
        config.write_text(LINE.sub(line, text, count=1))
    if variant.max_batch_size is not None:
        text = config.read_text()
        if len(MAX_BATCH.findall(text)) != 1:
            raise ValueError(f"{config}: not one top-level max_batch_size line to change")
        config.write_text(MAX_BATCH.sub(f"max_batch_size: {variant.max_batch_size}", text))
    edit_config(config, max_queue_delay_us=variant.embedder_delay_us)
    queue = {"batch_call_tokens": variant.batch_call_tokens}
    queue["interactive_window_s"] = variant.interactive_window_s
    queue = {k: f"{v:g}" for k, v in queue.items() if v is not None}
    if queue:
        edit_config(config, parameters=queue)
    edit_config(repo / "tokenizer" / "config.pbtxt", max_queue_delay_us=variant.tokenizer_delay_us)
    return repo


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.dynamic_batching --study preferred|delay [--rounds 2] [--seconds 5]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=sorted(STUDIES), default="preferred")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "results")
    args = parser.parse_args(argv)
    variants, points = STUDIES[args.study]
    texts = {n: corpus(n) for n in {p[0] for p in points}}
    rows: list[dict] = []
    record = recorder(texts, rows)
    with tempfile.TemporaryDirectory() as tmp:
        repos = {name: variant_repository(Path(tmp, str(i)), v) for i, (name, v) in
                 enumerate(variants.items())}  # fmt: skip
        for k in range(1, args.rounds + 1):
            for name in list(variants) if k % 2 else list(variants)[::-1]:
                with TritonServer(model_repository=repos[name], ready_timeout_s=600) as srv:
                    for n, b, c in points:
                        result = client_library(srv, texts[n][0], b, c, args.seconds)
                        record(name, n, b, c, result, round=k)
    save(rows, args.out, f"dynamic_batching_{args.study}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
