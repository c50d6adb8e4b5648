"""The embedder's ``preferred_batch_size``, side by side: none, 32 (shipped) and 64.

    .venv/bin/python -m perf.preferred_batch          # about 8 min on 2 cores

Each variant is a copy of ``model_repository`` whose embedder's ``dynamic_batching`` has that
``preferred_batch_size`` (none: the line removed). In each round every variant is served in
turn (the order reversed in even rounds) and loaded through our client library
(:func:`perf.contenders.triton_client.client_library`) at :data:`POINTS`; rows go to
``<out>/preferred_batch.json`` and each is printed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from triton_embed_server.models.repository.copies import copy_repository
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

from perf.contenders.triton_client import client_library
from perf.corpora import corpus
from perf.report import recorder, save

#: variant -> its ``preferred_batch_size`` (None: no such line).
VARIANTS = {"none": None, "32 (shipped)": 32, "64": 64}
#: (tokens per text, texts per request, requests in flight).
POINTS = ((50, 16, 8), (50, 1, 32), (256, 16, 8), (256, 1, 16))
LINE = re.compile(r"^\s*preferred_batch_size:.*\n", re.M)


def variant_repository(root: Path, size: int | None) -> Path:
    """A copy of the shipped repository with the embedder's preferred batch size set."""
    repo = root / "model_repository"
    copy_repository(repo)
    config = repo / "embedder" / "config.pbtxt"
    text = config.read_text()
    if not LINE.search(text):
        raise ValueError(f"{config}: no preferred_batch_size line to change")
    line = "" if size is None else f"  preferred_batch_size: [ {size} ]\n"
    config.write_text(LINE.sub(line, text, count=1))
    return repo


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.preferred_batch [--rounds 2] [--seconds 5]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "results")
    args = parser.parse_args(argv)
    texts = {n: corpus(n) for n in {p[0] for p in POINTS}}
    rows: list[dict] = []
    record = recorder(texts, rows)
    with tempfile.TemporaryDirectory() as tmp:
        repos = {v: variant_repository(Path(tmp, str(i)), s) for i, (v, s) in
                 enumerate(VARIANTS.items())}  # fmt: skip
        for k in range(1, args.rounds + 1):
            for variant in list(VARIANTS) if k % 2 else list(VARIANTS)[::-1]:
                with TritonServer(model_repository=repos[variant], ready_timeout_s=600) as srv:
                    for n, b, c in POINTS:
                        result = client_library(srv, texts[n][0], b, c, args.seconds)
                        record(variant, n, b, c, result, round=k)
    save(rows, args.out, "preferred_batch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
