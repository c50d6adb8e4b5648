"""The ``embedder``'s input check: decode each text's ``TOKEN_IDS`` and reject bad IDs.

The engine must never see an empty sequence, one longer than the model accepts, or an ID
outside the vocabulary; each such text fails its request with a message naming the text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from triton_embed_server.errors import InvalidTokenIdsError


def validate_token_ids(
    token_ids: Sequence[int], index: int, vocab_size: int, max_length: int
) -> None:
    """Reject token IDs the engine must never see.

    Args:
        token_ids: one text's token IDs.
        index: the text's position in its request (named in the error).
        vocab_size: the model's vocabulary size; IDs must be in ``[0, vocab_size)``.
        max_length: the most token IDs the model accepts.

    Raises:
        InvalidTokenIdsError: empty, longer than ``max_length``, or an ID outside
            ``[0, vocab_size)`` (names the text index, the position and the limit).
    """
    n = len(token_ids)
    if n == 0:
        raise InvalidTokenIdsError(f"text {index} has no token IDs; send at least one token")
    if n > max_length:
        raise InvalidTokenIdsError(
            f"text {index} has {n} token IDs; the model accepts {max_length}; truncate it "
            "(the tokenizer step does this with truncation=END or START)"
        )
    arr = np.asarray(token_ids)
    bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
    if bad.size:
        pos = int(bad[0])
        raise InvalidTokenIdsError(
            f"text {index} has token ID {int(arr[pos])} at position {pos}, outside the "
            f"vocabulary [0, {vocab_size}); send IDs from this model's tokenizer"
        )


def decode_request_token_ids(
    payloads: Sequence[bytes], vocab_size: int, max_length: int
) -> list[list[int]]:
    """Decode and validate one request's ``TOKEN_IDS`` elements (little-endian int32).

    Args:
        payloads: one ``TOKEN_IDS`` element per text.
        vocab_size: see :func:`validate_token_ids`.
        max_length: see :func:`validate_token_ids`.

    Returns:
        Per text, its token IDs.

    Raises:
        InvalidTokenIdsError: a payload is not whole int32 values, or fails
            :func:`validate_token_ids`.
    """
    from triton_embed.codec import decode_token_ids

    out = []
    for i, payload in enumerate(payloads):
        try:
            ids = decode_token_ids(payload)
        except ValueError as exc:
            raise InvalidTokenIdsError(f"text {i}: {exc}") from None
        validate_token_ids(ids, i, vocab_size, max_length)
        out.append(ids)
    return out
