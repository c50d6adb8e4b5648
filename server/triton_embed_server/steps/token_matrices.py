"""The cap on the token matrices one multi-vector response carries, and its message.

Plain Python, no Triton: the token encoder step calls :func:`check_response_size` on each
request before any engine work (docs/sparse.md, "Multi-vector": the cap's arithmetic).
"""

from __future__ import annotations

from collections.abc import Sequence

from triton_embed.serving_limits import token_matrix_bytes

from triton_embed_server.steps.errors import TooMuchWorkError


def check_response_size(
    tokens_per_text: Sequence[int],
    dim: int,
    cap_bytes: int,
    step: str = "token encoder",
    rows: str = "tokens",
) -> int:
    """The bytes of a request's token matrices, ``4 x tokens x dim`` over its texts.

    Args:
        tokens_per_text: each text's token count (rows of its matrix).
        dim: values per token vector.
        cap_bytes: the most one response may carry (``max_response_bytes``).
        step: the step whose parameter the cap is, for the message.
        rows: what the rows are called in the message (the hybrid encoder passes its
            ColBERT rows, ``tokens - 1`` per text, as ``tokens_per_text``).

    Returns:
        The response's matrix bytes (at most ``cap_bytes``).

    Raises:
        TooMuchWorkError: over the cap (names the bytes, the cap, the arithmetic, what to do).
    """
    tokens = sum(tokens_per_text)
    size = token_matrix_bytes(tokens, dim)
    if size > cap_bytes:
        texts = len(tokens_per_text)
        fits = cap_bytes // token_matrix_bytes(1, dim)
        raise TooMuchWorkError(
            f"the request's {texts} texts come to {tokens} {rows}: their token vectors are "
            f"{size} bytes (4 x {tokens} {rows} x {dim} values), over the cap of {cap_bytes} "
            f"bytes per response (the {step}'s max_response_bytes: {fits} {rows} of "
            f"this model); send fewer or shorter texts per request"
        )
    return size
