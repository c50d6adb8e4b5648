"""Python client of the ``embed`` ensemble over ``tritonclient.grpc``.

>>> from triton_embed import EmbeddingClient
>>> client = EmbeddingClient("127.0.0.1:8001")
>>> vectors = client.embed(["first text", "second text"])  # float32 [2, 384]
>>> query = client.embed(["what is it?"], model="qwen", input_type="query", dimensions=256)

Large inputs are split into batches of at most the server's ``max_batch_size`` texts, sent
concurrently, and reassembled in input order. ``tritonclient`` exceptions never leak: they
are mapped to :class:`~triton_embed.errors.EmbedClientError` subclasses.

A request the server refuses because it is overloaded (or that cannot reach it) is sent
again after a random, exponentially growing wait (:class:`~triton_embed.retry.RetryPolicy`,
``retry=``); each batch is retried on its own and lands in its own place, so every text is
embedded exactly once, in input order, or the call raises.

Work nobody waits for is stopped: when one request of an ``embed`` call fails (a refused
text, a timeout, an error) the call raises at once, the requests not yet sent are not sent,
and those in flight are cancelled (gRPC cancellation: Triton 2.51 then stops an ensemble
request before its next step; see docs/input-contract.md, "Cancelled requests"). A request
that passes ``timeout_s`` is cancelled too, by its gRPC deadline.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from triton_embed.admin import grpc_headers
from triton_embed.decode_client import TokenDecoding
from triton_embed.errors import (
    AccessDeniedError,
    EmbedClientError,
    InvalidInputError,
    ServerUnavailableError,
    map_error,
)
from triton_embed.hybrid_options import head_parameters
from triton_embed.model_control import ModelControl
from triton_embed.multivector_client import TokenEmbedding
from triton_embed.options import EmbeddingType, InvalidUtf8, RequestOptions, Truncation
from triton_embed.priority import Priority, level_of
from triton_embed.reranking import Reranking, RerankResult
from triton_embed.retry import RetryPolicy
from triton_embed.sparse_client import SparseEmbedding, SparseResult
from triton_embed.transport.addresses import DEFAULT_MODEL, DEFAULT_URL, check_url
from triton_embed.transport.calls import (
    CallGroup,
    Channel,
    ChannelOwner,
    TextsRequest,
    admin_key_of,
    as_bytes,
    send_all,
    send_texts,
    trace_argument,
)
from triton_embed.transport.catalog import ModelKind, kind_of_config
from triton_embed.transport.request_sizes import texts_per_request
from triton_embed.transport.tracing import TraceContext

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_URL",
    "EmbedResult",
    "EmbeddingClient",
    "RerankResult",
    "SparseResult",
    "check_url",
]


@dataclass(frozen=True)
class EmbedResult:
    """Embeddings of a list of texts, in input order.

    Attributes:
        embeddings: ``[n, dim]``, as the server returns them (L2-normalized for
            sentence-transformers models with a Normalize module, such as all-MiniLM-L6-v2):
            float32, float16 for ``embedding_type="float16"``, or for ``"ubinary"`` uint8
            ``[n, ceil(dim / 8)]`` packed sign bits (``np.unpackbits(..., axis=-1)``).
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


#: How a kind of model is named in messages, and the method that serves it.
_KIND_WORDS = {
    ModelKind.EMBEDDING: ("an embedding model", "embed()"),
    ModelKind.RERANKER: ("a reranker", "rerank()"),
    ModelKind.SPARSE: ("a sparse model", "embed_sparse()"),
    ModelKind.MULTIVECTOR: ("a multi-vector model", "embed_tokens()"),
    ModelKind.HYBRID: ("a hybrid model", "embed(), embed_sparse() or embed_tokens()"),
}


