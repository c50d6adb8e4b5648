"""Tiny random-weight sentence-transformers model folders, built offline at test time.

Each maker writes a complete Hugging Face model folder (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``) plus the sentence-transformers files that say
how to pool (``modules.json``, ``sentence_bert_config.json``, ``1_Pooling/config.json``,
``config_sentence_transformers.json``), so that sentence-transformers and vLLM can both load
the same folder and be compared. Nothing is downloaded: the tokenizers are trained on Debian's
fortunes (``/usr/share/games/fortunes``) and the weights are drawn from a seeded generator, so
the same call writes the same folder every time (a few seconds on 2 cores).

    from tests.model_factory import make_decoder_embedder, fortune_texts

    folder = make_decoder_embedder(tmp_path / "qwen3", arch="qwen3", matryoshka_dimensions=[32, 64])
    texts = fortune_texts(8)

Shapes shared by all models: hidden size 128, 2 attention heads of head size 64 (vLLM's CPU
attention supports 64, not every size), 2 layers, intermediate size 256, 512 positions,
vocabulary of about 2000 tokens.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from triton_embed.corpus import read_fortunes

HIDDEN_SIZE = 128
NUM_HEADS = 2
HEAD_DIM = 64
NUM_LAYERS = 2
INTERMEDIATE_SIZE = 256
MAX_POSITIONS = 512
VOCAB_SIZE = 2000
# Standard deviation of the random weights. Larger than the usual 0.02 so that two layers of
# random attention mix the context into every position: with 0.02 the BERT CLS vectors of
# different texts are parallel (cosine 0.999+) and a cosine check could not tell them apart.
INIT_STD = 0.2

EOS_TOKEN = "<|endoftext|>"
BERT_SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}

# Instruction-style query prompt and empty document prompt (Qwen3-Embedding style).
DECODER_PROMPTS = {
    "query": "Instruct: Given a question, retrieve passages that answer it\nQuery: ",
    "document": "",
}
# Short role prefixes (e5 / bge style).
ENCODER_PROMPTS = {"query": "query: ", "document": "passage: "}
# An INSTRUCTOR-style instruction, meant to be left out of the mean (include_prompt=False).
MEAN_ENCODER_PROMPTS = {"query": "Represent the question for retrieval: ", "document": ""}

_ARCHS = {
    # arch: (model_type, extra config keys)
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"head_dim": HEAD_DIM}),
    "llama": ("llama", {"head_dim": HEAD_DIM}),
}

# sentence-transformers' 1_Pooling/config.json keys (the format vLLM and older releases read).
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}

_TokenizerKind = Literal["bpe", "wordpiece"]
_TRAIN_TEXTS = 400
_TRAIN_SEED = 1234


@dataclass(frozen=True)
class _Pooling:
    """What goes into the sentence-transformers files."""

    mode: Literal["cls", "mean", "lasttoken"]
    include_prompt: bool
    normalize: bool
    prompts: dict[str, str] | None
    default_prompt_name: str | None
    max_seq_length: int


@functools.lru_cache(maxsize=1)
def _all_fortunes() -> tuple[str, ...]:
    return tuple(text for _, text in read_fortunes())


def fortune_texts(n: int, seed: int = 0, max_chars: int = 150) -> list[str]:
    """``n`` different real fortune texts of at most ``max_chars`` characters, in a seeded order.

    With the default 150 characters (about 10 000 texts to draw from) every text, even behind
    the longest prompt, fits the models' 128 tokens untruncated. The same
    ``(n, seed, max_chars)`` always gives the same list; texts may span several lines.
    """
    pool = sorted(set(t for t in _all_fortunes() if len(t) <= max_chars))
    if n > len(pool):
        raise ValueError(f"only {len(pool)} fortunes of at most {max_chars} characters")
    return random.Random(seed).sample(pool, n)


@functools.cache
def _trained_tokenizer_json(kind: _TokenizerKind) -> str:
    """Train the tokenizer of ``kind`` on a fixed sample of fortunes; its ``tokenizer.json``.

    ``bpe``: byte-level BPE as GPT-2 / Qwen / Llama 3; every single sequence ends with
    ``<|endoftext|>``, the token last-token pooling pools on (as Qwen3-Embedding does).
    ``wordpiece``: lower-casing WordPiece as BERT uncased, ``[CLS] text [SEP]``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers.processors import TemplateProcessing
    from transformers.models.qwen2.tokenization_qwen2 import (
        PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX,
    )

    texts = fortune_texts(_TRAIN_TEXTS, seed=_TRAIN_SEED, max_chars=10_000)
    if kind == "bpe":
        specials = [EOS_TOKEN]
        tok = Tokenizer(models.BPE())
        # transformers rebuilds a ``qwen2`` folder's tokenizer as Qwen2Tokenizer, which puts
        # its own normalizer and pre-tokenizer in place of tokenizer.json's: use the same
        # ones, so that every loader splits text alike.
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        tok.train_from_iterator(
            texts,
            trainers.BpeTrainer(
                vocab_size=VOCAB_SIZE,
                special_tokens=specials,
                initial_alphabet=alphabet,
                show_progress=False,
            ),
        )
        single, pair = f"$A {EOS_TOKEN}", f"$A {EOS_TOKEN} $B:1 {EOS_TOKEN}:1"
    else:
        specials = list(BERT_SPECIAL_TOKENS.values())
        normalizer = normalizers.BertNormalizer(lowercase=True)
        # tokenizers' WordPieceTrainer numbers its "##" pieces in hash-map order, so its
        # vocabulary changes from one process to the next. Plain BPE training is
        # deterministic: train that on the same words and take every piece in both forms,
        # word-initial and "##" continuation.
        bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
        bpe.normalizer = normalizer
        bpe.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        bpe.train_from_iterator(
            texts,
            trainers.BpeTrainer(
                vocab_size=VOCAB_SIZE // 2, special_tokens=specials, show_progress=False
            ),
        )
        pieces = [t for t, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])]
        pieces = [t for t in pieces if t not in specials]
        vocab = specials + pieces + ["##" + t for t in pieces]
        tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
        tok.normalizer = normalizer
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        single, pair = "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1"
    tok.post_processor = TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, tok.token_to_id(t)) for t in specials]
    )
    return tok.to_str()


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _write_sentence_transformers_files(path: Path, pooling: _Pooling) -> None:
    """modules.json, sentence_bert_config.json, 1_Pooling/config.json and the prompts."""
    modules = ["Transformer", "Pooling"] + (["Normalize"] if pooling.normalize else [])
    folders = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize"}
    _write_json(
        path / "modules.json",
        [
            {
                "idx": i,
                "name": str(i),
                "path": folders[m],
                "type": f"sentence_transformers.models.{m}",
            }
            for i, m in enumerate(modules)
        ],
    )
    _write_json(
        path / "sentence_bert_config.json",
        # The WordPiece tokenizer lower-cases by itself (as all-MiniLM-L6-v2's does).
        {"max_seq_length": pooling.max_seq_length, "do_lower_case": False},
    )
    pool_cfg: dict[str, object] = {"word_embedding_dimension": HIDDEN_SIZE}
    pool_cfg.update({key: mode == pooling.mode for key, mode in _LEGACY_POOLING_KEYS.items()})
    pool_cfg["include_prompt"] = pooling.include_prompt
    _write_json(path / "1_Pooling" / "config.json", pool_cfg)
    if pooling.normalize:
        (path / "2_Normalize").mkdir(exist_ok=True)
    st_cfg: dict[str, object] = {
        "model_type": "SentenceTransformer",
        "prompts": pooling.prompts or {},
        "default_prompt_name": pooling.default_prompt_name,
        "similarity_fn_name": "cosine",
    }
    _write_json(path / "config_sentence_transformers.json", st_cfg)


