"""The wire formats shared by the server models and the client: one module, one place.

Two payloads travel as elements of Triton ``BYTES`` (``TYPE_STRING``) tensors:

* **Embeddings** (``embed`` ensemble output ``EMBEDDING``): element ``i`` is the raw
  little-endian IEEE-754 float32 vector of text ``i``, exactly ``4 * dim`` bytes, no header.
  On gRPC, Triton frames each BYTES element as a 4-byte little-endian length followed by the
  payload (KServe v2 ``raw_output_contents``), so the client reads the floats without any
  text parsing.
* **Token IDs** (``tokenizer`` -> ``embedder``): element ``i`` is the little-endian int32 token
  IDs of text ``i``, ``4 * num_tokens`` bytes. Texts are not padded to a common length, so
  the dynamic batcher can merge requests with texts of any length.

BYTES elements must be built as ``numpy`` arrays of ``dtype=object`` holding ``bytes``:
a ``numpy.bytes_`` array strips trailing ``0x00`` bytes, which corrupts any vector whose
last float has a zero low byte (``0.0`` for one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

FLOAT32_LE = np.dtype("<f4")
INT32_LE = np.dtype("<i4")


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


def decode_embeddings(elements: Iterable[bytes], dim: int | None = None) -> np.ndarray:
    """Decode little-endian float32 BYTES elements into a matrix.

    Args:
        elements: ``n`` payloads, each ``4 * dim`` bytes (as returned by
            ``tritonclient``'s ``as_numpy`` on a BYTES output, flattened).
        dim: expected dimension; inferred from the first element when ``None``.

    Returns:
        float32 array ``[n, dim]`` in native byte order.

    Raises:
        ValueError: an element's length is not ``4 * dim`` (names the element and lengths).
    """
    payloads = [bytes(e) for e in elements]
    if not payloads:
        return np.zeros((0, dim or 0), dtype=np.float32)
    if dim is None:
        if len(payloads[0]) % 4:
            raise ValueError(
                f"embedding 0 has {len(payloads[0])} bytes, not a multiple of 4 (float32)"
            )
        dim = len(payloads[0]) // 4
    want = 4 * dim
    for i, p in enumerate(payloads):
        if len(p) != want:
            raise ValueError(f"embedding {i} has {len(p)} bytes; expected {want} (4 x dim {dim})")
    flat = np.frombuffer(b"".join(payloads), dtype=FLOAT32_LE)
    return flat.reshape(len(payloads), dim).astype(np.float32, copy=False)


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
