"""triton-embed: text embeddings served by a Triton ensemble (tokenizer -> vLLM pooling).

Public API: :class:`EmbeddingClient`, its errors, its request options
(:mod:`triton_embed.options`) and the wire codec (:mod:`triton_embed.codec`).
"""

from triton_embed.client import EmbeddingClient, EmbedResult
from triton_embed.errors import (
    AccessDeniedError,
    EmbedClientError,
    EmbedTimeoutError,
    InvalidInputError,
    ServerUnavailableError,
)
from triton_embed.options import InvalidUtf8, RequestOptions, Truncation

__all__ = [
    "AccessDeniedError",
    "EmbeddingClient",
    "EmbedResult",
    "EmbedClientError",
    "EmbedTimeoutError",
    "InvalidInputError",
    "InvalidUtf8",
    "RequestOptions",
    "ServerUnavailableError",
    "Truncation",
]