def _save_tokenizer(path: Path, kind: _TokenizerKind) -> dict[str, int]:
    """Write tokenizer.json + tokenizer_config.json; the config's special-token ids."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(_trained_tokenizer_json(kind))
    if kind == "bpe":
        specials = {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN}
    else:
        specials = dict(BERT_SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=MAX_POSITIONS, padding_side="right", **specials
    )
    fast.save_pretrained(path)
    # transformers 5 writes its own class name (TokenizersBackend); older releases know the
    # class by its classic name.
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    _write_json(config_path, config)
    ids = {"vocab_size": backend.get_vocab_size(), "pad_token_id": fast.pad_token_id}
    if kind == "bpe":
        ids["eos_token_id"] = fast.eos_token_id
    return ids


def _build(
    path: str | Path,
    *,
    config: dict,
    tokenizer: _TokenizerKind,
    pooling: _Pooling | None,
    seed: int,
) -> Path:
    """Write tokenizer, config, weights and (when ``pooling``) the sentence-transformers files."""
    import torch
    from transformers import AutoConfig, AutoModel

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    token_ids = _save_tokenizer(path, tokenizer)
    config = dict(config)
    hf_config = AutoConfig.for_model(
        config.pop("model_type"),
        hidden_size=HIDDEN_SIZE,
        num_attention_heads=NUM_HEADS,
        num_hidden_layers=NUM_LAYERS,
        intermediate_size=INTERMEDIATE_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_STD,
        dtype="float32",
        **token_ids,
        **config,
    )
    torch.manual_seed(seed)
    model = AutoModel.from_config(hf_config, dtype=torch.float32)
    if tokenizer == "wordpiece":
        # Every token has token type 0, so its embedding is one shared offset that pulls all
        # pooled vectors together (CLS vectors of different texts at cosine ~0.87); shrunk,
        # they sit near 0.5.
        with torch.no_grad():
            model.embeddings.token_type_embeddings.weight.mul_(0.1)
    model.save_pretrained(path)
    if pooling is not None:
        _write_sentence_transformers_files(path, pooling)
    return path


def make_decoder_embedder(
    path: str | Path,
    *,
    arch: Literal["qwen2", "qwen3", "llama"] = "qwen2",
    prompts: bool = True,
    default_prompt_name: str | None = None,
    normalize: bool = True,
    matryoshka_dimensions: list[int] | None = None,
    max_seq_length: int = 128,
    sentence_transformers_files: bool = True,
    seed: int = 0,
) -> Path:
    """A Qwen3-Embedding-like decoder embedder: last-token pooling on ``<|endoftext|>``.

    The folder holds:

    - ``config.json``: architecture ``Qwen2Model`` / ``Qwen3Model`` / ``LlamaModel`` (vLLM
      serves a ``*Model`` as an embedding model), 1 key/value head (grouped-query attention),
      float32; with ``matryoshka_dimensions`` also ``matryoshka_dimensions`` and
      ``is_matryoshka: true``, which vLLM reads to accept ``dimensions``.
    - ``model.safetensors``: random weights from ``torch.manual_seed(seed)``.
    - ``tokenizer.json`` + ``tokenizer_config.json``: byte-level BPE trained on fortunes; every
      single sequence ends with ``<|endoftext|>``, which is also the pad and eos token (right
      padding).
    - unless ``sentence_transformers_files=False``: ``modules.json`` (Transformer, Pooling and,
      when ``normalize``, Normalize), ``sentence_bert_config.json`` (``max_seq_length``),
      ``1_Pooling/config.json`` (``pooling_mode_lasttoken``, ``include_prompt: true``) and
      ``config_sentence_transformers.json`` (:data:`DECODER_PROMPTS` when ``prompts``, and
      ``default_prompt_name``).
    """
    if arch not in _ARCHS:
        raise ValueError(f"arch must be one of {sorted(_ARCHS)}, not {arch!r}")
    model_type, extra = _ARCHS[arch]
    config: dict = {"model_type": model_type, "num_key_value_heads": 1, **extra}
    if matryoshka_dimensions:
        config.update(matryoshka_dimensions=list(matryoshka_dimensions), is_matryoshka=True)
    pooling = None
    if sentence_transformers_files:
        pooling = _Pooling(
            mode="lasttoken",
            include_prompt=True,
            normalize=normalize,
            prompts=dict(DECODER_PROMPTS) if prompts else None,
            default_prompt_name=default_prompt_name,
            max_seq_length=max_seq_length,
        )
    return _build(
        path,
        config=config,
        tokenizer="bpe",
        pooling=pooling,
        seed=seed,
    )


def _make_bert(
    path: str | Path,
    *,
    mode: Literal["cls", "mean"],
    include_prompt: bool,
    normalize: bool,
    prompts: dict[str, str] | None,
    seed: int,
) -> Path:
    """A WordPiece BERT encoder pooled by ``mode``: ``max_seq_length`` 128, no default prompt."""
    pooling = _Pooling(
        mode, include_prompt, normalize, prompts, default_prompt_name=None, max_seq_length=128
    )
    return _build(
        path,
        config={"model_type": "bert"},
        tokenizer="wordpiece",
        pooling=pooling,
        seed=seed,
    )


def make_cls_encoder(
    path: str | Path, *, prompts: bool = True, normalize: bool = True, seed: int = 0
) -> Path:
    """A bge / e5-like BERT encoder: CLS pooling, ``query: `` / ``passage: `` prompts.

    The folder holds ``config.json`` (``BertModel``), ``model.safetensors`` (random weights
    from ``torch.manual_seed(seed)``), a lower-casing WordPiece tokenizer trained on fortunes
    (``[CLS] text [SEP]``), ``modules.json`` (Transformer, Pooling and, when ``normalize``,
    Normalize), ``sentence_bert_config.json`` (``max_seq_length`` 128),
    ``1_Pooling/config.json`` (``pooling_mode_cls_token``) and
    ``config_sentence_transformers.json`` (:data:`ENCODER_PROMPTS` when ``prompts``, no
    default prompt).
    """
    return _make_bert(
        path,
        mode="cls",
        include_prompt=True,
        normalize=normalize,
        prompts=dict(ENCODER_PROMPTS) if prompts else None,
        seed=seed,
    )


def make_mean_encoder(
    path: str | Path, *, include_prompt: bool = False, normalize: bool = False, seed: int = 0
) -> Path:
    """An INSTRUCTOR-like BERT encoder: mean pooling, optionally without the prompt's tokens.

    As :func:`make_cls_encoder`, but ``1_Pooling/config.json`` says ``pooling_mode_mean_tokens``
    and ``include_prompt`` as given (``False``: sentence-transformers leaves the prompt's tokens
    out of the mean; vLLM ignores the key and always averages every token), the prompts are
    :data:`MEAN_ENCODER_PROMPTS`, and there is no Normalize module unless ``normalize``.
    """
    return _make_bert(
        path,
        mode="mean",
        include_prompt=include_prompt,
        normalize=normalize,
        prompts=dict(MEAN_ENCODER_PROMPTS),
        seed=seed,
    )
