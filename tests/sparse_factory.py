"""Tiny seeded SPLADE models built offline at test time, and their reference sparse vectors.

No SPLADE checkpoint ships in a package, so the tests make a small one with random weights
(the WordPiece tokenizer of :mod:`tests.model_factory`, trained on Debian's fortunes) and
compare the server with sentence-transformers' ``SparseEncoder`` on the same weights:

* :func:`make_splade`: a ``BertForMaskedLM`` saved by ``transformers``, wrapped as
  ``SparseEncoder(modules=[MLMTransformer(...), SpladePooling(...)])`` and saved with the
  library's own ``SparseEncoder.save`` (``modules.json``, ``sentence_bert_config.json``,
  the pooling module's ``config.json``, ``config_sentence_transformers.json``);
* :func:`make_plain_splade`: the same weights without the sentence-transformers files (a
  plain ``*ForMaskedLM`` SPLADE checkpoint);
* :func:`splade_reference`: ``SparseEncoder.encode`` of texts, dense float32.

Shapes: hidden size 128, 2 heads of 64, 2 layers, about 2,000 vocabulary entries
(:mod:`tests.model_factory`). The MLM decoder's bias is lowered by :data:`DECODER_BIAS` so
that a text's vector keeps a few hundred non-zero entries of its ~2,000 (random weights
otherwise leave almost every logit positive for some token: nothing would be sparse).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tests.model_factory import (
    HIDDEN_SIZE,
    INIT_STD,
    INTERMEDIATE_SIZE,
    NUM_HEADS,
    NUM_LAYERS,
    _save_tokenizer,
)

#: Added to every logit of the MLM head (its decoder bias): a text keeps a few hundred
#: vocabulary entries whose logit is positive for one of its tokens.
DECODER_BIAS = -6.0
#: The SPLADE model's token budget (``max_seq_length`` of its ``sentence_bert_config.json``).
SPLADE_MAX_LENGTH = 128
#: The SPLADE model's prompts (``input_type=query``), as in asymmetric sparse encoders.
SPLADE_PROMPTS = {"query": "query: ", "document": ""}


def make_splade(
    path: str | Path,
    *,
    seed: int = 0,
    pooling: str = "max",
    max_length: int = SPLADE_MAX_LENGTH,
    transformer: str = "MLMTransformer",
) -> Path:
    """A SPLADE folder as ``SparseEncoder.save`` writes it.

    Args:
        path: the folder (created; replaced if it exists).
        seed: ``torch.manual_seed`` of the weights.
        pooling: ``SpladePooling``'s ``pooling_strategy`` (``max`` or ``sum``).
        max_length: the encoder's ``max_seq_length``.
        transformer: ``MLMTransformer`` (sentence-transformers 5.0 to 5.3's module), or
            ``Transformer`` with ``transformer_task="fill-mask"`` (what 5.4+ builds).
    """
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import (
        MLMTransformer,
        SpladePooling,
        Transformer,
    )

    path = Path(path)
    body = path.parent / f"{path.name}-mlm"
    _save_bert_mlm(body, seed)
    if transformer == "MLMTransformer":
        module = MLMTransformer(str(body), max_seq_length=max_length)
    else:
        module = Transformer(str(body), transformer_task="fill-mask", max_seq_length=max_length)
    encoder = SparseEncoder(
        modules=[module, SpladePooling(pooling)],
        prompts=dict(SPLADE_PROMPTS),
        device="cpu",
    )
    if path.exists():
        shutil.rmtree(path)
    encoder.save(str(path))
    shutil.rmtree(body)
    return path


def make_plain_splade(path: str | Path, *, seed: int = 0) -> Path:
    """A plain ``BertForMaskedLM`` SPLADE checkpoint: weights, config and tokenizer only."""
    path = Path(path)
    _save_bert_mlm(path, seed)
    return path


def _save_bert_mlm(path: Path, seed: int) -> None:
    """A seeded ``BertForMaskedLM`` with a BERT fast tokenizer, as ``save_pretrained`` writes."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from tests.reranker_factory import _as_bert_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    ids = _save_tokenizer(path, "wordpiece")
    _as_bert_tokenizer(path)
    config = BertConfig(
        hidden_size=HIDDEN_SIZE,
        num_attention_heads=NUM_HEADS,
        num_hidden_layers=NUM_LAYERS,
        intermediate_size=INTERMEDIATE_SIZE,
        max_position_embeddings=512,
        initializer_range=INIT_STD,
        dtype="float32",
        **ids,
    )
    torch.manual_seed(seed)
    model = BertForMaskedLM(config)
    with torch.no_grad():
        model.cls.predictions.bias.normal_(DECODER_BIAS, 0.5)
    model.save_pretrained(path)


def splade_reference(
    path: Path,
    texts: Sequence[str],
    *,
    prompt_name: str | None = None,
    max_active_dims: int | None = None,
) -> np.ndarray:
    """``SparseEncoder.encode`` of ``texts``, dense float32 ``[n, vocab_size]``: the reference."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(path), device="cpu")
    out = model.encode(
        list(texts),
        prompt_name=prompt_name,
        max_active_dims=max_active_dims,
        convert_to_tensor=True,
        convert_to_sparse_tensor=False,
        batch_size=16,
        show_progress_bar=False,
    )
    return out.float().cpu().numpy()
