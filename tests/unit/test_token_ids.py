"""token_ids: decoding a request's TOKEN_IDS and rejecting IDs the engine must never see."""

from __future__ import annotations

import struct

import pytest
from triton_embed_server.steps.errors import InvalidTokenIdsError, TooMuchWorkError
from triton_embed_server.steps.token_ids import decode_request_token_ids, validate_token_ids

VOCAB = 30522


def test_validate_accepts_good_ids():
    assert validate_token_ids([101, 0, VOCAB - 1, 102], 0, VOCAB, 256) is None
    assert validate_token_ids([1] * 256, 0, VOCAB, 256) is None


def test_validate_empty():
    with pytest.raises(InvalidTokenIdsError) as info:
        validate_token_ids([], 4, VOCAB, 256)
    assert str(info.value) == "text 4 has no token IDs; send at least one token"


def test_validate_too_long():
    with pytest.raises(InvalidTokenIdsError) as info:
        validate_token_ids([1] * 257, 2, VOCAB, 256)
    msg = str(info.value)
    assert msg.startswith("text 2 has 257 token IDs; the model accepts 256")


def test_validate_id_equal_to_vocab_size():
    with pytest.raises(InvalidTokenIdsError) as info:
        validate_token_ids([101, 5, VOCAB, 102], 1, VOCAB, 256)
    msg = str(info.value)
    assert msg.startswith(f"text 1 has token ID {VOCAB} at position 2, outside the vocabulary")
    assert f"[0, {VOCAB})" in msg


def test_validate_negative_id():
    with pytest.raises(InvalidTokenIdsError) as info:
        validate_token_ids([101, 7, 8, -1, 102], 0, VOCAB, 256)
    assert str(info.value).startswith("text 0 has token ID -1 at position 3, outside")


def test_validate_reports_first_bad_position():
    with pytest.raises(InvalidTokenIdsError, match=r"token ID 99999 at position 1,"):
        validate_token_ids([1, 99999, -5], 0, VOCAB, 256)


def pack(ids):
    return struct.pack(f"<{len(ids)}i", *ids)


def test_decode_request_token_ids():
    payloads = [pack([101, 7592, 102]), pack([101, 0, 102])]
    ids, windows = decode_request_token_ids(payloads, VOCAB, 256)
    assert ids == [[101, 7592, 102], [101, 0, 102]]
    assert windows == [[(3, 0, 3)], [(3, 0, 3)]]


def test_decode_request_empty_request():
    assert decode_request_token_ids([], VOCAB, 256) == ([], [])


def test_decode_request_bad_length_names_text():
    with pytest.raises(InvalidTokenIdsError) as info:
        decode_request_token_ids([pack([1]), pack([1, 2]) + b"\x00"], VOCAB, 256)
    msg = str(info.value)
    assert msg.startswith("text 1: ")
    assert "9 bytes" in msg
    assert "multiple of 4" in msg


def test_decode_request_empty_payload():
    with pytest.raises(InvalidTokenIdsError, match="text 1 has no token IDs"):
        decode_request_token_ids([pack([1]), b""], VOCAB, 256)


def test_decode_request_out_of_vocab_and_too_long():
    with pytest.raises(InvalidTokenIdsError, match=r"text 0 has token ID 30522 at position 0"):
        decode_request_token_ids([pack([VOCAB])], VOCAB, 256)
    with pytest.raises(InvalidTokenIdsError, match=r"text 2 has 5 token IDs; the model accepts 4"):
        decode_request_token_ids([pack([1]), pack([1, 2]), pack([1] * 5)], VOCAB, 4)
    with pytest.raises(InvalidTokenIdsError, match=r"token ID -2147483648 at position 1"):
        decode_request_token_ids([pack([1, -(2**31)])], VOCAB, 256)


# ---- the embedder's work bounds (issue 20, item 3) -----------------------------------------


def _windows(n_windows: int, tokens: int = 256) -> tuple[bytes, bytes]:
    """One text of ``n_windows`` windows of ``tokens`` IDs each: (TOKEN_IDS, WINDOWS)."""
    ids = ([101] + [1000] * (tokens - 2) + [102]) * n_windows
    triples = struct.pack(f"<{3 * n_windows}i", *([tokens, 0, tokens - 2] * n_windows))
    return struct.pack(f"<{len(ids)}i", *ids), triples


def test_more_windows_than_max_chunks_are_refused_naming_the_limit():
    good, good_w = _windows(16)
    bad, bad_w = _windows(64)  # the hostile request of issue 20: 64 windows x 256 IDs
    ids, windows = decode_request_token_ids([good], 30522, 256, [good_w], max_chunks=16)
    assert len(windows[0]) == 16
    with pytest.raises(TooMuchWorkError) as info:
        decode_request_token_ids([good, bad], 30522, 256, [good_w, bad_w], max_chunks=16)
    assert str(info.value) == (
        "text 1 has 64 windows, over the limit of 16 per text (the embedder's max_chunks, as "
        "the tokenizer's truncation=CHUNK); send at most 16 windows of up to 256 token IDs per "
        "text"
    )
    assert info.value.code == "INVALID_ARG" and info.value.reason == "too_much_work"


def test_more_token_ids_than_the_request_budget_are_refused_before_decoding():
    payload, windows = _windows(16)  # 4,096 IDs
    decode_request_token_ids([payload] * 2, 30522, 256, [windows] * 2, 16, 8192)
    with pytest.raises(TooMuchWorkError) as info:
        # the third payload is not even int32: the budget is checked from the sizes first
        decode_request_token_ids([payload, payload, b"\x01"], 30522, 256, None, 16, 8191)
    assert str(info.value) == (
        "the request has 8192 token IDs, over the embedder's budget of 8191 per request "
        "(parameter max_request_tokens); send fewer texts or windows per request"
    )
