"""The ``embedder``'s input check: decode each text's ``TOKEN_IDS`` and reject bad IDs.

The engine must never see an empty sequence, one longer than the model accepts, or an ID
outside the vocabulary; each such text fails its request with a message naming the text.
Nor more work than the tokenizer step could have asked for: at most ``max_chunks`` windows
per text and ``max_request_tokens`` token IDs per request (checked from the payload sizes,
before anything is decoded).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from triton_embed_server.steps.errors import InvalidTokenIdsError, TooMuchWorkError


def validate_token_ids(
    token_ids: Sequence[int], index: int, vocab_size: int, max_length: int, what: str = "text"
) -> None:
    """Reject token IDs the engine must never see.

    Args:
        token_ids: one text's token IDs.
        index: the text's position in its request (named in the error).
        vocab_size: the model's vocabulary size; IDs must be in ``[0, vocab_size)``.
        max_length: the most token IDs the model accepts.
        what: what one sequence is, in the message (``text``; ``pair`` for a reranker).

    Raises:
        InvalidTokenIdsError: empty, longer than ``max_length``, or an ID outside
            ``[0, vocab_size)`` (names the text index, the position and the limit).
    """
    n = len(token_ids)
    if n == 0:
        raise InvalidTokenIdsError(f"{what} {index} has no token IDs; send at least one token")
    if n > max_length:
        raise InvalidTokenIdsError(
            f"{what} {index} has {n} token IDs; the model accepts {max_length}; truncate it "
            "(the tokenizer step does this with truncation=END or START)"
        )
    check_vocabulary(token_ids, index, vocab_size, what)


def check_vocabulary(
    token_ids: Sequence[int] | np.ndarray, index: int, vocab_size: int, what: str = "text"
) -> None:
    """Reject an ID outside ``[0, vocab_size)`` (the engine's input, the decoder's).

    Raises:
        InvalidTokenIdsError: names the sequence's index, the ID, its position and the range.
    """
    arr = np.asarray(token_ids)
    bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
    if bad.size:
        pos = int(bad[0])
        raise InvalidTokenIdsError(
            f"{what} {index} has token ID {int(arr[pos])} at position {pos}, outside the "
            f"vocabulary [0, {vocab_size}); send IDs from this model's tokenizer"
        )


def check_request_tokens(
    payloads: Sequence[bytes], budget: int | None, step: str, items: str
) -> None:
    """Refuse a request of more than ``budget`` token IDs, from the payload sizes alone.

    Args:
        payloads: the request's ``TOKEN_IDS`` elements (4 bytes per ID).
        budget: the step's ``max_request_tokens`` (``None``: no limit).
        step: the step's name, in the message.
        items: what to send fewer of, in the message.

    Raises:
        TooMuchWorkError: names the count, the budget and what to do.
    """
    if budget is None:
        return
    total = sum(len(p) for p in payloads) // 4
    if total > budget:
        raise TooMuchWorkError(
            f"the request has {total} token IDs, over the {step}'s budget of {budget} per "
            f"request (parameter max_request_tokens); send fewer {items} per request"
        )


def decode_request_token_ids(
    payloads: Sequence[bytes],
    vocab_size: int,
    max_length: int,
    window_payloads: Sequence[bytes] | None = None,
    max_chunks: int | None = None,
    max_request_tokens: int | None = None,
    step: str = "embedder",
) -> tuple[list[list[int]], list[list[tuple[int, int, int]]]]:
    """Decode and validate one request's ``TOKEN_IDS`` (and ``WINDOWS``) elements.

    Args:
        payloads: one ``TOKEN_IDS`` element per text (little-endian int32).
        vocab_size: see :func:`validate_token_ids`.
        max_length: the most token IDs of one window (see :func:`validate_token_ids`).
        window_payloads: one ``WINDOWS`` element per text (int32 triples ``(tokens, skip,
            weight)``, :func:`triton_embed.codec.decode_windows`), or ``None``: each text
            is one window, pooled whole.
        max_chunks: the most windows of one text (``None``: no limit).
        max_request_tokens: the most token IDs of the whole request (``None``: no limit).
        step: the step's name in the budget's message (``embedder``, ``sparse_encoder``).

    Returns:
        Per text, its token IDs, and its windows.

    Raises:
        TooMuchWorkError: the request holds more than ``max_request_tokens`` token IDs, or
            a text more than ``max_chunks`` windows (names the limit).
        InvalidTokenIdsError: a payload is not whole int32 values, fails
            :func:`validate_token_ids`, or its windows do not tile its IDs (names the text).
    """
    from triton_embed.codec import decode_token_ids, decode_windows

    check_request_tokens(payloads, max_request_tokens, step, "texts or windows")
    if window_payloads is not None and len(window_payloads) != len(payloads):
        raise InvalidTokenIdsError(
            f"WINDOWS has {len(window_payloads)} elements for {len(payloads)} TOKEN_IDS "
            "elements; send one per text, or leave WINDOWS out"
        )
    out, out_windows = [], []
    for i, payload in enumerate(payloads):
        try:
            ids = decode_token_ids(payload)
            windows = (
                [(len(ids), 0, len(ids))]
                if window_payloads is None
                else decode_windows(window_payloads[i])
            )
        except ValueError as exc:
            raise InvalidTokenIdsError(f"text {i}: {exc}") from None
        if max_chunks is not None and len(windows) > max_chunks:
            raise TooMuchWorkError(
                f"text {i} has {len(windows)} windows, over the limit of {max_chunks} per text "
                "(the embedder's max_chunks, as the tokenizer's truncation=CHUNK); send at "
                f"most {max_chunks} windows of up to {max_length} token IDs per text"
            )
        if not ids:
            validate_token_ids(ids, i, vocab_size, max_length)  # raises: no token IDs
        _check_windows(windows, len(ids), i)
        start = 0
        for n, _, _ in windows:
            validate_token_ids(ids[start : start + n], i, vocab_size, max_length)
            start += n
        out.append(ids)
        out_windows.append(windows)
    return out, out_windows


def decode_pair_token_ids(
    payloads: Sequence[bytes],
    segment_starts: Sequence[int] | None,
    vocab_size: int,
    max_length: int,
    max_request_tokens: int | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Decode and validate one request's ``TOKEN_IDS`` and ``SEGMENT_START`` (a reranker's pairs).

    Args:
        payloads: one ``TOKEN_IDS`` element per pair (little-endian int32).
        segment_starts: one ``SEGMENT_START`` value per pair (the index of its first
            segment-1 token, 0 for none), or ``None``: every pair is segment 0.
        vocab_size: see :func:`validate_token_ids`.
        max_length: the most token IDs of one pair.
        max_request_tokens: the most token IDs of the whole request (``None``: no limit).

    Returns:
        Per pair, its token IDs, and its segment start.

    Raises:
        TooMuchWorkError: the request holds more than ``max_request_tokens`` token IDs.
        InvalidTokenIdsError: a payload is not whole int32 values, fails
            :func:`validate_token_ids`, or a segment start is outside ``[0, tokens)``, or
            ``SEGMENT_START`` has another count than ``TOKEN_IDS`` (names the pair).
    """
    from triton_embed.codec import decode_token_ids

    check_request_tokens(payloads, max_request_tokens, "scorer", "pairs")
    if segment_starts is not None and len(segment_starts) != len(payloads):
        raise InvalidTokenIdsError(
            f"SEGMENT_START has {len(segment_starts)} elements for {len(payloads)} TOKEN_IDS "
            "elements; send one per pair, or leave SEGMENT_START out"
        )
    out, starts = [], []
    for i, payload in enumerate(payloads):
        try:
            ids = decode_token_ids(payload)
        except ValueError as exc:
            raise InvalidTokenIdsError(f"pair {i}: {exc}") from None
        validate_token_ids(ids, i, vocab_size, max_length, what="pair")
        start = 0 if segment_starts is None else int(segment_starts[i])
        if not 0 <= start < len(ids):
            raise InvalidTokenIdsError(
                f"pair {i} has SEGMENT_START {start} outside its {len(ids)} token IDs; send "
                "the index of the document's first token, or 0 for no segment ids"
            )
        out.append(ids)
        starts.append(start)
    return out, starts


def _check_windows(windows: list[tuple[int, int, int]], total: int, index: int) -> None:
    if sum(n for n, _, _ in windows) != total:
        raise InvalidTokenIdsError(
            f"text {index}: its windows cover {sum(n for n, _, _ in windows)} tokens, but it "
            f"has {total} token IDs; the window lengths must add up to its IDs"
        )
    for n, skip, weight in windows:
        if n < 1 or not 0 <= skip < n or weight < 0:
            raise InvalidTokenIdsError(
                f"text {index}: window ({n}, {skip}, {weight}) is not (tokens >= 1, "
                "0 <= skip < tokens, weight >= 0)"
            )
