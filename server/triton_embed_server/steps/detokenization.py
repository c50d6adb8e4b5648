"""The tokenizer step's other direction: token IDs -> text (TEI's ``/decode``).

A request to the tokenizer step that carries ``DECODE_IDS`` instead of ``TEXT`` (one element
per sequence: its token IDs as little-endian int32, the encoding of ``TOKEN_IDS``) is
answered ``DECODED``: per sequence its UTF-8 text, as the model's ``tokenizer.json`` decodes
it with the Rust ``tokenizers`` library (``Tokenizer.decode``, what Text Embeddings
Inference's ``/decode`` calls), special tokens left out unless the request parameter
``skip_special_tokens`` is false (:class:`triton_embed.decode_options.DecodeOptions`).

Bounds, each failing its own request with ``INVALID_ARG`` before anything is decoded: at
most ``max_request_tokens`` IDs per request (the tokenizer's token budget, the same as a
request's tokens), every ID in ``[0, vocab_size)`` of the tokenizer (added tokens
included), every element whole int32 values. Plain Python (no Triton imports): the
adapter (:mod:`triton_embed_server.steps.adapters.tokenizer`) only moves tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from triton_embed.codec import INT32_LE

from triton_embed_server.steps.errors import EmbedServingError, InvalidTokenIdsError
from triton_embed_server.steps.token_ids import check_request_tokens, check_vocabulary


@dataclass(frozen=True)
class DecodeRequest:
    """One request's sequences to decode.

    Attributes:
        payloads: one ``DECODE_IDS`` element per sequence, ``4 x ids`` bytes (int32 LE).
        skip_special_tokens: leave the tokenizer's special tokens out of the text.
    """

    payloads: Sequence[bytes]
    skip_special_tokens: bool = True


class TokenDecoder:
    """Decodes token IDs with a model's tokenizer, bounded per request.

    Args:
        backend: the step's ``tokenizers.Tokenizer`` (the one it tokenizes with).
        vocab_size: IDs it decodes, ``[0, vocab_size)`` (added tokens included).
        max_request_tokens: the most IDs of one request (``None`` or 0: no limit).
    """

    def __init__(self, backend, vocab_size: int, max_request_tokens: int | None):
        self._backend = backend
        self.vocab_size = vocab_size
        self.max_request_tokens = max_request_tokens or None

    def decode(self, request: DecodeRequest) -> list[str]:
        """The texts of one request's sequences, in order (``""`` for an empty one).

        Raises:
            TooMuchWorkError: more than ``max_request_tokens`` IDs (names the count and
                the budget).
            InvalidTokenIdsError: an element that is not whole int32 values, or an ID
                outside ``[0, vocab_size)`` (names the sequence, the ID and its position).
        """
        check_request_tokens(request.payloads, self.max_request_tokens, "tokenizer", "IDs")
        sequences = []
        for i, payload in enumerate(request.payloads):
            if len(payload) % 4:
                raise InvalidTokenIdsError(
                    f"sequence {i} is {len(payload)} bytes, not whole little-endian int32 IDs "
                    "(4 bytes each)"
                )
            ids = np.frombuffer(bytes(payload), dtype=INT32_LE)
            check_vocabulary(ids, i, self.vocab_size, "sequence")
            sequences.append(ids.tolist())
        return self._backend.decode_batch(
            sequences, skip_special_tokens=request.skip_special_tokens
        )

    def decode_requests(
        self, requests: Sequence[DecodeRequest]
    ) -> list[list[str] | EmbedServingError]:
        """:meth:`decode` of each request; a bad request gets its error, the others their texts."""
        results: list[list[str] | EmbedServingError] = []
        for request in requests:
            try:
                results.append(self.decode(request))
            except EmbedServingError as exc:
                results.append(exc)
        return results
