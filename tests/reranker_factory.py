"""Tiny seeded rerankers built offline at test time, and their reference scores.

No reranker checkpoint ships in a package, so the tests make small ones with random weights
(the tokenizers of :mod:`tests.model_factory`, trained on Debian's fortunes) and compare the
server with the reference implementation on the same weights:

* :func:`make_bert_cross_encoder`: ``BertForSequenceClassification`` (one label) saved by
  sentence-transformers' ``CrossEncoder.save``, segment embeddings scaled up so that a
  pair scored without segment ids gets another score; reference ``CrossEncoder.predict``.
* :func:`make_qwen3_reranker`: a ``Qwen3ForCausalLM`` with single ``yes``/``no`` tokens;
  reference :func:`qwen3_reference_scores`, the Qwen3-Reranker model card's recipe with
  ``transformers``.

Shapes: hidden size 128, 2 heads of 64, 2 layers (:mod:`tests.model_factory`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tests.model_factory import (
    HEAD_DIM,
    HIDDEN_SIZE,
    INIT_STD,
    INTERMEDIATE_SIZE,
    MAX_POSITIONS,
    NUM_HEADS,
    NUM_LAYERS,
    _save_tokenizer,
)

#: Segment embeddings x this: a pair scored with all-zero segment ids differs by ~0.1.
TOKEN_TYPE_SCALE = 20.0
#: The cross-encoder's token budget per pair (CrossEncoder ``max_length``).
CROSS_ENCODER_MAX_LENGTH = 128


def _shape() -> dict:
    return {
        "hidden_size": HIDDEN_SIZE,
        "num_attention_heads": NUM_HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "intermediate_size": INTERMEDIATE_SIZE,
        "max_position_embeddings": MAX_POSITIONS,
        "initializer_range": INIT_STD,
    }


def make_bert_cross_encoder(
    path: str | Path,
    *,
    seed: int = 0,
    identity: bool = False,
    max_length: int = CROSS_ENCODER_MAX_LENGTH,
) -> Path:
    """A BERT cross-encoder folder as ``CrossEncoder.save`` writes it.

    Args:
        path: the folder (created).
        seed: ``torch.manual_seed`` of the weights.
        identity: store ``activation_fn`` Identity (raw logits by default) instead of the
            default sigmoid; sentence-transformers 5 writes it in
            ``config_sentence_transformers.json`` only.
        max_length: the CrossEncoder's ``max_length`` (saved as the tokenizer's
            ``model_max_length``).
    """
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import BertConfig, BertForSequenceClassification

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    ids = _save_tokenizer(path, "wordpiece")
    _as_bert_tokenizer(path)
    config = BertConfig(**_shape(), type_vocab_size=2, num_labels=1, dtype="float32", **ids)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.bert.embeddings.token_type_embeddings.weight.mul_(TOKEN_TYPE_SCALE)
        model.classifier.bias.normal_(0.0, 0.5)
    model.save_pretrained(path)
    activation = torch.nn.Identity() if identity else torch.nn.Sigmoid()
    CrossEncoder(str(path), max_length=max_length, activation_fn=activation).save(str(path))
    return path


def _as_bert_tokenizer(path: Path) -> None:
    """Save the folder's tokenizer as ``BertTokenizerFast``, as real BERT checkpoints have it.

    Its ``model_input_names`` hold ``token_type_ids``, so ``CrossEncoder`` feeds the model
    segment ids, as it does for a real BERT cross-encoder (the generic fast tokenizer
    returns none, and the reference would score every pair as segment 0).
    """
    from tokenizers import Tokenizer
    from transformers import BertTokenizerFast

    from tests.model_factory import BERT_SPECIAL_TOKENS, MAX_POSITIONS

    backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    BertTokenizerFast(
        tokenizer_object=backend, model_max_length=MAX_POSITIONS, **BERT_SPECIAL_TOKENS
    ).save_pretrained(path)


def cross_encoder_scores(
    path: Path, pairs: Sequence[tuple[str, str]], raw: bool = False
) -> np.ndarray:
    """``CrossEncoder.predict`` of ``pairs`` (float32 ``[n]``): the reference."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(path), device="cpu")
    kwargs = {"activation_fn": torch.nn.Identity()} if raw else {}
    scores = model.predict(list(pairs), batch_size=32, show_progress_bar=False, **kwargs)
    return np.asarray(scores, dtype=np.float32).reshape(-1)


def make_qwen3_reranker(path: str | Path, *, seed: int = 0) -> Path:
    """A Qwen3-Reranker-shaped causal LM: byte-level BPE with single ``yes``/``no`` tokens."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    ids = _save_tokenizer(path, "bpe")
    ids["vocab_size"] = _add_answer_tokens(path)
    config = Qwen3Config(
        **_shape(),
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        tie_word_embeddings=True,
        dtype="float32",
        **ids,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


def _add_answer_tokens(path: Path) -> int:
    """Give the tokenizer single ``yes``/``no`` tokens (Qwen's have them); its new size.

    The fortunes-trained BPE may lack ``yes`` as one token; it is added as a whole-word
    token, which the reference and the server read from the same ``tokenizer.json``.
    """
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    missing = [t for t in ("yes", "no") if tok.convert_tokens_to_ids(t) in (None, tok.unk_token_id)]
    if missing:
        tok.add_tokens([AddedToken(t, single_word=True, normalized=False) for t in missing])
        tok.save_pretrained(path)
    return len(tok)


def qwen3_reference_scores(
    path: Path,
    pairs: Sequence[tuple[str, str]],
    max_length: int,
    instruction: str | None = None,
) -> np.ndarray:
    """The Qwen3-Reranker model card's scores (float32 ``[n]``), with ``transformers``.

    ``prefix + tokenizer(pair, truncation, max_length - len(prefix) - len(suffix)) +
    suffix``, then ``softmax([logit(no), logit(yes)])[1]`` of the last token. The card's
    tokenizer adds no special tokens; the tiny BPE's post-processor would add an end-of-text
    token, so it is asked for none, as the real one adds none.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from triton_embed_server.models.reranker_spec import QWEN3_TEMPLATE as t

    tok = AutoTokenizer.from_pretrained(path)
    prefix = tok.encode(t.prefix, add_special_tokens=False)
    suffix = tok.encode(t.suffix, add_special_tokens=False)
    room = max_length - len(prefix) - len(suffix)
    yes, no = tok.convert_tokens_to_ids(t.yes), tok.convert_tokens_to_ids(t.no)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for query, document in pairs:
            body = tok.encode(t.pair(query, document, instruction), add_special_tokens=False)
            ids = prefix + body[:room] + suffix
            last = model(torch.tensor([ids])).logits[0, -1]
            out.append(torch.softmax(torch.stack([last[no], last[yes]]), 0)[1].item())
    return np.asarray(out, dtype=np.float32)
