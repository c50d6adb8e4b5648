"""The wire formats shared by the server models and the client: one module, one place.

Two payloads travel as elements of Triton ``BYTES`` (``TYPE_STRING``) tensors:

* **Embeddings** (``embed`` ensemble output ``EMBEDDING``): element ``i`` is the raw
  little-endian IEEE-754 float32 vector of text ``i``, exactly ``4 * dim`` bytes, no header.
  A request's ``embedding_type`` option selects a compact encoding instead
  (:class:`~triton_embed.options.EmbeddingType`): ``float16`` (``2 * dim`` bytes,
  little-endian half precision) or ``ubinary`` (``ceil(dim / 8)`` bytes of packed sign bits).
  On gRPC, Triton frames each BYTES element as a 4-byte little-endian length followed by the
  payload (KServe v2 ``raw_output_contents``), so the client reads the floats without any
  text parsing.
* **Token IDs** (``tokenizer`` -> ``embedder``): element ``i`` is the little-endian int32 token
  IDs of text ``i``, ``4 * num_tokens`` bytes. Texts are not padded to a common length, so
  the dynamic batcher can merge requests with texts of any length.
* **Sparse vectors** (a sparse ensemble's ``SPARSE``, docs/sparse.md): element ``i`` is text
  ``i``'s ``k`` non-zero vocabulary indices as little-endian int32, ascending, then their
  ``k`` weights as little-endian float32: ``8 * k`` bytes (``k`` may be 0).
* **Token matrices** (a multi-vector ensemble's ``TOKEN_EMBEDDINGS``): element ``i`` is text
  ``i``'s ``[tokens, dim]`` float32 matrix, little-endian, row-major: ``4 * tokens * dim``
  bytes; ``dim`` is the model's, ``tokens`` the text's ``NUM_TOKENS``.
* **Windows** (``tokenizer`` ``WINDOWS`` -> ``embedder``): element ``i`` is little-endian int32
  triples ``(tokens, skip, weight)``, one per window of text ``i``'s token IDs: the window's
  length, the leading tokens pooling leaves out, and its weight in the text's mean. One
  window unless the request asked for ``truncation=CHUNK``.

On the wire of a gRPC response (``raw_output_contents``, KServe v2's binary framing) a
``BYTES`` output of ``n`` elements is each element's 4-byte little-endian length followed by
its bytes (:func:`frame_bytes`, :func:`bytes_elements`: zero-copy views), an ``INT32``
output ``4 x n`` bytes of little-endian int32 (:func:`int32_values`), and an ``FP32`` output
(a reranker's ``SCORE``) ``4 x n`` bytes of little-endian float32 (:func:`float32_values`).

BYTES elements must be built as ``numpy`` arrays of ``dtype=object`` holding ``bytes``:
a ``numpy.bytes_`` array strips trailing ``0x00`` bytes, which corrupts any vector whose
last float has a zero low byte (``0.0`` for one).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np

from triton_embed.options import EmbeddingType

FLOAT32_LE = np.dtype("<f4")
FLOAT16_LE = np.dtype("<f2")
INT32_LE = np.dtype("<i4")
_LENGTH = struct.Struct("<I")


def _pack(rows: Iterable[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """Encode each row as one little-endian bytes element of an object array ``[n]``."""
    out = [np.ascontiguousarray(row, dtype=dtype).tobytes() for row in rows]
    arr = np.empty(len(out), dtype=object)
    arr[:] = out
    return arr


def encode_embeddings(vectors: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """Encode vectors as little-endian float32 BYTES elements.

    Args:
        vectors: float array ``[n, dim]`` (any float dtype; converted to float32), or a
            sequence of ``n`` 1-D vectors.

    Returns:
        ``object`` array ``[n]``; element ``i`` is ``bytes`` of length ``4 * dim``.
    """
    return _pack(vectors, FLOAT32_LE)


def encode_typed_embeddings(vectors: np.ndarray, embedding_type: EmbeddingType) -> np.ndarray:
    """Encode float vectors ``[n, dim]`` as BYTES elements of ``embedding_type``.

    Returns:
        ``object`` array ``[n]``; element ``i`` is
        ``embedding_type.element_bytes(dim)`` bytes (see :class:`EmbeddingType`).
    """
    if embedding_type is EmbeddingType.FLOAT16:
        return _pack(vectors, FLOAT16_LE)
    if embedding_type is EmbeddingType.UBINARY:
        return _pack(np.packbits(np.asarray(vectors) > 0, axis=-1), np.dtype(np.uint8))
    return _pack(vectors, FLOAT32_LE)


def decode_embeddings(
    elements: Iterable[bytes | memoryview],
    dim: int | None = None,
    embedding_type: EmbeddingType | str = EmbeddingType.FLOAT32,
) -> np.ndarray:
    """Decode BYTES elements of one embedding type into a matrix.

    Args:
        elements: ``n`` payloads (as returned by ``tritonclient``'s ``as_numpy`` on a BYTES
            output, flattened, or the views of :func:`bytes_elements`), each
            ``embedding_type.element_bytes(dim)`` bytes.
        dim: expected dimension; inferred from the first element when ``None`` (for
            ``ubinary``: ``8 x`` its bytes, since the padding bits cannot be told apart).
        embedding_type: how the elements were encoded (``float32`` by default).

    Returns:
        ``float32``: float32 ``[n, dim]``; ``float16``: float16 ``[n, dim]``; ``ubinary``:
        uint8 ``[n, ceil(dim / 8)]``, the packed bits as sent (``np.unpackbits(x, axis=-1,
        count=dim)`` gives the bits). Native byte order.

    Raises:
        ValueError: an element's length is not what ``dim`` needs (names the element and
            lengths).
    """
    kind = EmbeddingType.parse(embedding_type)
    itemsize = {EmbeddingType.FLOAT32: 4, EmbeddingType.FLOAT16: 2, EmbeddingType.UBINARY: 1}
    dtype = {
        EmbeddingType.FLOAT32: FLOAT32_LE,
        EmbeddingType.FLOAT16: FLOAT16_LE,
        EmbeddingType.UBINARY: np.dtype(np.uint8),
    }[kind]
    payloads = [e if isinstance(e, (bytes, memoryview)) else bytes(e) for e in elements]
    width = itemsize[kind]
    if not payloads:
        return np.zeros((0, kind.element_bytes(dim or 0) // width), dtype=dtype.newbyteorder("="))
    if dim is None:
        if len(payloads[0]) % width:
            raise ValueError(
                f"embedding 0 has {len(payloads[0])} bytes, not a multiple of {width} "
                f"({kind.value})"
            )
        dim = len(payloads[0]) // width * (8 if kind is EmbeddingType.UBINARY else 1)
    want = kind.element_bytes(dim)
    for i, p in enumerate(payloads):
        if len(p) != want:
            raise ValueError(
                f"embedding {i} has {len(p)} bytes; expected {want} ({kind.value}, dim {dim})"
            )
    flat = np.frombuffer(b"".join(payloads), dtype=dtype)
    return flat.reshape(len(payloads), want // width).astype(dtype.newbyteorder("="), copy=False)


def encode_token_ids(token_ids: Iterable[Sequence[int]]) -> np.ndarray:
    """Encode per-text token ID lists as little-endian int32 BYTES elements.

    Args:
        token_ids: ``n`` sequences of token IDs (each ``0 <= id < 2**31``).

    Returns:
        ``object`` array ``[n]``; element ``i`` is ``4 * len(token_ids[i])`` bytes.
    """
    return _pack(token_ids, INT32_LE)


def decode_token_ids(element: bytes) -> list[int]:
    """Decode one little-endian int32 BYTES element into a list of token IDs.

    Args:
        element: one payload of ``4 * num_tokens`` bytes.

    Returns:
        ``num_tokens`` Python ``int`` token IDs, in order.

    Raises:
        ValueError: the payload length is not a multiple of 4.
    """
    payload = bytes(element)
    if len(payload) % 4:
        raise ValueError(f"token-ID payload has {len(payload)} bytes, not a multiple of 4 (int32)")
    return np.frombuffer(payload, dtype=INT32_LE).tolist()


def encode_sparse(
    indices: Sequence[np.ndarray | Sequence[int]], values: Sequence[np.ndarray | Sequence[float]]
) -> np.ndarray:
    """Encode per-text sparse vectors as ``SPARSE`` BYTES elements (indices, then weights).

    Args:
        indices: ``n`` sequences of vocabulary indices, each ascending (int32 range).
        values: ``n`` sequences of weights, as long as the matching ``indices``.

    Returns:
        ``object`` array ``[n]``; element ``i`` is ``8 * len(indices[i])`` bytes.

    Raises:
        ValueError: a text's indices and weights differ in length.
    """
    out = []
    for i, (idx, val) in enumerate(zip(indices, values, strict=True)):
        idx = np.ascontiguousarray(idx, dtype=INT32_LE)
        val = np.ascontiguousarray(val, dtype=FLOAT32_LE)
        if idx.shape != val.shape or idx.ndim != 1:
            raise ValueError(f"text {i}: {idx.size} indices and {val.size} weights")
        out.append(idx.tobytes() + val.tobytes())
    arr = np.empty(len(out), dtype=object)
    arr[:] = out
    return arr


def decode_sparse(element: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
    """Decode one ``SPARSE`` element: ``(indices int32 [k], weights float32 [k])``.

    Raises:
        ValueError: the payload is not a whole number of (int32, float32) pairs.
    """
    payload = bytes(element)
    if len(payload) % 8:
        raise ValueError(
            f"sparse payload has {len(payload)} bytes, not a multiple of 8 (int32 index and "
            "float32 weight per entry)"
        )
    k = len(payload) // 8
    indices = np.frombuffer(payload, dtype=INT32_LE, count=k).astype(np.int32, copy=False)
    weights = np.frombuffer(payload, dtype=FLOAT32_LE, count=k, offset=4 * k)
    return indices, weights.astype(np.float32, copy=False)


def encode_token_matrices(matrices: Iterable[np.ndarray]) -> np.ndarray:
    """Encode per-text ``[tokens, dim]`` matrices as ``TOKEN_EMBEDDINGS`` BYTES elements.

    Returns:
        ``object`` array ``[n]``; element ``i`` is ``4 * tokens_i * dim`` bytes (float32 LE,
        row-major).
    """
    return _pack(matrices, FLOAT32_LE)


def decode_token_matrix(element: bytes | memoryview, dim: int) -> np.ndarray:
    """Decode one ``TOKEN_EMBEDDINGS`` element into float32 ``[tokens, dim]``.

    Raises:
        ValueError: the payload is not a whole number of ``dim``-value float32 rows.
    """
    payload = bytes(element)
    if dim < 1 or len(payload) % (4 * dim):
        raise ValueError(
            f"token-matrix payload has {len(payload)} bytes, not whole rows of {dim} float32"
        )
    return np.frombuffer(payload, dtype=FLOAT32_LE).reshape(-1, dim).astype(np.float32)


def decode_token_matrices(
    elements: Sequence[bytes | memoryview], num_tokens: Sequence[int]
) -> list[np.ndarray]:
    """Decode a response's ``TOKEN_EMBEDDINGS`` elements with their ``NUM_TOKENS`` rows.

    The dimension is not sent: it is each element's ``bytes / (4 x rows)``, the same for every
    element with rows (an element of 0 rows is ``[0, dim]`` of the others' ``dim``, ``[0, 0]``
    when no element has rows).

    Returns:
        Per element float32 ``[num_tokens[i], dim]``.

    Raises:
        ValueError: the counts differ from the elements, an element is not whole rows, or
            the elements' dimensions differ.
    """
    if len(elements) != len(num_tokens):
        raise ValueError(f"{len(elements)} token matrices for {len(num_tokens)} token counts")
    dims = {
        len(bytes(e)) // (4 * int(n)) for e, n in zip(elements, num_tokens, strict=True) if int(n)
    }
    if len(dims) > 1:
        raise ValueError(f"token matrices of different dimensions: {sorted(dims)}")
    dim = dims.pop() if dims else 0
    out = []
    for element, rows in zip(elements, num_tokens, strict=True):
        if not int(rows):
            if len(bytes(element)):
                raise ValueError(f"a token matrix of 0 rows has {len(bytes(element))} bytes")
            out.append(np.zeros((0, dim), np.float32))
            continue
        matrix = decode_token_matrix(element, dim)
        if matrix.shape[0] != int(rows):
            raise ValueError(f"a token matrix has {matrix.shape[0]} rows; NUM_TOKENS says {rows}")
        out.append(matrix)
    return out


def encode_windows(windows: Iterable[Sequence[tuple[int, int, int]]]) -> np.ndarray:
    """Encode per-text window triples ``(tokens, skip, weight)`` as int32 BYTES elements.

    Returns:
        ``object`` array ``[n]``; element ``i`` is ``12 * len(windows[i])`` bytes.
    """
    return _pack(([x for w in text for x in w] for text in windows), INT32_LE)


def decode_windows(element: bytes) -> list[tuple[int, int, int]]:
    """Decode one ``WINDOWS`` element into its ``(tokens, skip, weight)`` triples.

    Raises:
        ValueError: the payload is empty or not whole int32 triples.
    """
    payload = bytes(element)
    if not payload or len(payload) % 12:
        raise ValueError(
            f"windows payload has {len(payload)} bytes; expected one or more int32 triples "
            "(12 bytes each)"
        )
    values = np.frombuffer(payload, dtype=INT32_LE).reshape(-1, 3).tolist()
    return [(a, b, c) for a, b, c in values]


def frame_bytes(elements: Iterable[bytes | memoryview]) -> bytes:
    """``elements`` in KServe v2's binary ``BYTES`` framing (length-prefixed, concatenated)."""
    return b"".join(_LENGTH.pack(len(e)) + bytes(e) for e in elements)


