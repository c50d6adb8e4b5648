"""A tiny seeded BGE-M3-style model built offline at test time, and its reference outputs.

No BGE-M3 checkpoint ships in a package and FlagEmbedding is not installed, so the tests
write the BAAI/bge-m3 layout with ``transformers`` and ``torch`` and compute the reference
with FlagEmbedding's formulas on the same weights:

* :func:`make_bge_m3`: an ``XLMRobertaModel`` (``config.json`` architectures
  ``["XLMRobertaModel"]``, positions offset by the padding index as XLM-RoBERTa's) with a
  sentencepiece-style Unigram tokenizer trained on Debian's fortunes (``<s>``, ``<pad>``,
  ``</s>``, ``<unk>`` as IDs 0-3, ``<s> text </s>``, as XLM-RoBERTa's), and next to it
  ``colbert_linear.pt`` (``torch.nn.Linear(hidden, COLBERT_DIM)`` state dict) and
  ``sparse_linear.pt`` (``Linear(hidden, 1)``), seeded;
* :func:`bge_m3_reference`: FlagEmbedding's ``BGEM3FlagModel.encode`` arithmetic
  (``BGEM3Model._dense_embedding``, ``_sparse_embedding``, ``_colbert_embedding``,
  ``_process_token_weights``, ``_process_colbert_vecs``) on a padded batch: dense = the CLS
  hidden state, L2-normalized; sparse = ``relu(sparse_linear(h))`` per token, per token ID
  the largest, CLS/EOS/PAD/UNK left out, weights > 0; ColBERT = ``colbert_linear(h[:, 1:])``
  times the attention mask, the first ``tokens - 1`` rows, each L2-normalized.

Shapes: hidden 128, 2 heads of 64, 2 layers (:mod:`tests.model_factory`), ColBERT dim 128
(BGE-M3's is its hidden size), about 2,000 vocabulary entries, 128 tokens per text.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.model_factory import (
    HIDDEN_SIZE,
    INIT_STD,
    INTERMEDIATE_SIZE,
    NUM_HEADS,
    NUM_LAYERS,
    VOCAB_SIZE,
    fortune_texts,
)

#: The model's token budget per text (the tokenizer's ``model_max_length``).
BGE_M3_MAX_LENGTH = 128
#: Values of each ColBERT vector (BGE-M3's equals its hidden size).
COLBERT_DIM = HIDDEN_SIZE
#: The sparse head's weight std: token weights of a few units, about half of them > 0.
SPARSE_STD = 0.3
#: XLM-RoBERTa's special tokens, in its ID order, then the mask token.
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


@functools.cache
def _unigram_tokenizer_json() -> str:
    """A Unigram (sentencepiece-style) tokenizer trained on fortunes; its ``tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers.processors import TemplateProcessing

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    texts = fortune_texts(400, seed=1234, max_chars=10_000)
    tok.train_from_iterator(
        texts,
        trainers.UnigramTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=list(SPECIALS),
            unk_token="<unk>",
            show_progress=False,
        ),
    )
    tok.post_processor = TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tok.to_str()


def make_bge_m3(path: str | Path, *, seed: int = 0, heads: bool = True) -> Path:
    """A BGE-M3-style folder (the module docstring's layout).

    Args:
        path: the folder (created).
        seed: ``torch.manual_seed`` of the encoder's and the heads' weights.
        heads: write ``colbert_linear.pt`` and ``sparse_linear.pt`` (False: the encoder
            alone, a plain embedding folder).
    """
    import torch
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    backend = Tokenizer.from_str(_unigram_tokenizer_json())
    assert [backend.token_to_id(t) for t in SPECIALS[:4]] == [0, 1, 2, 3]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=BGE_M3_MAX_LENGTH,
        padding_side="right",
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    fast.save_pretrained(path)
    config_path = path / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text(encoding="utf-8"))
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
    config = XLMRobertaConfig(
        vocab_size=backend.get_vocab_size(),
        hidden_size=HIDDEN_SIZE,
        num_attention_heads=NUM_HEADS,
        num_hidden_layers=NUM_LAYERS,
        intermediate_size=INTERMEDIATE_SIZE,
        max_position_embeddings=BGE_M3_MAX_LENGTH + 2,
        initializer_range=INIT_STD,
        type_vocab_size=1,
        position_embedding_type="absolute",  # BAAI/bge-m3 states it; vLLM reads it
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        dtype="float32",
    )
    config.architectures = ["XLMRobertaModel"]
    torch.manual_seed(seed)
    model = XLMRobertaModel(config)
    model.save_pretrained(path)
    if heads:
        colbert = torch.nn.Linear(HIDDEN_SIZE, COLBERT_DIM)
        sparse = torch.nn.Linear(HIDDEN_SIZE, 1)
        with torch.no_grad():  # weights of either sign over a text's tokens: some kept
            sparse.weight.normal_(0.0, SPARSE_STD)
            sparse.bias.zero_()
        torch.save(colbert.state_dict(), path / "colbert_linear.pt")
        torch.save(sparse.state_dict(), path / "sparse_linear.pt")
    return path


@dataclass(frozen=True)
class Reference:
    """FlagEmbedding's outputs of a batch of texts.

    Attributes:
        token_ids: per text its token IDs (the tokenizer's, truncated to the budget).
        dense: float32 ``[n, hidden]``.
        sparse: per text ``{token ID: weight}``.
        colbert: per text float32 ``[tokens - 1, COLBERT_DIM]``.
    """

    token_ids: list[list[int]]
    dense: np.ndarray
    sparse: list[dict[int, float]]
    colbert: list[np.ndarray]


def bge_m3_reference(path: Path, texts: Sequence[str]) -> Reference:
    """FlagEmbedding's dense, sparse and ColBERT outputs of ``texts`` on ``path``'s weights."""
    import torch
    from transformers import AutoTokenizer, XLMRobertaModel

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = XLMRobertaModel.from_pretrained(str(path)).eval()
    colbert_linear = torch.nn.Linear(HIDDEN_SIZE, COLBERT_DIM)
    colbert_linear.load_state_dict(torch.load(path / "colbert_linear.pt", weights_only=True))
    sparse_linear = torch.nn.Linear(HIDDEN_SIZE, 1)
    sparse_linear.load_state_dict(torch.load(path / "sparse_linear.pt", weights_only=True))
    batch = tokenizer(
        list(texts),
        padding=True,
        truncation=True,
        max_length=BGE_M3_MAX_LENGTH,
        return_tensors="pt",
    )
    unused = {
        tokenizer.cls_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        tokenizer.unk_token_id,
    }
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
        dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)
        token_weights = torch.relu(sparse_linear(hidden)).squeeze(-1)
        colbert = colbert_linear(hidden[:, 1:]) * batch["attention_mask"][:, 1:][:, :, None]
        colbert = torch.nn.functional.normalize(colbert, dim=-1)
    ids_out, sparse_out, colbert_out = [], [], []
    for row, weights, mask, vectors in zip(
        batch["input_ids"], token_weights, batch["attention_mask"], colbert, strict=True
    ):
        n = int(mask.sum())
        ids = [int(i) for i in row[:n]]
        result: dict[int, float] = {}
        for w, idx in zip(weights[:n].tolist(), ids, strict=True):
            if idx not in unused and w > 0 and w > result.get(idx, 0.0):
                result[idx] = w
        ids_out.append(ids)
        sparse_out.append(result)
        colbert_out.append(vectors[: n - 1].numpy().astype(np.float32))
    return Reference(ids_out, dense.numpy().astype(np.float32), sparse_out, colbert_out)
