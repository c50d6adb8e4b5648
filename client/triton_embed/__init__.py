"""triton-embed: text embeddings served by a Triton ensemble (tokenizer -> vLLM pooling).

Public API: :class:`EmbeddingClient`, its errors, and the wire codec (:mod:`triton_embed.codec`).
"""

from triton_embed.client import EmbeddingClient, EmbedResult
from triton_embed.errors import (
    EmbedClientError,
    EmbedTimeoutError,
    InvalidInputError,
    ServerUnavailableError,
)

__all__ = [
    "EmbeddingClient",
    "EmbedResult",
    "EmbedClientError",
    "EmbedTimeoutError",
    "InvalidInputError",
    "ServerUnavailableError",
]
