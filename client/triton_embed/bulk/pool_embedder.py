"""Batches of texts embedded over one or several Triton servers, with the transport's pool.

:class:`PoolEmbedder` sends each batch to the ensemble over gRPC through
:class:`triton_embed.transport.upstreams.UpstreamPool`, the upstream pool the HTTP gateway
uses (one implementation): every endpoint is health-checked every 2 s, each call goes to the
ready server with the fewest calls outstanding, and a call that fails because its server
died is sent once more to another server at once (embedding is idempotent). On top of that,
a batch that still fails for a reason that time can cure (every server unreachable, every
queue full, a deadline) is sent again after a jittered exponential wait
(:meth:`~triton_embed.retry.RetryPolicy.call_async`, :data:`~triton_embed.retry.POOL_RETRYABLE`),
so a bulk job rides out a server restart. Refused input (``INVALID_ARGUMENT``) is never sent
again.

The model is an embedding ensemble (dense vectors), a sparse one (SPLADE: per text its
vocabulary indices and weights, :class:`~triton_embed.bulk.kinds.SparseVectors`), a
multi-vector one (:class:`~triton_embed.bulk.kinds.TokenMatrices`) or a hybrid one (BGE-M3:
the head ``output`` picks, seen as that kind, :func:`~triton_embed.bulk.kinds.model_view`);
which one is read from its config when the pool starts, and the request options are checked
against it then (:func:`~triton_embed.bulk.kinds.request_options`).

:class:`BlockingEmbedder` is the same for synchronous callers (Ray Data actors): the pool
runs on an event loop in a thread of its own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from triton_embed.admin import is_refused
from triton_embed.bulk.kinds import (
    OutputKind,
    SparseVectors,
    TokenMatrices,
    model_view,
    request_options,
)
from triton_embed.codec import decode_embeddings
from triton_embed.errors import (
    AccessDeniedError,
    EmbedClientError,
    InvalidInputError,
    ServerUnavailableError,
    from_transport,
)
from triton_embed.options import DEFAULT_EMBEDDING_TYPE, RequestOptions
from triton_embed.priority import Priority
from triton_embed.retry import RetryPolicy, is_pool_retryable
from triton_embed.sparse_options import SparseOptions
from triton_embed.transport import inference
from triton_embed.transport.addresses import parse_upstreams
from triton_embed.transport.catalog import ModelInfo, ModelKind
from triton_embed.transport.failures import TransportError
from triton_embed.transport.priorities import REQUEST_PRIORITY
from triton_embed.transport.upstreams import UpstreamPool

#: Seconds :meth:`PoolEmbedder.start` waits for a server with the model READY.
READY_WAIT_S = 30.0
#: The bulk default: patient, since a job of hours should outlast a server restart
#: (bounds 0.2, 0.4, ... 10 s; up to about 3.5 minutes of waiting per batch).
BULK_RETRY = RetryPolicy(retries=24, initial_wait_s=0.2, max_wait_s=10.0)


def parse_urls(urls: str | Sequence[str]) -> list[str]:
    """``host:port`` endpoints from ``"a:8001,b:8001"`` or a list.

    Raises:
        InvalidInputError: none given, or one with a scheme (``http://``).
    """
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    items = [u.strip() for u in items if u.strip()]
    if not items:
        raise InvalidInputError("no server given: pass --url HOST:PORT[,HOST:PORT...]")
    for url in items:
        if "://" in url:
            raise InvalidInputError(
                f"url {url!r} has a scheme: pass host:port of a Triton server's gRPC port "
                "(8001 by default), without http://"
            )
    return items


@dataclass(frozen=True)
class Batch:
    """One batch's answer, in the batch's order.

    Attributes:
        vectors: ``[n, width]`` (float32, float16, or uint8 packed bits for ubinary); of a
            sparse model, :class:`~triton_embed.bulk.kinds.SparseVectors` of ``n`` rows; of
            a multi-vector model, :class:`~triton_embed.bulk.kinds.TokenMatrices`.
        num_tokens: int32 ``[n]``: tokens read per text; of token vectors, the rows (a
            hybrid model's ColBERT rows leave its CLS token out: one fewer).
        seconds: from the first send to the answer (retries and waits included).
        retries: sends after the first.
    """

    vectors: np.ndarray | SparseVectors
    num_tokens: np.ndarray
    seconds: float
    retries: int


class PoolEmbedder:
    """Embeds batches of texts with one ensemble served by one or several servers.

    Args:
        urls: gRPC ``host:port`` endpoints (host names are resolved to all their addresses).
        model: the ensemble's name (or its ``served_model_name``).
        options: request options (``input_type``, ``dimensions``, ``embedding_type``, ...).
        sparse: a sparse model's ``top_k`` and ``threshold`` (``None``: the server's);
            refused with an embedding model.
        output: the head of a hybrid model to write (``dense``, ``sparse``, ``tokens``;
            ``None``: ``dense``); of another model, only its own kind's (else refused).
        timeout_s: deadline of one call, seconds.
        admin_key: the servers' admin key (the pool reads the repository index and configs,
            restricted APIs), or ``None``.
        retry: how a batch that failed for a passing reason is sent again.
        priority: the class of its requests (:mod:`triton_embed.priority`): ``batch`` by
            default, so a bulk job waits behind interactive requests in every step's queue.

    Use ``async with PoolEmbedder(...) as embedder: await embedder.embed(texts)``.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        model: str,
        options: RequestOptions,
        *,
        sparse: SparseOptions | None = None,
        output: OutputKind | str | None = None,
        timeout_s: float = 120.0,
        admin_key: str | None = None,
        retry: RetryPolicy = BULK_RETRY,
        priority: Priority | str = Priority.BATCH,
    ):
        self.urls = parse_urls(urls)
        self.priority = Priority.parse(priority)
        self.model = model
        self.options = options
        self.sparse = sparse or SparseOptions()
        self.output = OutputKind.parse(output)
        self.request_options: object = options
        self.embedding_type = options.embedding_type or DEFAULT_EMBEDDING_TYPE
        self.timeout_s = timeout_s
        self.admin_key = admin_key
        self.retry = retry
        self.info = None
        self._pool = None

    async def __aenter__(self) -> PoolEmbedder:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def max_batch_size(self) -> int:
        """Texts per request the ensemble takes (its ``max_batch_size``)."""
        return self.info.max_batch_size

    async def start(self, ready_wait_s: float = READY_WAIT_S) -> None:
        """Check the servers; wait until one has the model READY.

        :attr:`info` is then the model as the kind of vectors written (a hybrid model's
        view of :attr:`output`).

        Raises:
            ServerUnavailableError: no server had the model READY within ``ready_wait_s``
                (says what each server answered).
            InvalidInputError: the model is no embedding, sparse, multi-vector or hybrid
                model, or an option of another kind is set (names the flag).
        """
        try:
            targets = parse_upstreams(self.urls)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        self._pool = UpstreamPool(targets, admin_key=self.admin_key, timeout_s=self.timeout_s)
        await self._pool.start()
        deadline = time.monotonic() + ready_wait_s
        listed_not_served = 0  # checks that saw the name listed but not as an ensemble
        while (served := self._pool.catalog.resolve(self.model)) is None:
            states = self._pool.describe()
            ready = [u for u in states if u["ready"]]
            listed = bool(ready) and all(self.model in u["models"] for u in ready)
            listed_not_served = listed_not_served + 1 if listed else 0
            if listed_not_served >= 2:  # not a config read late: a step, not an ensemble
                ensembles = ", ".join(self._pool.catalog.models) or "none"
                await self.stop()
                raise InvalidInputError(
                    f"model {self.model!r} is served but is not an ensemble the bulk job can "
                    "call (a step of one, or a model of a kind it does not embed with); the "
                    f"ensembles: {ensembles}; pass one of them as --model"
                )
            if states and all(is_refused(u["problem"]) for u in states):
                await self.stop()
                raise AccessDeniedError(
                    f"the servers refused to list their models ({states[0]['problem']}): the "
                    "bulk job reads the model configs, a restricted API; set "
                    "TRITON_EMBED_ADMIN_KEY or TRITON_EMBED_ADMIN_KEY_FILE, or pass "
                    "--admin-key-file"
                )
            if time.monotonic() > deadline:
                states = "; ".join(
                    f"{u['address']}: {'ready, models ' + ', '.join(u['models']) if u['ready'] else u['problem']}"  # noqa: E501
                    for u in self._pool.describe()
                )
                await self.stop()
                raise ServerUnavailableError(
                    f"no server has the model {self.model!r} ready after {ready_wait_s:g} s "
                    f"({states or 'no address resolved'})"
                )
            await asyncio.sleep(0.5)
            await self._pool.refresh()
        try:
            info = model_view(served, self.output, self.model)
            self.request_options = request_options(
                info.kind, self.model, self.options, self.sparse, getattr(info, "head", None)
            )
        except InvalidInputError:
            await self.stop()
            raise
        self.info = info

    def _served(self) -> ModelInfo:
        """The model as the upstreams serve it now (the view of a hybrid model), or :attr:`info`."""
        served = self._pool.catalog.resolve(self.model)
        if served is None or served.kind is not ModelKind.HYBRID:
            return served or self.info
        return model_view(served, self.output, self.model)

    async def stop(self) -> None:
        """Stop the health checks and close every channel."""
        if self._pool is not None:
            await self._pool.stop()
            self._pool = None

    def describe(self) -> list[dict]:
        """Every server's state (address, ready, models, calls outstanding)."""
        return self._pool.describe() if self._pool else []

    async def embed(self, texts: Sequence[str | bytes]) -> Batch:
        """Embed up to :attr:`max_batch_size` texts.

        Returns:
            :class:`Batch`, rows in the order of ``texts``.

        Raises:
            InvalidInputError: the server refused a text (``error.index`` is its index in
                ``texts``; never retried).
            ServerUnavailableError: still failing after the retries (the last reason).
            EmbedClientError: another failure (the server's message).
        """
        payloads = [t.encode("utf-8") if isinstance(t, str) else bytes(t) for t in texts]
        t0 = time.perf_counter()
        retries = 0

        def count_retry(error: BaseException, wait_s: float) -> None:
            nonlocal retries
            retries += 1

        async def attempt() -> inference.Embeddings:
            info = self._served()
            level = REQUEST_PRIORITY.set(self.priority.level)
            try:
                return await inference.embed_texts(self._pool, info, payloads, self.request_options)
            finally:
                REQUEST_PRIORITY.reset(level)

        try:
            answer = await self.retry.call_async(attempt, on_retry=count_retry)
        except TransportError as exc:
            if is_pool_retryable(exc):
                raise ServerUnavailableError(
                    f"{exc.message} (still failing after {self.retry.retries} retries)"
                ) from None
            raise from_transport(exc) from None
        num_tokens = answer.num_tokens
        if self.info.kind is ModelKind.MULTIVECTOR:
            skipped = getattr(self.info, "rows_skipped", 0)  # a hybrid model's CLS row
            try:
                vectors = TokenMatrices.from_matrices(answer.token_matrices(skipped))
            except ValueError as exc:
                raise EmbedClientError(f"model {self.model!r} answered {exc}") from None
            num_tokens = num_tokens - skipped
        elif self.info.kind is ModelKind.SPARSE:
            try:
                vectors = SparseVectors.from_rows(answer.sparse())
            except ValueError as exc:
                raise EmbedClientError(f"model {self.model!r} answered {exc}") from None
        else:
            vectors = decode_embeddings(answer.elements, embedding_type=self.embedding_type)
        return Batch(vectors, num_tokens, time.perf_counter() - t0, retries)


