"""Python client of the ``embed`` ensemble over ``tritonclient.grpc``.

>>> from triton_embed import EmbeddingClient
>>> client = EmbeddingClient("127.0.0.1:8001")
>>> vectors = client.embed(["first text", "second text"])  # float32 [2, 384]

Large inputs are split into batches of at most the server's ``max_batch_size`` texts, sent
concurrently, and reassembled in input order. ``tritonclient`` exceptions never leak: they
are mapped to :class:`~triton_embed.errors.EmbedClientError` subclasses.

A request the server refuses because it is overloaded (or that cannot reach it) is sent
again after a random, exponentially growing wait (:class:`~triton_embed.retry.RetryPolicy`,
``retry=``); each batch is retried on its own and lands in its own place, so every text is
embedded exactly once, in input order, or the call raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from triton_embed.admin import check_key, grpc_headers, is_refused, read_admin_key
from triton_embed.codec import decode_embeddings
from triton_embed.errors import (
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    AccessDeniedError,
    EmbedClientError,
    EmbedTimeoutError,
    InvalidInputError,
    ServerOverloadedError,
    ServerUnavailableError,
)
from triton_embed.options import InvalidUtf8, RequestOptions, Truncation
from triton_embed.retry import RetryPolicy

DEFAULT_URL = "127.0.0.1:8001"
DEFAULT_MODEL = "embed"


@dataclass(frozen=True)
class EmbedResult:
    """Embeddings of a list of texts, in input order.

    Attributes:
        embeddings: float32 ``[n, dim]``, as the server returns them (L2-normalized for
            sentence-transformers models with a Normalize module, such as all-MiniLM-L6-v2).
        num_tokens: int32 ``[n]``, tokens the model read per text (special tokens included,
            after truncation).
        latencies_s: wall-clock seconds of each batch, from its first send to its answer
            (retries and their waits included; one per batch).
        retries: requests sent again after the server refused them (overloaded or
            unavailable), over all batches.
    """

    embeddings: np.ndarray
    num_tokens: np.ndarray
    latencies_s: list[float]
    retries: int = 0


def _as_bytes(text: str | bytes) -> bytes:
    if isinstance(text, bytes):
        return text
    if isinstance(text, str):
        return text.encode("utf-8")
    raise InvalidInputError(f"texts must be str or bytes, got {type(text).__name__}")


class EmbeddingClient:
    """Embeds texts with a running ``embed`` ensemble.

    Args:
        url: gRPC endpoint ``host:port`` (Triton's default gRPC port is 8001).
        model: the ensemble's name.
        timeout_s: deadline of each gRPC request, seconds.
        max_concurrency: requests in flight at once.
        batch_size: texts per request; ``None`` uses the server's ``max_batch_size``.
            Larger values are capped at it. Reading ``max_batch_size`` (the model config) needs
            the admin key; if the server refuses that read (no key, or a wrong one), a given
            ``batch_size`` is used as it is.
        truncation: ``NONE`` / ``END`` / ``START`` (case-insensitive), sent as the request
            parameter ``truncation``; ``None`` keeps the server default (``END`` unless the
            tokenizer model is configured otherwise).
        allow_empty: sent as ``allow_empty``: embed empty texts instead of rejecting them;
            ``None`` keeps the server default (``false`` unless configured otherwise).
        invalid_utf8: ``error`` or ``replace`` (U+FFFD) for ``bytes`` texts that are not
            valid UTF-8; ``None`` keeps the server default (``error``).
        admin_key: the server's admin key, sent only to read the model config; ``None`` reads
            it as :func:`triton_embed.admin.read_admin_key` does (``TRITON_EMBED_ADMIN_KEY``,
            the file ``TRITON_EMBED_ADMIN_KEY_FILE``, the default key file), if any.
        retry: how a request the server refused as overloaded or unavailable is sent again:
            a :class:`~triton_embed.retry.RetryPolicy`, a number of retries with its default
            waits, or ``None``/``0`` for none (the refusal raises
            :class:`~triton_embed.errors.ServerOverloadedError` at once). Default: 8 retries,
            full-jitter waits bounded by 0.1 s doubling up to 5 s. Bad input, deadlines and
            other errors are never retried.

    The option names, values and defaults are those of :mod:`triton_embed.options`.

    Raises:
        InvalidInputError: an option outside its allowed values, ``batch_size`` < 1, or an
            unusable ``admin_key``.
        ServerUnavailableError: the server cannot be reached or the model is not ready.
        AccessDeniedError: the server refused the config read (no key or a wrong one) and no
            ``batch_size`` was given.
        EmbedClientError: the configured key file cannot be read.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        model: str = DEFAULT_MODEL,
        timeout_s: float = 120.0,
        max_concurrency: int = 4,
        batch_size: int | None = None,
        truncation: Truncation | str | None = None,
        allow_empty: bool | None = None,
        invalid_utf8: InvalidUtf8 | str | None = None,
        admin_key: str | None = None,
        retry: RetryPolicy | int | None = RetryPolicy(),  # noqa: B008 - frozen, never mutated
    ):
        import tritonclient.grpc as grpcclient

        try:
            self.options = RequestOptions(truncation, allow_empty, invalid_utf8)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        self.parameters = self.options.to_parameters()
        try:
            self._admin_key = (
                read_admin_key() if admin_key is None else check_key(admin_key, "admin_key=")
            )
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        except OSError as exc:
            raise EmbedClientError(f"cannot read the admin key: {exc}") from None
        try:
            self.retry = RetryPolicy.of(retry)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None

        self._grpc = grpcclient
        self.url = url
        self.model = model
        self.timeout_s = timeout_s
        self.max_concurrency = max(1, max_concurrency)
        self._client = grpcclient.InferenceServerClient(url)
        if batch_size is not None and batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size  # as asked; capped at max_batch_size below
        self.max_batch_size = self._server_max_batch_size()
        self.batch_size = min(batch_size or self.max_batch_size, self.max_batch_size)

    def _server_max_batch_size(self) -> int:
        """The model's ``max_batch_size`` (a restricted API: sent with the admin key).

        A refused read (no key, or a wrong one such as a stale key file) falls back to the
        ``batch_size`` asked for, if any: inference itself needs no key.
        """
        try:
            if not self._client.is_model_ready(self.model):
                raise ServerUnavailableError(f"model {self.model!r} is not ready at {self.url}")
            config = self._client.get_model_config(
                self.model, as_json=True, headers=grpc_headers(self._admin_key) or None
            )["config"]
        except EmbedClientError:
            raise
        except Exception as exc:  # tritonclient / grpc errors
            error = _map_error(exc, self.url)
            if isinstance(error, AccessDeniedError):
                if self.batch_size is not None:
                    return self.batch_size
                raise AccessDeniedError(
                    f"{error} (reading the max_batch_size of {self.model!r}: set "
                    "TRITON_EMBED_ADMIN_KEY or TRITON_EMBED_ADMIN_KEY_FILE, pass admin_key=, "
                    "or pass batch_size=)"
                ) from None
            raise error from None
        return int(config.get("max_batch_size", 0)) or 1

    def close(self) -> None:
        """Close the gRPC channel."""
        self._client.close()

    def __enter__(self) -> EmbeddingClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def embed(self, texts: Sequence[str | bytes]) -> np.ndarray:
        """Embed texts.

        Args:
            texts: ``n`` texts (``str``, or ``bytes`` sent as is).

        Returns:
            float32 ``[n, dim]`` in input order.

        Raises:
            InvalidInputError: the server rejected a text (the message names the batch and
                the text's index in it).
            ServerUnavailableError, EmbedTimeoutError: transport failures.
        """
        return self.embed_with_details(texts).embeddings

    def embed_with_details(
        self,
        texts: Sequence[str | bytes],
        on_batch_done: Callable[[int, int], None] | None = None,
    ) -> EmbedResult:
        """Embed texts and also return token counts and per-request latencies.

        Args:
            texts: ``n`` texts.
            on_batch_done: called with ``(texts_in_batch, tokens_in_batch)`` after each
                request completes (progress bars).

        Returns:
            :class:`EmbedResult`.

        Raises:
            InvalidInputError: the server rejected a text (never retried).
            ServerOverloadedError: the server still refused a batch as overloaded after the
                retries of ``retry``.
            ServerUnavailableError, EmbedTimeoutError: transport failures.
        """
        if isinstance(texts, (str, bytes)):
            raise InvalidInputError(
                "texts must be a sequence of texts, not a single str/bytes; wrap it in a list"
            )
        payloads = [_as_bytes(t) for t in texts]
        if not payloads:
            return EmbedResult(np.zeros((0, 0), np.float32), np.zeros(0, np.int32), [])
        starts = list(range(0, len(payloads), self.batch_size))
        retries = [0]
        lock = threading.Lock()

        def count_retry(error: BaseException, wait_s: float) -> None:
            with lock:
                retries[0] += 1

        def run(start: int) -> tuple[np.ndarray, np.ndarray, float]:
            batch = payloads[start : start + self.batch_size]
            t0 = time.perf_counter()
            vectors, counts = self.retry.call(self._infer, batch, start, on_retry=count_retry)
            elapsed = time.perf_counter() - t0
            if on_batch_done is not None:
                on_batch_done(len(batch), int(counts.sum()))
            return vectors, counts, elapsed

        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(starts))) as pool:
            results = list(pool.map(run, starts))  # map keeps input order
        return EmbedResult(
            embeddings=np.concatenate([r[0] for r in results]),
            num_tokens=np.concatenate([r[1] for r in results]),
            latencies_s=[r[2] for r in results],
            retries=retries[0],
        )

    def _infer(self, batch: list[bytes], offset: int) -> tuple[np.ndarray, np.ndarray]:
        grpc = self._grpc
        arr = np.empty((len(batch), 1), dtype=object)
        arr[:, 0] = batch
        inp = grpc.InferInput("TEXT", list(arr.shape), "BYTES")
        inp.set_data_from_numpy(arr)
        outputs = [grpc.InferRequestedOutput("EMBEDDING"), grpc.InferRequestedOutput("NUM_TOKENS")]
        try:
            result = self._client.infer(
                self.model,
                [inp],
                outputs=outputs,
                client_timeout=self.timeout_s,
                parameters=self.parameters or None,
            )
        except Exception as exc:
            raise _map_error(exc, self.url, offset, len(batch)) from None
        vectors = decode_embeddings(result.as_numpy("EMBEDDING").reshape(-1))
        counts = result.as_numpy("NUM_TOKENS").reshape(-1).astype(np.int32)
        if len(vectors) != len(batch) or len(counts) != len(batch):
            raise EmbedClientError(
                f"server returned {len(vectors)} embeddings for {len(batch)} texts"
            )
        return vectors, counts


