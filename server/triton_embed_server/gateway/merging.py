"""Request merging: small concurrent text requests share one call to the ensemble.

Why: each upstream call pays the ensemble's fixed cost (two ensemble steps, one gRPC round
trip) whatever its size. At 1 text per HTTP request the gateway reached ~12,300 tokens/s,
at 16 texts per request ~15,000 (issue 16): small requests spend a fifth of the time on
per-call overhead that a larger call shares. Measured side by side on 2 cores with the
gateway next to the server, merging did not pay (0.92-1.00x at 1 text per request, 64 in
flight; perf/README.md, "Alternatives"): Triton's dynamic batcher already batches the
embedder step. So it is off by default (``--merge-in-flight 0``).

How (:class:`Merger`), per merge key (:func:`merge_key`: the ensemble and the request
options, which must be equal to share a call):

* at most ``in_flight`` upstream calls run at once (``--merge-in-flight``). A request that
  arrives while fewer are running is sent at once, alone, exactly as without merging: an
  idle gateway adds no delay;
* otherwise the request waits. When one of the key's calls finishes, the requests waiting
  for that key are sent as one call, oldest first, as many whole requests as fit in the
  ensemble's ``max_batch_size`` texts (a request is never split across calls); the rest
  wait for the next call to finish. Each request gets its own slice of ``EMBEDDING`` and
  ``NUM_TOKENS`` back (:func:`split`);
* a request of more than ``max_batch_size`` texts, and every request when ``in_flight`` is
  0, goes the piecewise path of :func:`~triton_embed.transport.inference.embed_texts`
  unmerged. Token-ID input and ``/tokenize`` are never merged.

Errors stay per request. A merged call that fails with
``INVALID_INPUT`` (the server's ``INVALID_ARGUMENT``, as
:func:`~triton_embed.transport.failures.upstream_error` reads it: one text's input may be at
fault) is sent again as one call per request, outside the ``in_flight`` bound, so
each request gets its own answer or its own error naming the text by its index in *that*
request. Any other failure (queue refusal, deadline, unreachable upstream, engine error)
is the server's, not an input's: every request of the call gets it. A waiting request
that is cancelled (its client went away) leaves the queue and is not sent; one cancelled
after its call was sent does not affect the others of that call.

Every call made here is counted in ``triton_embed_gateway_merged_requests``, a histogram of
requests per upstream call (1 for a request sent alone).
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from triton_embed.options import RequestOptions
from triton_embed.transport import inference
from triton_embed.transport.catalog import ModelInfo
from triton_embed.transport.failures import ErrorKind, TransportError
from triton_embed.transport.inference import Embeddings, Pool
from triton_embed.transport.priorities import REQUEST_PRIORITY

from triton_embed_server.gateway.metrics import GatewayMetrics

#: ``(ensemble, request options, priority level)``.
MergeKey = tuple[ModelInfo, RequestOptions, int]


def merge_key(model: ModelInfo, options: RequestOptions, priority: int = 0) -> MergeKey:
    """The key under which requests may share a call: the ensemble, options and priority.

    Two requests share a key when their options are equal
    (:class:`~triton_embed.options.RequestOptions` is frozen, its values parsed: typed and
    hashable) and their tenants' classes send the same Triton priority level (a merged call
    is sent at one level, :data:`~triton_embed.transport.upstreams.REQUEST_PRIORITY`).

    Args:
        model: the ensemble the request resolved to.
        options: the request's options.
        priority: the request's priority level (0: the server's default).
    """
    return model, options, priority


def split(embeddings: Embeddings, counts: Sequence[int]) -> list[Embeddings]:
    """Cut a merged call's answer into one :class:`~.inference.Embeddings` per request.

    Args:
        embeddings: ``sum(counts)`` elements and ``NUM_TOKENS`` values, in call order.
        counts: texts of each request, in the order they were put in the call.

    Returns:
        One ``Embeddings`` per count: its elements (views, not copies) and int32 ``[count]``
        ``NUM_TOKENS``.

    Raises:
        ValueError: the answer does not hold ``sum(counts)`` vectors and token counts.
    """
    total = sum(counts)
    if len(embeddings.elements) != total or len(embeddings.num_tokens) != total:
        raise ValueError(
            f"a merged call of {total} texts answered {len(embeddings.elements)} vectors and "
            f"{len(embeddings.num_tokens)} token counts"
        )
    out = []
    start = 0
    for count in counts:
        stop = start + count
        out.append(Embeddings(embeddings.elements[start:stop], embeddings.num_tokens[start:stop]))
        start = stop
    return out


@dataclass(eq=False)
class _Waiter:
    """One request waiting for a merged call.

    ``future``'s result is the request's :class:`~.inference.Embeddings`, or ``None``: send
    it again alone (its merged call failed on some request's input).
    """

    texts: Sequence[bytes]
    future: asyncio.Future[Embeddings | None]


@dataclass(eq=False)
class _KeyQueue:
    """One merge key's state: its calls running and the requests waiting, oldest first."""

    running: int = 0
    waiting: deque[_Waiter] = field(default_factory=deque)


def _take(waiting: deque[_Waiter], max_texts: int) -> list[_Waiter]:
    """The oldest waiting requests whose texts fit in ``max_texts``; cancelled ones dropped."""
    batch: list[_Waiter] = []
    count = 0
    while waiting:
        waiter = waiting[0]
        if waiter.future.done():  # cancelled while waiting
            waiting.popleft()
            continue
        if count + len(waiter.texts) > max_texts:
            break
        batch.append(waiting.popleft())
        count += len(waiter.texts)
    return batch


def _copy(error: BaseException) -> BaseException:
    """One exception object per request (each request's task adds its own traceback)."""
    try:
        return copy.copy(error)
    except Exception:
        return error


class Merger:
    """Embeds texts through the ensemble, merging small concurrent requests per merge key.

    Args:
        pool: the upstreams.
        in_flight: upstream calls per merge key before requests wait to be merged
            (``--merge-in-flight``); 0: no merging, every request is sent as it comes.
        metrics: where requests per call are counted (``None``: not counted).

    Raises:
        ValueError: ``in_flight`` is negative.
    """

    def __init__(self, pool: Pool, in_flight: int, metrics: GatewayMetrics | None = None):
        if in_flight < 0:
            raise ValueError(f"in_flight must be >= 0 (0: no merging), got {in_flight}")
        self.pool = pool
        self.in_flight = in_flight
        self.metrics = metrics
        self._queues: dict[MergeKey, _KeyQueue] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def embed_texts(
        self,
        model: ModelInfo,
        texts: Sequence[bytes],
        options: RequestOptions,
        budget: inference.TokenBudget | None = None,
    ) -> Embeddings:
        """Embed UTF-8 texts with the ensemble ``model``, alone or merged with others.

        Args:
            model: the ensemble.
            texts: ``n`` UTF-8 payloads.
            options: the request options (``truncation``, ``input_type``, ...).
            budget: the request's token budget (``None``: none); a merged request (one
                piece at most) is checked once its counts are back.

        Returns:
            The ``n`` vectors and ``NUM_TOKENS`` of ``texts``, in order, the same as
            :func:`~.inference.embed_texts` gives.

        Raises:
            TransportError: the request failed (its own error: a text named by its index in
                ``texts``), or the call it shared failed for a reason of the server's.
        """
        if not self.in_flight or len(texts) > model.piece_size(options.truncation):
            return await inference.embed_texts(self.pool, model, texts, options, budget)
        result = await self._merged(model, texts, options)
        if budget is not None:
            budget.check(int(result.num_tokens.sum()), len(texts), len(texts))
        return result

    async def _merged(
        self, model: ModelInfo, texts: Sequence[bytes], options: RequestOptions
    ) -> Embeddings:
        key = merge_key(model, options, REQUEST_PRIORITY.get())
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _KeyQueue()
        if queue.running < self.in_flight:
            queue.running += 1
            try:
                return await self._send(model, texts, options, requests=1)
            finally:
                self._next(key, queue, model, options)
        waiter = _Waiter(texts, asyncio.get_running_loop().create_future())
        queue.waiting.append(waiter)
        try:
            result = await waiter.future
        except asyncio.CancelledError:
            if waiter in queue.waiting:
                queue.waiting.remove(waiter)
            raise
        if result is None:
            return await self._send(model, texts, options, requests=1)
        return result

    async def _send(
        self, model: ModelInfo, texts: Sequence[bytes], options: RequestOptions, requests: int
    ) -> Embeddings:
        """One upstream call of ``requests`` requests' texts (at most ``max_batch_size``)."""
        if self.metrics is not None:
            self.metrics.merged_requests.observe(requests)
        return await inference.embed_texts(self.pool, model, texts, options)

    def _next(
        self, key: MergeKey, queue: _KeyQueue, model: ModelInfo, options: RequestOptions
    ) -> None:
        """A call of ``key`` finished: its slot sends the waiting requests, or is freed."""
        batch = _take(queue.waiting, model.piece_size(options.truncation))
        if not batch:
            queue.running -= 1
            if not queue.running and not queue.waiting:
                del self._queues[key]
            return
        task = asyncio.get_running_loop().create_task(
            self._merged_call(key, queue, model, options, batch)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _merged_call(
        self,
        key: MergeKey,
        queue: _KeyQueue,
        model: ModelInfo,
        options: RequestOptions,
        batch: list[_Waiter],
    ) -> None:
        """Send ``batch`` as one call, settle each request's future, then pass the slot on."""
        try:
            await self._serve(model, options, batch)
        finally:
            self._next(key, queue, model, options)

    async def _serve(self, model: ModelInfo, options: RequestOptions, batch: list[_Waiter]) -> None:
        texts = [text for waiter in batch for text in waiter.texts]
        try:
            result = await self._send(model, texts, options, requests=len(batch))
            parts = split(result, [len(waiter.texts) for waiter in batch])
        except asyncio.CancelledError:
            for waiter in batch:
                waiter.future.cancel()
            raise
        except Exception as error:
            refused = isinstance(error, TransportError) and error.kind is ErrorKind.INVALID_INPUT
            for waiter in batch:
                if waiter.future.done():
                    continue
                if not refused:
                    waiter.future.set_exception(_copy(error))
                elif len(batch) == 1:
                    # One request's input may be at fault: each is sent again alone (None),
                    # unless it was alone, and the error (its index already the request's
                    # own) is its answer.
                    waiter.future.set_exception(error)
                else:
                    waiter.future.set_result(None)
            return
        for waiter, part in zip(batch, parts, strict=True):
            if not waiter.future.done():
                waiter.future.set_result(part)
