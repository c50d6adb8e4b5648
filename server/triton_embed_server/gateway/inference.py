"""Where the gateway calls the upstreams: split into pieces, send concurrently, reassemble.

A request's inputs (up to :data:`MAX_INPUTS`) are cut into pieces of the called model's
``max_batch_size`` (:func:`pieces`), sent concurrently (at most :data:`PIECES_IN_FLIGHT` at
once per request, so one large request does not fill an upstream's queue alone), each on
the upstream the pool chooses, and put back together in input order. A failed piece fails
the request with the error of :func:`~triton_embed_server.gateway.errors.from_upstream`,
naming a text by its index in the request's inputs.

* :func:`embed_texts`: the ensemble, ``TEXT`` -> ``EMBEDDING``, ``NUM_TOKENS``;
* :func:`embed_token_ids`: the ensemble's embedder step, ``TOKEN_IDS`` -> ``EMBEDDING``
  (``NUM_TOKENS`` is then the number of IDs of each input);
* :func:`tokenize`: the ensemble's tokenizer step, ``TEXT`` -> ``TOKEN_IDS``.

The HTTP routes call :func:`embed_texts` through
:class:`~triton_embed_server.gateway.merging.Merger`, which merges small concurrent requests
into one call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
from triton_embed.codec import decode_token_ids, encode_token_ids
from tritonclient.utils import InferenceServerException

from triton_embed_server.gateway import tensors
from triton_embed_server.gateway.catalog import Catalog, ModelInfo
from triton_embed_server.gateway.errors import UpstreamError, from_upstream

#: The most inputs one request may carry (OpenAI's limit for ``/v1/embeddings``).
MAX_INPUTS = 2048
#: Pieces of one request in flight at once.
PIECES_IN_FLIGHT = 16

T = TypeVar("T")


class Pool(Protocol):
    """What the gateway needs of its upstreams (:class:`~.upstreams.UpstreamPool`)."""

    catalog: Catalog

    def any_ready(self) -> bool:
        """Whether at least one upstream is ready."""

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Sequence[bytes]],
        outputs: Sequence[str],
        parameters: Mapping[str, Any] | None = None,
    ) -> dict[str, bytes]:
        """One call; ``{output name: raw bytes}``."""


@dataclass(frozen=True)
class Embeddings:
    """The vectors of a request's inputs, in input order.

    Attributes:
        elements: one ``EMBEDDING`` payload per input, exactly the server's bytes
            (little-endian float32 for the default ``embedding_type``).
        num_tokens: int32 ``[n]``, tokens the model read per input.
    """

    elements: list[memoryview]
    num_tokens: np.ndarray

    def matrix(self) -> np.ndarray:
        """The vectors as float32 ``[n, dim]`` (no text parsing: a view of the bytes)."""
        return tensors.float32_matrix(self.elements)


def pieces(count: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` spans that cut ``count`` inputs into pieces of at most ``size``.

    >>> pieces(5, 2)
    [(0, 2), (2, 4), (4, 5)]
    """
    if size < 1:
        raise ValueError(f"piece size must be >= 1, got {size}")
    return [(start, min(start + size, count)) for start in range(0, count, size)]


async def _each_piece(count: int, size: int, call: Callable[[int, int], Awaitable[T]]) -> list[T]:
    """``call(start, stop)`` for every piece, concurrently, results in input order.

    The first failure cancels the pieces still running and is raised.
    """
    spans = pieces(count, size)
    if len(spans) == 1:
        return [await call(*spans[0])]
    gate = asyncio.Semaphore(PIECES_IN_FLIGHT)

    async def one(start: int, stop: int) -> T:
        async with gate:
            return await call(start, stop)

    tasks = [asyncio.ensure_future(one(start, stop)) for start, stop in spans]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _call(
    pool: Pool,
    model: str,
    inputs: Mapping[str, Sequence[bytes]],
    outputs: Sequence[str],
    parameters: Mapping[str, Any] | None,
    start: int,
) -> dict[str, bytes]:
    """One piece's upstream call, its failure mapped to the gateway's errors."""
    size = len(next(iter(inputs.values())))
    try:
        raw = await pool.infer(model, inputs, outputs, parameters)
    except InferenceServerException as exc:
        raise from_upstream(exc, offset=start, size=size) from None
    try:
        tensors.output_names(raw, outputs)
    except ValueError as exc:
        raise UpstreamError(f"model {model!r} answered something unexpected: {exc}") from None
    return raw


