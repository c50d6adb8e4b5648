"""triton-embed: text embeddings served by a Triton ensemble (tokenizer -> vLLM pooling).

Public API: :class:`EmbeddingClient` (``embed`` and, with a reranker ensemble, ``rerank``:
:class:`RerankResult`), its errors, its request options (:mod:`triton_embed.options`), its
retry policy (:mod:`triton_embed.retry`), the wire codec (:mod:`triton_embed.codec`), and
the W3C trace context its calls are sent in (:func:`trace_context`, :class:`TraceContext`;
:mod:`triton_embed.transport.tracing`). What talks to a Triton server (addresses, the
upstream pool, the inference call, the model catalog, error kinds) is
:mod:`triton_embed.transport`, which the bulk job and the server package's HTTP gateway use
too.
"""

from triton_embed.client import EmbeddingClient, EmbedResult
from triton_embed.errors import (
    AccessDeniedError,
    EmbedClientError,
    EmbedTimeoutError,
    InvalidInputError,
    ServerOverloadedError,
    ServerUnavailableError,
)
from triton_embed.multivector_options import MultiVectorOptions
from triton_embed.options import InvalidUtf8, RequestOptions, Truncation
from triton_embed.rerank_options import PairOptions, PairTruncation
from triton_embed.reranking import RerankResult
from triton_embed.retry import RetryPolicy
from triton_embed.sparse_client import SparseResult
from triton_embed.sparse_options import SparseOptions
from triton_embed.transport.tracing import TraceContext, trace_context

__all__ = [
    "AccessDeniedError",
    "EmbeddingClient",
    "EmbedResult",
    "EmbedClientError",
    "EmbedTimeoutError",
    "InvalidInputError",
    "InvalidUtf8",
    "PairOptions",
    "PairTruncation",
    "RequestOptions",
    "RerankResult",
    "RetryPolicy",
    "ServerOverloadedError",
    "ServerUnavailableError",
    "MultiVectorOptions",
    "SparseOptions",
    "SparseResult",
    "TraceContext",
    "Truncation",
    "trace_context",
]
