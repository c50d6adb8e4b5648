"""Serving limits that the steps and the callers of the ensemble share.

The tokenizer and embedder steps size their default token budget per request from these
(:mod:`triton_embed_server.steps.config` imports them); the transport's model catalog
(:mod:`triton_embed.transport.catalog`) computes the same default for a step whose config
does not state ``max_request_tokens``. One definition, so both agree.
"""

from __future__ import annotations

#: Texts in one request of the ``embed`` ensemble at most (its shipped and rendered
#: ``max_batch_size``): the embedder's default token budget per request is derived from it.
REQUEST_TEXTS = 64
#: The stated cap of the default token budget per request: the longest batch one embedder
#: replica is sized to run within its queue timeout (the embedder config's queue policy:
#: 256 texts x 256 tokens = 65,536 tokens at 3,500 tokens/s = 18.7 s, under 30 s).
REQUEST_TOKENS_CAP = 65_536
#: Characters of a query or document a reranker's pair tokenizer keeps per token of its
#: budget (its default ``max_chars`` = 16 x ``max_length``; the gateway cuts documents there
#: too when truncation is on). A quarter of the embedder's cap (64): a pair is cut to
#: ``max_length`` tokens anyway, English prose takes 4-5 characters per token, and two texts
#: per pair at 64 would make the tokenizer's shared-memory region 16 MiB for a 512-token
#: model (64 pairs x 2 x 4 bytes x 32,768 characters) where 16 keeps it at 4 MiB
#: (:mod:`triton_embed_server.host.shm.sizing`).
PAIR_CHARS_PER_TOKEN = 16


def request_token_budget(texts: int, max_length: int, max_chunks: int) -> int:
    """The default token budget of one request, all its texts and windows together.

    ``min(texts x max_length x max_chunks, REQUEST_TOKENS_CAP)``: the most tokens a request
    of ``texts`` texts can carry when every text is cut into the most windows
    ``truncation=CHUNK`` allows (64 x 256 x 16 = 262,144 for the shipped model), capped at
    :data:`REQUEST_TOKENS_CAP` (65,536: a full request of un-chunked texts, 64 x 256 =
    16,384 tokens, always fits; OpenAI caps a request at 300,000). The parameter
    ``max_request_tokens`` of both steps sets another budget.

    Args:
        texts: texts per request (``max_batch_size``; at least 1 is counted).
        max_length: tokens per text (per window with ``truncation=CHUNK``).
        max_chunks: windows per text with ``truncation=CHUNK``.

    Returns:
        The budget, tokens.
    """
    return min(max(1, texts) * max_length * max_chunks, REQUEST_TOKENS_CAP)


#: The default cap on the token matrices one response of a multi-vector model carries, bytes
#: (the token encoder's ``max_response_bytes``): ``4 x tokens x dim`` summed over a request's
#: texts. 16 MiB holds 64 texts of 512 tokens of a 128-value ColBERT vector (64 x 512 x 128 x
#: 4 = 16 MiB exactly), or 42 texts of 256 tokens of a 384-value hidden state; it bounds the
#: step's shared-memory region as the sparse bound does (docs/sparse.md).
TOKEN_MATRIX_BYTES = 16 * 2**20


def token_matrix_bytes(tokens: int, dim: int) -> int:
    """Bytes of float32 token vectors: ``4 x tokens x dim`` (the cap's arithmetic)."""
    return 4 * tokens * dim


def texts_within_cap(most: int, max_length: int | None, dim: int | None, cap: int) -> int:
    """``most``, or fewer (at least 1): texts whose full-length token matrices fit ``cap`` bytes.

    ``max(1, min(most, cap // (4 x max_length x dim)))``; ``most`` when a length is ``None``.
    """
    if dim is None or max_length is None:
        return most
    return max(1, min(most, cap // token_matrix_bytes(max_length, dim)))