def _embedding_elements(raw: bytes, count: int, model: str) -> list[memoryview]:
    try:
        return tensors.bytes_elements(raw, count)
    except ValueError as exc:
        raise UpstreamError(f"model {model!r} answered something unexpected: {exc}") from None


async def embed_texts(
    pool: Pool, model: ModelInfo, texts: Sequence[bytes], parameters: Mapping[str, Any]
) -> Embeddings:
    """Embed UTF-8 texts with the ensemble ``model``.

    Args:
        pool: the upstreams.
        model: the ensemble.
        texts: ``n`` UTF-8 payloads.
        parameters: the request parameters (``truncation``, ``input_type``, ...).

    Raises:
        GatewayError: a piece failed (the server's message; a text named by its index in
            ``texts``).
    """

    async def call(start: int, stop: int) -> tuple[list[memoryview], np.ndarray]:
        raw = await _call(
            pool,
            model.name,
            {"TEXT": texts[start:stop]},
            ("EMBEDDING", "NUM_TOKENS"),
            parameters,
            start,
        )
        count = stop - start
        try:
            num_tokens = tensors.int32_values(raw["NUM_TOKENS"], count)
        except ValueError as exc:
            raise UpstreamError(
                f"model {model.name!r} answered something unexpected: {exc}"
            ) from None
        return _embedding_elements(raw["EMBEDDING"], count, model.name), num_tokens

    results = await _each_piece(len(texts), model.max_batch_size, call)
    elements = [e for piece, _ in results for e in piece]
    return Embeddings(elements, np.concatenate([counts for _, counts in results]))


async def embed_token_ids(
    pool: Pool,
    model: ModelInfo,
    token_ids: Sequence[Sequence[int]],
    parameters: Mapping[str, Any],
) -> Embeddings:
    """Embed token-ID lists with the ensemble's embedder step (validated by the server).

    Args:
        pool: the upstreams.
        model: the ensemble (its :attr:`~ModelInfo.embedder` is called).
        token_ids: ``n`` lists of IDs, each ``0 <= id < 2**31``.
        parameters: the request parameters the embedder reads (``dimensions``).

    Raises:
        GatewayError: a piece failed (e.g. an ID outside the vocabulary: the server's
            message, naming the input by its index in ``token_ids``).
    """
    payloads = list(encode_token_ids(token_ids))

    async def call(start: int, stop: int) -> list[memoryview]:
        raw = await _call(
            pool, model.embedder, {"TOKEN_IDS": payloads[start:stop]}, ("EMBEDDING",),
            parameters, start,
        )  # fmt: skip
        return _embedding_elements(raw["EMBEDDING"], stop - start, model.embedder)

    results = await _each_piece(len(payloads), model.embedder_max_batch_size, call)
    counts = np.array([len(ids) for ids in token_ids], dtype=np.int32)
    return Embeddings([e for piece in results for e in piece], counts)


async def tokenize(
    pool: Pool, model: ModelInfo, texts: Sequence[bytes], parameters: Mapping[str, Any]
) -> list[list[int]]:
    """The token IDs the ensemble's tokenizer step makes of each text (special tokens included).

    Raises:
        GatewayError: a piece failed (the server's message).
    """

    async def call(start: int, stop: int) -> list[list[int]]:
        raw = await _call(
            pool, model.tokenizer, {"TEXT": texts[start:stop]}, ("TOKEN_IDS",), parameters, start
        )
        elements = _embedding_elements(raw["TOKEN_IDS"], stop - start, model.tokenizer)
        try:
            return [decode_token_ids(e) for e in elements]
        except ValueError as exc:
            raise UpstreamError(
                f"model {model.tokenizer!r} answered something unexpected: {exc}"
            ) from None

    results = await _each_piece(len(texts), model.tokenizer_max_batch_size, call)
    return [ids for piece in results for ids in piece]