def bytes_elements(raw: bytes, count: int) -> list[memoryview]:
    """The ``count`` payloads of a raw ``BYTES`` output, as views into ``raw`` (no copy).

    Raises:
        ValueError: ``raw`` does not hold exactly ``count`` framed elements.
    """
    view = memoryview(raw)
    out: list[memoryview] = []
    offset = 0
    for _ in range(count):
        if offset + 4 > len(view):
            break
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        out.append(view[offset : offset + length])
        offset += length
    if len(out) != count or offset != len(view):
        raise ValueError(
            f"a BYTES output of {len(view)} bytes does not hold {count} framed elements"
        )
    return out


def int32_values(raw: bytes, count: int) -> np.ndarray:
    """A raw ``INT32`` output as int32 ``[count]`` (native byte order).

    Raises:
        ValueError: ``raw`` is not ``4 x count`` bytes.
    """
    if len(raw) != 4 * count:
        raise ValueError(f"an INT32 output of {len(raw)} bytes does not hold {count} values")
    return np.frombuffer(raw, dtype=INT32_LE).astype(np.int32, copy=False)


def float32_values(raw: bytes, count: int) -> np.ndarray:
    """A raw ``FP32`` output (the reranker's ``SCORE``) as float32 ``[count]`` (native order).

    KServe v2's binary form of an ``FP32`` tensor is ``4 x count`` bytes of little-endian
    IEEE-754 float32, one value per element.

    Raises:
        ValueError: ``raw`` is not ``4 x count`` bytes.
    """
    if len(raw) != 4 * count:
        raise ValueError(f"an FP32 output of {len(raw)} bytes does not hold {count} values")
    return np.frombuffer(raw, dtype=FLOAT32_LE).astype(np.float32, copy=False)
