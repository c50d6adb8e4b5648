"""KServe v2 tensors on the gateway's gRPC calls: inputs built, raw outputs read.

The gateway sends ``BYTES`` inputs (``TEXT``: UTF-8 texts; ``TOKEN_IDS``: little-endian
int32 IDs, :func:`triton_embed.codec.encode_token_ids`) as ``[n, 1]`` tensors built from
numpy ``object`` arrays (a ``numpy.bytes_`` array strips trailing ``0x00`` bytes), and reads
outputs straight from the response's ``raw_output_contents``:

* a ``BYTES`` output is ``n`` elements, each a 4-byte little-endian length followed by that
  many bytes (KServe v2's binary framing, as Triton sends it over gRPC);
  :func:`bytes_elements` returns each payload as a zero-copy ``memoryview``;
* an ``INT32`` output is ``4 x n`` bytes of little-endian int32 (:func:`int32_values`).

``EMBEDDING`` elements are the server's little-endian float32 vectors, exactly as it
produced them: :func:`float32_matrix` views them as float32 ``[n, dim]`` without parsing text.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from triton_embed.codec import FLOAT32_LE, INT32_LE

_LENGTH = struct.Struct("<I")


def bytes_input(name: str, elements: Sequence[bytes]) -> Any:
    """A ``tritonclient.grpc.InferInput`` ``[n, 1]`` ``BYTES`` holding ``elements``."""
    from tritonclient.grpc import InferInput

    array = np.empty((len(elements), 1), dtype=object)
    array[:, 0] = elements
    tensor = InferInput(name, [len(elements), 1], "BYTES")
    tensor.set_data_from_numpy(array)
    return tensor


def frame_bytes(elements: Iterable[bytes]) -> bytes:
    """``elements`` in KServe v2's binary ``BYTES`` framing (length-prefixed, concatenated)."""
    return b"".join(_LENGTH.pack(len(e)) + bytes(e) for e in elements)


def raw_outputs(response: Any) -> dict[str, bytes]:
    """``{output name: raw bytes}`` of a ``ModelInferResponse`` (gRPC ``raw_output_contents``).

    Triton lists the outputs in its own order (``NUM_TOKENS`` may come before
    ``EMBEDDING``), so they are taken by name.
    """
    return {
        output.name: raw
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=False)
    }


def bytes_elements(raw: bytes, count: int) -> list[memoryview]:
    """The ``count`` payloads of a raw ``BYTES`` output, as views into ``raw``.

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


def float32_matrix(elements: Sequence[memoryview | bytes]) -> np.ndarray:
    """``EMBEDDING`` payloads as float32 ``[n, dim]``, C-contiguous, native byte order.

    Raises:
        ValueError: the payloads differ in length or are not whole float32 values.
    """
    if not elements:
        return np.zeros((0, 0), dtype=np.float32)
    width = len(elements[0])
    if width % 4 or any(len(e) != width for e in elements):
        raise ValueError(
            "the embeddings are not float32 vectors of one dimension "
            f"(element lengths {sorted({len(e) for e in elements})} bytes)"
        )
    flat = np.frombuffer(b"".join(elements), dtype=FLOAT32_LE)
    return flat.reshape(len(elements), width // 4).astype(np.float32, copy=False)


def output_names(outputs: Mapping[str, bytes], wanted: Sequence[str]) -> None:
    """Check that every ``wanted`` output is in ``outputs``.

    Raises:
        ValueError: one is missing (names it and those present).
    """
    missing = [name for name in wanted if name not in outputs]
    if missing:
        raise ValueError(
            f"the upstream's response lacks {', '.join(missing)} (it has "
            f"{', '.join(sorted(outputs)) or 'no outputs'})"
        )