def _map_error(
    exc: BaseException, url: str, offset: int | None = None, size: int | None = None
) -> EmbedClientError:
    """Translate a ``tritonclient`` exception into this library's error types."""
    status = ""
    message = str(exc)
    if hasattr(exc, "status") and callable(exc.status):
        status = str(exc.status() or "")
        message = exc.message() if hasattr(exc, "message") else message
    where = f"texts[{offset}:{offset + size}]: " if offset is not None and size else ""
    if is_refused(message):  # gRPC UNAVAILABLE, but the server is up: the key is missing/wrong
        return AccessDeniedError(f"{where}server at {url} refused the call: {message}")
    if "INVALID_ARGUMENT" in status or "400" == status:
        return InvalidInputError(f"{where}{message}")
    if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
        return EmbedTimeoutError(f"{where}request to {url} timed out: {message}")
    if "UNAVAILABLE" in status and (QUEUE_FULL in message or QUEUE_TIMEOUT in message):
        return ServerOverloadedError(
            f"{where}server at {url} is overloaded and refused the request ({message}); "
            "retry later, with backoff"
        )
    if "UNAVAILABLE" in status or "failed to connect" in message.lower():
        return ServerUnavailableError(f"server at {url} is unavailable: {message}")
    return EmbedClientError(f"{where}{status} {message}".strip())