class BlockingEmbedder:
    """:class:`PoolEmbedder` for synchronous code: its event loop runs in a daemon thread.

    Same arguments as :class:`PoolEmbedder`. :meth:`embed` may be called from any thread;
    :meth:`close` stops the pool and the loop.
    """

    def __init__(self, *args, **kwargs):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._embedder = PoolEmbedder(*args, **kwargs)
        try:
            self._run(self._embedder.start())
        except BaseException:
            self._stop_loop()
            raise

    @property
    def max_batch_size(self) -> int:
        """Texts per request the ensemble takes."""
        return self._embedder.max_batch_size

    @property
    def info(self) -> ModelInfo:
        """The ensemble (its ``kind``: embedding or sparse)."""
        return self._embedder.info

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def embed(self, texts: Sequence[str | bytes]) -> Batch:
        """:meth:`PoolEmbedder.embed`, blocking; any number of texts (sent in batches)."""
        size = self.max_batch_size

        async def embed_all() -> list[Batch]:
            spans = range(0, len(texts), size)
            return await asyncio.gather(*(self._embedder.embed(texts[i : i + size]) for i in spans))

        parts = self._run(embed_all())
        vectors = [p.vectors for p in parts]
        sparse = bool(vectors) and isinstance(vectors[0], SparseVectors)
        tokens = bool(vectors) and isinstance(vectors[0], TokenMatrices)
        joined = (
            SparseVectors.concatenate(vectors)
            if sparse
            else TokenMatrices.concatenate(vectors)
            if tokens
            else np.concatenate(vectors)
        )
        return Batch(
            joined,
            np.concatenate([p.num_tokens for p in parts]),
            sum(p.seconds for p in parts),
            sum(p.retries for p in parts),
        )

    def close(self) -> None:
        """Stop the pool and the loop."""
        try:
            self._run(self._embedder.stop())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
