"""Wire codec: little-endian float32 embeddings and int32 token IDs as BYTES elements."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from triton_embed import codec
from triton_embed.codec import (
    decode_embeddings,
    decode_token_ids,
    encode_embeddings,
    encode_token_ids,
)


def assert_bit_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == np.float32 and b.dtype == np.float32
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


# --- embeddings: encoding layout ---------------------------------------------------------


def test_encoded_elements_are_object_array_of_bytes_of_4_dim():
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    enc = encode_embeddings(vectors)
    assert enc.dtype == np.dtype(object)
    assert enc.shape == (3,)
    for element in enc:
        assert type(element) is bytes
        assert len(element) == 16


def test_encoded_element_is_little_endian_float32():
    values = [1.0, -2.5, 3.1415927, 1e-30, 0.0]
    enc = encode_embeddings(np.array([values], dtype=np.float32))
    assert enc[0] == b"".join(struct.pack("<f", v) for v in values)
    assert enc[0] == struct.pack("<5f", *values)
    # 1.0f is 0x3F800000: little-endian puts the low byte first.
    assert encode_embeddings(np.array([[1.0]], dtype=np.float32))[0] == b"\x00\x00\x80\x3f"


def test_trailing_zero_bytes_are_kept():
    # The last float is 0.0, so the element ends in four 0x00 bytes; a numpy bytes_ array
    # would strip them.
    vectors = np.array([[0.5, 0.0], [0.0, 0.0]], dtype=np.float32)
    enc = encode_embeddings(vectors)
    assert enc[0] == struct.pack("<2f", 0.5, 0.0)
    assert enc[0].endswith(b"\x00\x00\x00\x00")
    assert len(enc[0]) == 8
    assert enc[1] == b"\x00" * 8
    assert_bit_equal(decode_embeddings(enc), vectors)


def test_all_zero_vectors_round_trip():
    vectors = np.zeros((5, 384), dtype=np.float32)
    enc = encode_embeddings(vectors)
    assert all(len(e) == 4 * 384 for e in enc)
    out = decode_embeddings(enc)
    assert out.shape == (5, 384)
    assert_bit_equal(out, vectors)


def test_negative_zero_round_trips_bit_exact():
    vectors = np.array([[-0.0, 0.0, -0.0]], dtype=np.float32)
    out = decode_embeddings(encode_embeddings(vectors))
    assert out.view(np.uint32).tolist() == [[0x80000000, 0, 0x80000000]]


@pytest.mark.parametrize("dim", [1, 3, 383, 384])
def test_round_trip_odd_and_common_dims(dim):
    rng = np.random.default_rng(dim)
    vectors = rng.standard_normal((7, dim)).astype(np.float32)
    vectors[:, -1] = 0.0  # every element ends in 0x00 bytes
    enc = encode_embeddings(vectors)
    assert [len(e) for e in enc] == [4 * dim] * 7
    out = decode_embeddings(enc)
    assert out.shape == (7, dim)
    assert_bit_equal(out, vectors)
    # An explicit dim decodes the same.
    assert_bit_equal(decode_embeddings(enc, dim=dim), vectors)


def test_big_batch_round_trip():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((1000, 384)).astype(np.float32)
    enc = encode_embeddings(vectors)
    assert enc.shape == (1000,)
    assert enc.dtype == np.dtype(object)
    assert {len(e) for e in enc} == {1536}
    out = decode_embeddings(enc)
    assert_bit_equal(out, vectors)
    # Rows stay in order.
    assert enc[999] == vectors[999].astype("<f4").tobytes()


def test_special_values_round_trip_bit_exact():
    bits = np.array(
        [0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC00123, 0x00000001, 0x7F7FFFFF, 0x80000001],
        dtype=np.uint32,
    )
    vectors = bits.view(np.float32).reshape(1, -1)
    out = decode_embeddings(encode_embeddings(vectors))
    assert out.view(np.uint32).tolist() == [bits.tolist()]


def test_big_endian_input_is_written_little_endian():
    values = np.array([[1.0, -2.0, 0.25], [3.5, 0.0, -0.0]])
    big = values.astype(">f4")
    enc = encode_embeddings(big)
    assert enc[0] == struct.pack("<3f", 1.0, -2.0, 0.25)
    assert enc[1] == struct.pack("<3f", 3.5, 0.0, -0.0)
    out = decode_embeddings(enc)
    assert out.dtype == np.float32
    assert_bit_equal(out, values.astype(np.float32))


def test_float64_input_converted_to_float32():
    rng = np.random.default_rng(1)
    values = rng.standard_normal((4, 10))  # float64
    enc = encode_embeddings(values)
    assert [len(e) for e in enc] == [40] * 4
    assert_bit_equal(decode_embeddings(enc), values.astype(np.float32))


def test_float16_input_converted_to_float32():
    values = np.array([[0.5, -1.25, 65504.0, 0.0]], dtype=np.float16)
    enc = encode_embeddings(values)
    assert enc[0] == struct.pack("<4f", 0.5, -1.25, 65504.0, 0.0)
    assert_bit_equal(decode_embeddings(enc), values.astype(np.float32))


def test_sequence_of_1d_vectors():
    rows = [np.array([1.0, 2.0], dtype=np.float32), np.array([3.0, 4.0], dtype=np.float64)]
    enc = encode_embeddings(rows)
    assert enc.dtype == np.dtype(object)
    assert list(enc) == [struct.pack("<2f", 1.0, 2.0), struct.pack("<2f", 3.0, 4.0)]


def test_non_contiguous_input():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[:, ::2]  # strided columns
    enc = encode_embeddings(view)
    assert enc[1] == struct.pack("<3f", 6.0, 8.0, 10.0)
    assert_bit_equal(decode_embeddings(enc), np.ascontiguousarray(view))


def test_encode_empty_batch():
    enc = encode_embeddings(np.zeros((0, 384), dtype=np.float32))
    assert enc.dtype == np.dtype(object)
    assert enc.shape == (0,)


# --- embeddings: decoding ----------------------------------------------------------------


def test_decode_output_is_native_float32_writable_shape():
    enc = encode_embeddings(np.ones((2, 3), dtype=np.float32))
    out = decode_embeddings(enc)
    assert out.dtype == np.dtype(np.float32)
    assert out.dtype.isnative
    assert out.shape == (2, 3)
    assert out.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]


def test_decode_accepts_numpy_object_array_and_bytearray_and_memoryview():
    payload = struct.pack("<2f", 1.5, -0.0)
    arr = np.empty(3, dtype=object)
    arr[:] = [payload, bytearray(payload), memoryview(payload)]
    out = decode_embeddings(arr)
    assert out.view(np.uint32).tolist() == [[0x3FC00000, 0x80000000]] * 3


def test_decode_empty_list():
    out = decode_embeddings([])
    assert out.shape == (0, 0)
    assert out.dtype == np.float32
    out = decode_embeddings([], dim=384)
    assert out.shape == (0, 384)
    assert out.dtype == np.float32


def test_decode_error_names_element_and_lengths():
    good = struct.pack("<3f", 1.0, 2.0, 3.0)
    with pytest.raises(ValueError) as info:
        decode_embeddings([good, good, good[:8]])
    msg = str(info.value)
    assert "embedding 2" in msg
    assert "8 bytes" in msg
    assert "expected 12" in msg
    assert "dim 3" in msg


def test_decode_error_with_explicit_dim():
    good = struct.pack("<3f", 1.0, 2.0, 3.0)
    with pytest.raises(ValueError) as info:
        decode_embeddings([good], dim=4)
    msg = str(info.value)
    assert "embedding 0" in msg
    assert "12 bytes" in msg
    assert "expected 16" in msg


def test_decode_longer_element_is_an_error():
    with pytest.raises(ValueError, match=r"embedding 1 has 16 bytes; expected 12"):
        decode_embeddings([b"\x00" * 12, b"\x00" * 16])


def test_decode_first_element_not_multiple_of_4():
    with pytest.raises(ValueError) as info:
        decode_embeddings([b"\x00" * 7])
    msg = str(info.value)
    assert "embedding 0" in msg
    assert "7 bytes" in msg
    assert "multiple of 4" in msg


# --- token IDs ---------------------------------------------------------------------------


def test_token_ids_round_trip_and_layout():
    ids = [[101, 7592, 2088, 102], [101, 102], [5, 0], []]
    enc = encode_token_ids(ids)
    assert enc.dtype == np.dtype(object)
    assert enc.shape == (4,)
    assert [len(e) for e in enc] == [16, 8, 8, 0]
    assert enc[0] == struct.pack("<4i", 101, 7592, 2088, 102)
    assert enc[2] == struct.pack("<2i", 5, 0)
    assert enc[2].endswith(b"\x00\x00\x00\x00")
    assert enc[3] == b""
    assert [decode_token_ids(e) for e in enc] == ids


def test_token_ids_decode_returns_python_ints():
    out = decode_token_ids(struct.pack("<3i", 0, 2**31 - 1, 30521))
    assert out == [0, 2**31 - 1, 30521]
    assert all(type(v) is int for v in out)


def test_token_ids_from_numpy_rows():
    rows = np.array([[1, 2, 3], [4, 5, 0]], dtype=np.int64)
    enc = encode_token_ids(rows)
    assert list(enc) == [struct.pack("<3i", 1, 2, 3), struct.pack("<3i", 4, 5, 0)]


def test_token_ids_empty_payload():
    assert decode_token_ids(b"") == []
    assert encode_token_ids([]).shape == (0,)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_token_ids_payload_not_multiple_of_4(n):
    with pytest.raises(ValueError) as info:
        decode_token_ids(b"\x01" * n)
    assert f"{n} bytes" in str(info.value)
    assert "multiple of 4" in str(info.value)


# --- properties --------------------------------------------------------------------------

float32_matrices = hnp.arrays(
    dtype=np.float32,
    shape=st.tuples(st.integers(1, 20), st.integers(1, 50)),
    elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
)


@settings(max_examples=150, deadline=None)
@given(float32_matrices)
def test_property_embedding_round_trip_bit_exact(vectors):
    enc = encode_embeddings(vectors)
    assert enc.dtype == np.dtype(object)
    assert [len(e) for e in enc] == [4 * vectors.shape[1]] * vectors.shape[0]
    assert_bit_equal(decode_embeddings(enc), vectors)
    assert_bit_equal(decode_embeddings(enc, dim=vectors.shape[1]), vectors)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=40))
def test_property_embedding_matches_struct(values):
    enc = encode_embeddings(np.array([values], dtype=np.float32))
    assert enc[0] == struct.pack(f"<{len(values)}f", *values)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40), max_size=10))
def test_property_token_ids_round_trip(ids):
    enc = encode_token_ids(ids)
    assert enc.dtype == np.dtype(object)
    assert enc.shape == (len(ids),)
    for element, row in zip(enc, ids, strict=True):
        assert element == struct.pack(f"<{len(row)}i", *row)
        assert decode_token_ids(element) == row


# ---- sparse vectors and token matrices (docs/sparse.md) ------------------------------------


def test_sparse_round_trip_keeps_order_zero_weights_and_empty_texts():
    indices = [np.array([0, 7, 30521], dtype=np.int64), np.array([], dtype=np.int32)]
    weights = [np.array([0.0, 1.5, 3.25e-8], dtype=np.float64), np.array([])]
    elements = codec.encode_sparse(indices, weights)
    assert elements.dtype == object and [len(e) for e in elements] == [24, 0]
    for element, idx, val in zip(elements, indices, weights, strict=True):
        got_idx, got_val = codec.decode_sparse(element)
        assert got_idx.dtype == np.int32 and got_val.dtype == np.float32
        np.testing.assert_array_equal(got_idx, idx)
        np.testing.assert_array_equal(got_val, val.astype(np.float32))
    # little-endian on the wire: indices first, then weights
    assert elements[0][:4] == (0).to_bytes(4, "little")
    assert elements[0][12:16] == np.float32(0.0).tobytes()


def test_sparse_refuses_mismatched_or_broken_payloads():
    with pytest.raises(ValueError, match="text 0: 2 indices and 1 weights"):
        codec.encode_sparse([[1, 2]], [[0.5]])
    with pytest.raises(ValueError, match="not a multiple of 8"):
        codec.decode_sparse(b"\x00" * 12)


def test_token_matrix_round_trip_with_trailing_zero_bytes():
    matrix = np.zeros((3, 5), dtype=np.float32)
    matrix[1, 2] = -1.25
    (element,) = codec.encode_token_matrices([matrix])
    assert isinstance(element, bytes) and len(element) == 4 * 3 * 5  # trailing zeros kept
    np.testing.assert_array_equal(codec.decode_token_matrix(element, 5), matrix)
    with pytest.raises(ValueError, match="not whole rows of 4 float32"):
        codec.decode_token_matrix(element, 4)
