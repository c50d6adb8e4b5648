"""Where the upstreams are called: split into pieces, send concurrently, reassemble.

A request's inputs (up to :data:`MAX_INPUTS`) are cut into pieces of the called model's
``max_batch_size``, fewer where the step's token budget asks for it
(:meth:`~.catalog.ModelInfo.piece_size`; :func:`pieces`), sent concurrently (at most
:data:`PIECES_IN_FLIGHT` at once per request, so one large request does not fill an upstream's
queue alone, and no more than its token budget allows, :class:`TokenBudget`), each on the
upstream the pool chooses, and put back together in input order. When the request is cancelled
(its client went away, its deadline passed) the pieces in flight are cancelled, which cancels
their gRPC calls (``tritonclient.grpc.aio``: Triton then sees a cancelled request), and no more
are started.
A failed piece fails the request with the
:class:`~triton_embed.transport.failures.TransportError` of
:func:`~triton_embed.transport.failures.upstream_error`, naming a text by its index in the
request's inputs.

* :func:`embed_texts`: the ensemble, ``TEXT`` -> ``EMBEDDING`` (a sparse ensemble's
  ``SPARSE``), ``NUM_TOKENS``;
* :func:`embed_token_ids`: the ensemble's embedder step, ``TOKEN_IDS`` -> ``EMBEDDING``
  (``NUM_TOKENS`` is then the number of IDs of each input);
* :func:`tokenize`: the ensemble's tokenizer step, ``TEXT`` -> ``TOKEN_IDS``;
* :func:`decode`: the same step the other way, ``DECODE_IDS`` -> ``DECODED`` (text).

Each takes the request's options as one :class:`~triton_embed.options.RequestOptions`
value; they become the KServe v2 request parameters of each upstream call there, and only
there (:meth:`~triton_embed.options.RequestOptions.to_parameters`).

The HTTP gateway's routes call :func:`embed_texts` through its request merging (which
merges small concurrent requests into one call); the bulk job
(:mod:`triton_embed.bulk.pool_embedder`) calls it directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from tritonclient.utils import InferenceServerException

from triton_embed.codec import (
    bytes_elements,
    decode_embeddings,
    decode_sparse,
    decode_token_ids,
    decode_token_matrices,
    encode_token_ids,
    int32_values,
)
from triton_embed.decode_options import DECODE_INPUT, DECODE_OUTPUT, DecodeOptions
from triton_embed.options import RequestOptions
from triton_embed.rerank_options import PairOptions
from triton_embed.sparse_options import SparseOptions
from triton_embed.transport.catalog import ModelInfo
from triton_embed.transport.failures import ErrorKind, TransportError, upstream_error
from triton_embed.transport.upstreams import UpstreamPool

#: The most inputs one request may carry (OpenAI's limit for ``/v1/embeddings``).
MAX_INPUTS = 2048
#: Pieces of one request in flight at once.
PIECES_IN_FLIGHT = 16

T = TypeVar("T")


#: What the calls here need of the upstreams: ``catalog``, ``any_ready()`` and ``infer(...)``
#: of :class:`~.upstreams.UpstreamPool` (tests pass a stand-in with the same three).
Pool = UpstreamPool


@dataclass(frozen=True)
class Embeddings:
    """The vectors of a request's inputs, in input order.

    Attributes:
        elements: one ``EMBEDDING`` payload per input, exactly the server's bytes
            (little-endian float32 for the default ``embedding_type``); of a sparse model,
            one ``SPARSE`` payload (:meth:`sparse`).
        num_tokens: int32 ``[n]``, tokens the model read per input.
    """

    elements: list[memoryview]
    num_tokens: np.ndarray

    def matrix(self) -> np.ndarray:
        """The vectors as float32 ``[n, dim]`` (no text parsing: a view of the bytes).

        Raises:
            ValueError: the payloads differ in length or are not whole float32 values.
        """
        return decode_embeddings(self.elements)

    def token_matrices(self, rows_skipped: int = 0) -> list[np.ndarray]:
        """A multi-vector model's vectors: per input float32 ``[num_tokens[i], dim]``.

        ``rows_skipped``: a matrix has ``num_tokens[i] - rows_skipped`` rows (1 for a hybrid
        model's ColBERT vectors, the CLS token left out).

        Raises:
            ValueError: a payload is not whole rows of one dimension for its token count.
        """
        return decode_token_matrices(self.elements, self.num_tokens - rows_skipped)

    def sparse(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """A sparse model's vectors: per input, ``(indices int32 [k], weights float32 [k])``.

        Indices ascending, as the server sends them (docs/sparse.md).

        Raises:
            ValueError: a payload is not a whole number of (int32, float32) pairs.
        """
        return [decode_sparse(e) for e in self.elements]


def pieces(count: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` spans that cut ``count`` inputs into pieces of at most ``size``.

    >>> pieces(5, 2)
    [(0, 2), (2, 4), (4, 5)]
    """
    if size < 1:
        raise ValueError(f"piece size must be >= 1, got {size}")
    return [(start, min(start + size, count)) for start in range(0, count, size)]


@dataclass(frozen=True)
class TokenBudget:
    """A request's token budget (``--max-request-tokens``) and how its pieces are bounded.

    The gateway cannot count a text's tokens before the tokenizer step has seen it, so it
    counts what the step answers (``NUM_TOKENS``) piece by piece, and bounds what may be
    in flight before the answers are in: a text of ``b`` UTF-8 bytes has at most ``b``
    tokens plus the model's special and prompt tokens (every WordPiece, BPE or byte-fallback
    token covers at least one byte; :data:`SPECIAL_TOKENS_BOUND`), and never more than the
    model's per-text budget (``max_length``, times ``max_chunks`` with ``truncation=CHUNK``).
    A piece is started only while the tokens counted so far plus the bounds of the pieces in
    flight and its own stay within the budget, or when nothing else is in flight; once the
    count passes the budget the pieces still running are cancelled, none is started, and
    the request is 400. So the engine never works on more than the budget plus one piece's
    bound for a refused request.

    Attributes:
        max_tokens: the budget.
        max_tokens_per_text: a text's largest token count, or ``None`` when unknown.
        field: the request field of the inputs (``input``, ``inputs``), for the message.
    """

    max_tokens: int
    max_tokens_per_text: int | None = None
    field: str = "input"

    def bound(self, texts: Sequence[bytes]) -> int:
        """An upper bound of the tokens of ``texts``."""
        return self.bound_sizes([len(t) for t in texts])

    def bound_sizes(self, sizes: Sequence[int]) -> int:
        """An upper bound of the tokens of inputs of ``sizes`` UTF-8 bytes each.

        An input is a text, or a query-document pair (its size the two together, the
        prompt template and instruction of a decoder reranker included).
        """
        cap = self.max_tokens_per_text
        if cap is None:
            return sum(sizes) + SPECIAL_TOKENS_BOUND * len(sizes)
        return sum(min(cap, size + SPECIAL_TOKENS_BOUND) for size in sizes)

    def check(self, tokens: int, done: int, total: int) -> None:
        """Raise ``OVER_BUDGET`` when ``tokens`` (of ``done`` inputs) is over the budget.

        Args:
            tokens: tokens counted so far.
            done: inputs they belong to.
            total: inputs of the request.

        Raises:
            TransportError: ``OVER_BUDGET``, naming :attr:`field`.
        """
        if tokens <= self.max_tokens:
            return
        counted = (
            "its inputs have" if done >= total else f"the first {done} of its {total} inputs have"
        )
        raise TransportError(
            ErrorKind.OVER_BUDGET,
            f"the request is over the gateway's token budget: {counted} {tokens} tokens; at "
            f"most {self.max_tokens} tokens are embedded per request (--max-request-tokens); "
            "split the inputs over several requests",
            field=self.field,
        )


#: Tokens a text may have beyond one per UTF-8 byte: special tokens and a prompt.
SPECIAL_TOKENS_BOUND = 32

Call = Callable[[int, int], Awaitable[tuple[T, int]]]


async def each_piece(
    count: int,
    size: int,
    call: Call[T],
    budget: TokenBudget | None = None,
    bounds: Sequence[int] | None = None,
) -> list[T]:
    """``call(start, stop)`` for every piece, concurrently, results in input order.

    ``call`` returns a piece's result and its token count. At most
    :data:`PIECES_IN_FLIGHT` pieces run at once and, with a ``budget``, only as many as the
    budget allows (:class:`TokenBudget`; ``bounds[i]`` bounds piece ``i``'s tokens). The
    first failure, an exhausted budget, or this coroutine's cancellation (the client went
    away, the request's deadline passed) cancels the pieces still running (their gRPC calls
    are cancelled with them) and starts no more.

    Raises:
        TransportError: a piece failed, or the budget is exhausted (``OVER_BUDGET``).
    """
    spans = pieces(count, size)
    if len(spans) == 1:
        result, tokens = await call(*spans[0])
        if budget is not None:
            budget.check(tokens, count, count)
        return [result]
    results: dict[int, T] = {}
    running: dict[asyncio.Future, int] = {}
    used = reserved = done = 0
    following = 0
    try:
        while following < len(spans) or running:
            while following < len(spans) and len(running) < PIECES_IN_FLIGHT:
                bound = bounds[following] if bounds is not None and budget is not None else 0
                if running and budget is not None and used + reserved + bound > budget.max_tokens:
                    break
                task = asyncio.ensure_future(call(*spans[following]))
                running[task] = following
                reserved += bound
                following += 1
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                index = running.pop(task)
                result, tokens = task.result()  # a failed piece raises here
                results[index] = result
                start, stop = spans[index]
                done += stop - start
                used += tokens
                if bounds is not None and budget is not None:
                    reserved -= bounds[index]
            if budget is not None:
                budget.check(used, done, count)
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    return [results[i] for i in range(len(spans))]


async def call_model(
    pool: Pool,
    model: str,
    inputs: Mapping[str, Sequence[bytes]],
    outputs: Sequence[str],
    options: RequestOptions | PairOptions | SparseOptions | DecodeOptions | None,
    start: int,
) -> dict[str, bytes]:
    """One piece's upstream call, its failure mapped to a :class:`TransportError`.

    The request's ``options`` become the call's KServe v2 request parameters here, the one
    place they are (``None``: none, the server's defaults apply).

    Args:
        pool: the upstreams.
        model: the model to call.
        inputs: ``{input name: the piece's elements}``.
        outputs: the outputs it must answer.
        options: the request options (an embedding's, a reranker's or a sparse model's).
        start: index in the caller's inputs of the piece's first element (a refused
            input is named by its index there).

    Raises:
        TransportError: the call failed, or its answer lacks an output (``BAD_ANSWER``).
    """
    size = len(next(iter(inputs.values())))
    parameters = {} if options is None else options.to_parameters()
    try:
        raw = await pool.infer(model, inputs, outputs, parameters)
    except InferenceServerException as exc:
        raise upstream_error(exc, offset=start, size=size) from None
    missing = [name for name in outputs if name not in raw]
    if missing:
        raise bad_answer(
            model,
            f"the upstream's response lacks {', '.join(missing)} (it has "
            f"{', '.join(sorted(raw)) or 'no outputs'})",
        )
    return raw


def bad_answer(model: str, problem: Any) -> TransportError:
    """``BAD_ANSWER``: ``model`` answered something the transport cannot read.

    Args:
        model: the model called.
        problem: what was wrong with its answer.
    """
    return TransportError(
        ErrorKind.BAD_ANSWER, f"model {model!r} answered something unexpected: {problem}"
    )


def _embedding_elements(raw: bytes, count: int, model: str) -> list[memoryview]:
    try:
        return bytes_elements(raw, count)
    except ValueError as exc:
        raise bad_answer(model, exc) from None


async def embed_texts(
    pool: Pool,
    model: ModelInfo,
    texts: Sequence[bytes],
    options: RequestOptions | SparseOptions | None = None,
    budget: TokenBudget | None = None,
) -> Embeddings:
    """Embed UTF-8 texts with the ensemble ``model`` (dense, or sparse: its ``output``).

    Args:
        pool: the upstreams.
        model: the ensemble (a :class:`~.catalog.SparseInfo` answers ``SPARSE``).
        texts: ``n`` UTF-8 payloads.
        options: the request options (``truncation``, ``input_type``, ...; a sparse model's
            :class:`~triton_embed.sparse_options.SparseOptions`; ``None``: the server's
            defaults).
        budget: the request's token budget (``None``: none).

    Raises:
        TransportError: a piece failed (the server's message; a text named by its index in
            ``texts``), or the texts are over ``budget`` (``OVER_BUDGET``).
    """

    async def call(start: int, stop: int) -> tuple[tuple[list[memoryview], np.ndarray], int]:
        raw = await call_model(
            pool,
            model.name,
            {"TEXT": texts[start:stop]},
            (model.output, "NUM_TOKENS"),
            options,
            start,
        )
        count = stop - start
        try:
            num_tokens = int32_values(raw["NUM_TOKENS"], count)
        except ValueError as exc:
            raise bad_answer(model.name, exc) from None
        elements = _embedding_elements(raw[model.output], count, model.name)
        return (elements, num_tokens), int(num_tokens.sum())

    size = model.piece_size(None if options is None else options.truncation)
    spans = pieces(len(texts), size)
    bounds = None
    if budget is not None and len(spans) > 1:
        bounds = [budget.bound(texts[start:stop]) for start, stop in spans]
    results = await each_piece(len(texts), size, call, budget, bounds)
    elements = [e for piece, _ in results for e in piece]
    return Embeddings(elements, np.concatenate([counts for _, counts in results]))


async def embed_token_ids(
    pool: Pool,
    model: ModelInfo,
    token_ids: Sequence[Sequence[int]],
    options: RequestOptions | SparseOptions | None = None,
    budget: TokenBudget | None = None,
) -> Embeddings:
    """Embed token-ID lists with the ensemble's embedder (or sparse encoder) step.

    Args:
        pool: the upstreams.
        model: the ensemble (its :attr:`~ModelInfo.embedder` is called).
        token_ids: ``n`` lists of IDs, each ``0 <= id < 2**31``.
        options: the request options the embedder reads (``dimensions``, ...; ``None``:
            the server's defaults).
        budget: the request's token budget (``None``: none), checked before any call
            (the IDs are the tokens).

    Raises:
        TransportError: a piece failed (e.g. an ID outside the vocabulary: the server's
            message, naming the input by its index in ``token_ids``), or the IDs are over
            ``budget`` (``OVER_BUDGET``).
    """
    if budget is not None:
        budget.check(sum(len(ids) for ids in token_ids), len(token_ids), len(token_ids))
    payloads = list(encode_token_ids(token_ids))

    async def call(start: int, stop: int) -> tuple[list[memoryview], int]:
        raw = await call_model(
            pool, model.embedder, {"TOKEN_IDS": payloads[start:stop]}, (model.output,),
            options, start,
        )  # fmt: skip
        return _embedding_elements(raw[model.output], stop - start, model.embedder), 0

    results = await each_piece(len(payloads), model.token_ids_piece_size(), call)
    counts = np.array([len(ids) for ids in token_ids], dtype=np.int32)
    return Embeddings([e for piece in results for e in piece], counts)


async def tokenize(
    pool: Pool, model: ModelInfo, texts: Sequence[bytes], options: RequestOptions | None = None
) -> list[list[int]]:
    """The token IDs the ensemble's tokenizer step makes of each text (special tokens included).

    Args:
        pool: the upstreams.
        model: the ensemble (its :attr:`~ModelInfo.tokenizer` is called).
        texts: ``n`` UTF-8 payloads.
        options: the request options the tokenizer reads (``truncation``, ``input_type``,
            ...; ``None``: the server's defaults).

    Raises:
        TransportError: a piece failed (the server's message).
    """

    async def call(start: int, stop: int) -> tuple[list[list[int]], int]:
        raw = await call_model(
            pool, model.tokenizer, {"TEXT": texts[start:stop]}, ("TOKEN_IDS",), options, start
        )
        elements = _embedding_elements(raw["TOKEN_IDS"], stop - start, model.tokenizer)
        try:
            return [decode_token_ids(e) for e in elements], 0
        except ValueError as exc:
            raise bad_answer(model.tokenizer, exc) from None

    results = await each_piece(len(texts), model.tokenizer_max_batch_size, call)
    return [ids for piece in results for ids in piece]


async def decode(
    pool: Pool,
    model: ModelInfo,
    token_ids: Sequence[Sequence[int]],
    options: DecodeOptions | None = None,
) -> list[str]:
    """The text of each token-ID sequence, decoded by the ensemble's tokenizer step.

    Args:
        pool: the upstreams.
        model: the ensemble (its :attr:`~ModelInfo.tokenizer` is called with
            ``DECODE_IDS``; docs/sparse.md, "Token IDs to text").
        token_ids: ``n`` sequences of IDs, each ``0 <= id < 2**31`` (the step refuses an ID
            outside its vocabulary, naming the sequence by its index here).
        options: ``skip_special_tokens`` (``None``: the step's default, true).

    Returns:
        ``n`` texts, in order.

    Raises:
        TransportError: a piece failed (the server's message), or the answer is not UTF-8.
    """
    payloads = list(encode_token_ids(token_ids))

    async def call(start: int, stop: int) -> tuple[list[str], int]:
        raw = await call_model(
            pool, model.tokenizer, {DECODE_INPUT: payloads[start:stop]}, (DECODE_OUTPUT,),
            options, start,
        )  # fmt: skip
        elements = _embedding_elements(raw[DECODE_OUTPUT], stop - start, model.tokenizer)
        try:
            return [bytes(e).decode("utf-8") for e in elements], 0
        except UnicodeDecodeError as exc:
            raise bad_answer(model.tokenizer, exc) from None

    results = await each_piece(len(payloads), model.tokenizer_max_batch_size, call)
    return [text for piece in results for text in piece]