def _check_arguments(timeout_s: float, max_concurrency: int, batch_size: int | None) -> int:
    """Refuse out-of-range constructor arguments; returns ``max_concurrency`` as an int.

    Raises:
        InvalidInputError: ``timeout_s`` not a finite number > 0, ``max_concurrency`` not a
            whole number >= 1, or ``batch_size`` < 1.
    """
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, numbers.Real)
        or not (math.isfinite(timeout_s) and timeout_s > 0)
    ):
        raise InvalidInputError(
            f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}"
        )
    try:
        concurrency = None if isinstance(max_concurrency, bool) else operator.index(max_concurrency)
    except TypeError:
        concurrency = None
    if concurrency is None or concurrency < 1:
        raise InvalidInputError(
            f"max_concurrency must be a whole number >= 1, got {max_concurrency!r}"
        )
    if batch_size is not None and batch_size < 1:
        raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
    return concurrency


class EmbeddingClient(ChannelOwner, Reranking, SparseEmbedding, TokenEmbedding, TokenDecoding):
    """Embeds texts with a running ``embed`` ensemble, and reranks with a reranker ensemble.

    :meth:`rerank` (:class:`~triton_embed.reranking.Reranking`) scores documents against a
    query with a reranker ensemble (docs/rerank.md); pass ``model=`` a reranker there or here.
    :meth:`embed_sparse` (:class:`~triton_embed.sparse_client.SparseEmbedding`) gives sparse
    vectors from a sparse (SPLADE) ensemble (docs/sparse.md); :meth:`embed_tokens`
    (:class:`~triton_embed.multivector_client.TokenEmbedding`) one vector per token from a
    multi-vector (ColBERT, or hidden states) ensemble; :meth:`decode`
    (:class:`~triton_embed.decode_client.TokenDecoding`) token IDs back to text.

    Args:
        url: gRPC endpoint ``host:port``, without a scheme (Triton's default gRPC port is
            8001; 8000, its HTTP port, does not answer gRPC).
        model: the ensemble's name.
        timeout_s: deadline of each gRPC request, seconds (finite, > 0); past it the request
            is cancelled (the server stops its work) and the call raises
            :class:`~triton_embed.errors.EmbedTimeoutError`.
        max_concurrency: requests in flight at once (>= 1).
        batch_size: texts per request; ``None`` uses the server's ``max_batch_size``.
            Larger values are capped at it. Reading ``max_batch_size`` (the model config) needs
            the admin key; if the server refuses that read (no key, or a wrong one), a given
            ``batch_size`` is used as it is.
        truncation: ``NONE`` / ``END`` / ``START`` / ``CHUNK`` (case-insensitive), sent as
            the request parameter ``truncation``; ``None`` keeps the server default (``END``
            unless the tokenizer model is configured otherwise).
        allow_empty: sent as ``allow_empty``: embed empty texts instead of rejecting them;
            ``None`` keeps the server default (``false`` unless configured otherwise).
        invalid_utf8: ``error`` or ``replace`` (U+FFFD) for ``bytes`` texts that are not
            valid UTF-8; ``None`` keeps the server default (``error``).
        input_type: the prompt put in front of each text: ``query``, ``document`` or a prompt
            name of the model; ``None`` keeps the model's default prompt.
        dimensions: cut each vector to its first ``dimensions`` values, L2-normalized again
            (one of the model's Matryoshka dimensions); ``None``: the full vector.
        embedding_type: ``float32`` (default), ``float16`` or ``ubinary`` (packed sign bits).
        normalize: ``False``: the pooled vectors without L2 normalization (what
            text-embeddings-inference returns for ``normalize=false``); ``True``:
            L2-normalized; ``None`` keeps the model's own (normalized for a model with a
            ``Normalize`` module).
        options: the request options as one :class:`~triton_embed.options.RequestOptions`
            (e.g. :meth:`~triton_embed.options.RequestOptions.from_args` of parsed flags);
            those of the keyword arguments above that are not ``None`` replace its fields.
            ``None``: the keyword arguments alone.
        admin_key: the server's admin key, sent only to read the model config; ``None`` reads
            it as :func:`triton_embed.admin.read_admin_key` does (``TRITON_EMBED_ADMIN_KEY``,
            the file ``TRITON_EMBED_ADMIN_KEY_FILE``, the default key file), if any.
        retry: how a request the server refused as overloaded or unavailable is sent again:
            a :class:`~triton_embed.retry.RetryPolicy`, a number of retries with its default
            waits, or ``None``/``0`` for none (the refusal raises
            :class:`~triton_embed.errors.ServerOverloadedError` at once). Default: 8 retries,
            full-jitter waits bounded by 0.1 s doubling up to 5 s. Bad input, deadlines and
            other errors are never retried.
        priority: ``interactive`` or ``batch`` (:mod:`triton_embed.priority`): the Triton
            priority level of every request (interactive ones are served first in every
            step's queue); ``None``: the server's default level (interactive).

    The option names, values and defaults are those of :mod:`triton_embed.options`.

    Raises:
        InvalidInputError: an option outside its allowed values, ``options`` that is not a
            :class:`~triton_embed.options.RequestOptions`, ``timeout_s`` <= 0 (or not
            finite), ``max_concurrency`` < 1, ``batch_size`` < 1, a ``url`` with a scheme
            (``http://``), or an unusable ``admin_key``. A subclass of ``ValueError``.
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
        input_type: str | None = None,
        dimensions: int | None = None,
        embedding_type: EmbeddingType | str | None = None,
        retry: RetryPolicy | int | None = RetryPolicy(),  # noqa: B008 - frozen, never mutated
        normalize: bool | None = None,
        options: RequestOptions | None = None,
        priority: Priority | str | None = None,
    ):
        import tritonclient.grpc as grpcclient

        max_concurrency = _check_arguments(timeout_s, max_concurrency, batch_size)
        check_url(url)
        if options is not None and not isinstance(options, RequestOptions):
            raise InvalidInputError(
                f"options must be a RequestOptions, got {type(options).__name__}"
            )
        try:
            self.options = RequestOptions(
                truncation,
                allow_empty,
                invalid_utf8,
                input_type,
                dimensions,
                embedding_type,
                normalize,
            )
            if options is not None:  # the keyword arguments given replace its fields
                given = {k: v for k, v in asdict(self.options).items() if v is not None}
                self.options = replace(options, **given)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        self.parameters = self.options.to_parameters()
        try:
            self.priority_level = level_of(priority)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        self._admin_key = admin_key_of(admin_key)
        try:
            self.retry = RetryPolicy.of(retry)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None

        self._grpc = grpcclient
        self.url = url
        self.model = model
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self._client = grpcclient.InferenceServerClient(url)
        self._channel = Channel(grpcclient, self._client, url, timeout_s, self.priority_level)
        self._control = ModelControl.over(
            self._client, url=url, headers=self._admin_headers(), timeout_s=timeout_s
        )
        self.batch_size = batch_size  # as asked; capped at max_batch_size below
        self._batch_sizes: dict[str, int] = {}
        self._kinds: dict[str, ModelKind | None] = {}  # from the configs read
        self.max_batch_size = self._server_max_batch_size(model)
        self.batch_size = self._batch_size(model)

    def _batch_size(self, model: str) -> int:
        """Texts per request to ``model``: ``batch_size`` capped at its ``max_batch_size``."""
        if model not in self._batch_sizes:
            most = self._server_max_batch_size(model)
            self._batch_sizes[model] = min(self.batch_size or most, most)
        return self._batch_sizes[model]

    def _server_max_batch_size(self, model: str) -> int:
        """The model's ``max_batch_size`` (a restricted API: sent with the admin key).

        A refused read (no key, or a wrong one such as a stale key file) falls back to the
        ``batch_size`` asked for, if any: inference itself needs no key.
        """
        try:
            if not self._client.is_model_ready(model):
                raise ServerUnavailableError(f"model {model!r} is not ready at {self.url}")
            config = self._client.get_model_config(
                model, as_json=True, headers=self._admin_headers()
            )["config"]
        except EmbedClientError:
            raise
        except Exception as exc:  # tritonclient / grpc errors
            error = map_error(exc, self.url)
            if isinstance(error, AccessDeniedError):
                if self.batch_size is not None:
                    return self.batch_size
                raise AccessDeniedError(
                    f"{error} (reading the max_batch_size of {model!r}: set "
                    "TRITON_EMBED_ADMIN_KEY or TRITON_EMBED_ADMIN_KEY_FILE, pass admin_key=, "
                    "or pass batch_size=)"
                ) from None
            raise error from None
        self._kinds[model] = kind_of_config(config)
        return texts_per_request(
            config,
            self._kinds[model],
            lambda step: self._client.get_model_config(
                step, as_json=True, headers=self._admin_headers()
            )["config"],
        )

    def _check_kind(self, model: str, wanted: ModelKind) -> bool:
        """Refuse a call to a model of the other kind, when its config was read.

        A hybrid model (BGE-M3) serves ``embed``, ``embed_sparse`` and ``embed_tokens``.

        Returns:
            Whether ``model`` is a hybrid model (the call asks for its one head).

        Raises:
            InvalidInputError: ``model`` is a reranker and ``wanted`` embedding, or the
                reverse (names the model, its kind and the method that serves it).
        """
        self._batch_size(model)  # reads the config (and the kind) once
        kind = self._kinds.get(model)
        if kind is ModelKind.HYBRID and wanted is not ModelKind.RERANKER:
            return True
        if kind is None or kind is wanted:
            return False
        what, method = _KIND_WORDS[kind]
        wanted_what, wanted_method = _KIND_WORDS[wanted]
        raise InvalidInputError(
            f"model {model!r} is {what}; {wanted_method} needs {wanted_what}: call {method} "
            f"with it, or pass model= the name of {wanted_what}"
        )

    def load_model(self, name: str) -> None:
        """Load (or reload) the model ``name`` on the server; wait until it is ready.

        Triton's model repository API, a restricted API: sent with the admin key. Loading an
        ensemble loads its steps. Within ``timeout_s``; then ``embed(..., model=name)``.

        Raises:
            AccessDeniedError: the server refused the call (no admin key, or a wrong one).
            EmbedTimeoutError: the model was not ready within ``timeout_s``.
            EmbedClientError: the server could not load it (Triton's message, on one line).
        """
        self._batch_sizes.pop(name, None)  # a reloaded model may batch differently
        self._kinds.pop(name, None)
        self._control.load_model(name)

    def unload_model(self, name: str) -> None:
        """Unload the model ``name`` (an ensemble: and its steps no other model uses).

        Raises:
            AccessDeniedError: the server refused the call (no admin key, or a wrong one).
            EmbedClientError: any other failure (Triton's message, on one line).
        """
        self._batch_sizes.pop(name, None)
        self._kinds.pop(name, None)
        self._control.unload_model(name)

    def _admin_headers(self) -> dict[str, str] | None:
        """The gRPC metadata carrying the admin key; ``None`` without a key."""
        return grpc_headers(self._admin_key) or None

    def embed(
        self,
        texts: Sequence[str | bytes],
        *,
        model: str | None = None,
        input_type: str | None = None,
        dimensions: int | None = None,
        embedding_type: EmbeddingType | str | None = None,
        truncation: Truncation | str | None = None,
        normalize: bool | None = None,
        traceparent: str | TraceContext | None = None,
    ) -> np.ndarray:
        """Embed texts.

        Args:
            texts: ``n`` texts (``str``, or ``bytes`` sent as is).
            model: the ensemble to use (default: the client's ``model``).
            input_type: this call's prompt name (default: the client's).
            dimensions: this call's Matryoshka dimensions (default: the client's).
            embedding_type: this call's output type (default: the client's).
            truncation: this call's truncation (default: the client's).
            normalize: this call's normalization (default: the client's).
            traceparent: the W3C trace context of its requests (a ``traceparent`` or a
                ``TraceContext``; default: ``trace_context``'s, OpenTelemetry's current span).

        Returns:
            ``[n, dim]`` in input order: float32 (float16 for ``embedding_type="float16"``;
            uint8 ``[n, ceil(dim / 8)]`` packed sign bits for ``"ubinary"``).

        Raises:
            InvalidInputError: a text was refused (by the server, or by the client before
                sending: a lone surrogate, a wrong type); ``error.index`` is its index in
                ``texts``, which the message names.
            ServerUnavailableError, EmbedTimeoutError: transport failures.
        """
        options = {
            "input_type": input_type,
            "dimensions": dimensions,
            "embedding_type": embedding_type,
            "truncation": truncation,
            "normalize": normalize,
        }
        return self.embed_with_details(
            texts, model=model, traceparent=traceparent, **options
        ).embeddings

    def embed_with_details(
        self,
        texts: Sequence[str | bytes],
        on_batch_done: Callable[[int, int], None] | None = None,
        *,
        model: str | None = None,
        traceparent: str | TraceContext | None = None,
        **options,
    ) -> EmbedResult:
        """Embed texts and also return token counts and per-request latencies.

        Args:
            texts: ``n`` texts.
            on_batch_done: called with ``(texts_in_batch, tokens_in_batch)`` after each
                request completes (progress bars).
            model: the ensemble to use (default: the client's ``model``).
            traceparent: as :meth:`embed`.
            **options: this call's request options (:class:`~triton_embed.options.
                RequestOptions` fields; ``None`` values keep the client's).

        Returns:
            :class:`EmbedResult`.

        Raises:
            InvalidInputError: a text was refused (never retried); ``error.index`` is its
                index in ``texts``.
            ServerOverloadedError: the server still refused a batch as overloaded after the
                retries of ``retry``.
            ServerUnavailableError, EmbedTimeoutError: transport failures.
        """
        if isinstance(texts, (str, bytes)):
            raise InvalidInputError(
                "texts must be a sequence of texts, not a single str/bytes; wrap it in a list"
            )
        try:
            opts = replace(self.options, **{k: v for k, v in options.items() if v is not None})
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(str(exc)) from None
        model, trace = model or self.model, trace_argument(traceparent)
        payloads = [as_bytes(t, i) for i, t in enumerate(texts)]
        if not payloads:
            return EmbedResult(np.zeros((0, 0), np.float32), np.zeros(0, np.int32), [])
        hybrid = self._check_kind(model, ModelKind.EMBEDDING)
        parameters = head_parameters(hybrid, "dense", opts.to_parameters())
        request = TextsRequest(model, parameters, opts.embedding_type)

        def send(start: int, stop: int, calls: CallGroup) -> tuple[np.ndarray, np.ndarray]:
            return self._infer(payloads[start:stop], start, request, calls)

        def done(count: int, result: tuple[np.ndarray, np.ndarray]) -> None:
            if on_batch_done is not None:
                on_batch_done(count, int(result[1].sum()))

        sent = send_all(
            len(payloads), self._batch_size(model), send, self.retry, self.max_concurrency, done,
            trace,
        )  # fmt: skip
        return EmbedResult(
            embeddings=np.concatenate([r[0] for r in sent.results]),
            num_tokens=np.concatenate([r[1] for r in sent.results]),
            latencies_s=sent.latencies_s,
            retries=sent.retries,
        )

    def _infer(
        self,
        batch: list[bytes],
        offset: int,
        request: TextsRequest | None = None,
        calls: CallGroup | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One gRPC request: ``batch`` (``texts[offset : offset + len(batch)]``) embedded.

        :func:`~triton_embed.transport.calls.send_texts` with this client's channel, model
        and options unless ``request`` says otherwise.

        Raises:
            EmbedClientError: the mapped failure (:func:`~triton_embed.errors.map_error`).
        """
        if request is None:
            request = TextsRequest(self.model, self.parameters, self.options.embedding_type)
        return send_texts(self._channel, batch, offset, request, calls or CallGroup())
