"""Token IDs back to text with a model's tokenizer: the client's ``decode`` (a mixin).

The ensemble's tokenizer step decodes what it tokenizes: a request that sends
``DECODE_IDS`` (per sequence, little-endian int32 IDs) is answered ``DECODED`` (per
sequence, UTF-8 text), TEI's ``/decode`` (docs/sparse.md, "Token IDs to text"). Use it to
read a sparse vector's indices as tokens: ``client.decode([[i] for i in result.indices[0]])``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from triton_embed.codec import encode_token_ids
from triton_embed.decode_options import DECODE_INPUT, DECODE_OUTPUT, DecodeOptions
from triton_embed.errors import EmbedClientError, InvalidInputError, map_error
from triton_embed.transport.calls import CallGroup, Channel, ClientPart, _call, send_all
from triton_embed.transport.catalog import ModelKind

#: The largest token ID the wire carries (little-endian int32).
MAX_TOKEN_ID = 2**31 - 1


def check_ids(ids: Sequence[Sequence[int]]) -> list[list[int]]:
    """The sequences as lists of ``int``, each ID a whole number in ``[0, 2**31)``.

    Raises:
        InvalidInputError: a sequence that is no list of IDs, or an ID outside int32's
            range (names ``ids[i][j]``; the vocabulary itself is the server's to check).
    """
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise InvalidInputError("ids must be a sequence of token-ID sequences, e.g. [[101, 2023]]")
    out = []
    for i, sequence in enumerate(ids):
        listed = isinstance(sequence, Sequence | np.ndarray)
        if isinstance(sequence, (str, bytes)) or not listed:
            raise InvalidInputError(
                f"ids[{i}] is {type(sequence).__name__}, not a sequence of token IDs; pass "
                "one list per sequence ([[101, 2023]], not [101, 2023])"
            )
        row = []
        for j, token_id in enumerate(sequence):
            if isinstance(token_id, bool) or not isinstance(token_id, int | np.integer):
                raise InvalidInputError(f"ids[{i}][{j}] is {token_id!r}, not a whole number")
            if not 0 <= int(token_id) <= MAX_TOKEN_ID:
                raise InvalidInputError(
                    f"ids[{i}][{j}] is {int(token_id)}, outside 0 to {MAX_TOKEN_ID} (int32)"
                )
            row.append(int(token_id))
        out.append(row)
    return out


class TokenDecoding(ClientPart):
    """The ``decode`` method of :class:`~triton_embed.client.EmbeddingClient` (a mixin)."""

    def decode(
        self,
        ids: Sequence[Sequence[int]],
        *,
        model: str | None = None,
        skip_special_tokens: bool = True,
    ) -> list[str]:
        """Decode token-ID sequences to text with a model's tokenizer.

        Args:
            ids: ``n`` sequences of token IDs (lists or int arrays; each ID
                ``0 <= id < vocab_size`` of the model's tokenizer).
            model: the ensemble whose tokenizer decodes them: an embedding, sparse,
                multi-vector or hybrid model (default: the client's ``model``).
            skip_special_tokens: leave the tokenizer's special tokens out (TEI's default).

        Returns:
            ``n`` texts, in order; ``""`` for an empty sequence.

        Raises:
            InvalidInputError: an ID that is no whole number in int32's range, an ID outside
                the model's vocabulary (``error.index`` is its sequence's index in ``ids``),
                more IDs in one request than the step's ``max_request_tokens``, or ``model``
                a reranker.
            AccessDeniedError: the model config (its tokenizer step's name) could not be read.
            ServerOverloadedError, ServerUnavailableError, EmbedTimeoutError: as ``embed``.
        """
        sequences = check_ids(ids)
        model = model or self.model
        if not sequences:
            return []
        step = self._tokenizer_step(model)
        payloads = list(encode_token_ids(sequences))
        parameters = DecodeOptions(skip_special_tokens=skip_special_tokens).to_parameters()
        channel = Channel(self._grpc, self._client, self.url, self.timeout_s, self.priority_level)

        def send(start: int, stop: int, calls: CallGroup) -> list[str]:
            result = _call(
                channel, step, {DECODE_INPUT: payloads[start:stop]}, (DECODE_OUTPUT,),
                parameters, calls, start, "ids",
            )  # fmt: skip
            elements = result.as_numpy(DECODE_OUTPUT).reshape(-1)
            if len(elements) != stop - start:
                raise EmbedClientError(
                    f"server returned {len(elements)} texts for {stop - start} sequences"
                )
            return [bytes(e).decode("utf-8") for e in elements]

        sent = send_all(len(payloads), self._batch_size(model), send, self.retry,
                        self.max_concurrency)  # fmt: skip
        return [text for texts in sent.results for text in texts]

    def _tokenizer_step(self, model: str) -> str:
        """The name of ``model``'s tokenizer step: its ensemble's first step.

        Raises:
            InvalidInputError: ``model`` is a reranker (its pair tokenizer does not decode).
            AccessDeniedError, ServerUnavailableError: its config could not be read.
        """
        self._batch_size(model)  # reads the config and the kind once (a refusal raises)
        if getattr(self, "_kinds", {}).get(model) is ModelKind.RERANKER:
            raise InvalidInputError(
                f"model {model!r} is a reranker; decode needs the tokenizer of an embedding, "
                "sparse, multi-vector or hybrid model: pass model= the name of one"
            )
        steps = getattr(self, "_tokenizer_steps", None)
        if steps is None:
            steps = self._tokenizer_steps = {}
        if model not in steps:
            try:
                config = self._client.get_model_config(
                    model, as_json=True, headers=self._admin_headers()
                )["config"]
            except Exception as exc:  # tritonclient / grpc errors
                raise map_error(exc, self.url) from None
            scheduling = (config.get("ensemble_scheduling") or {}).get("step") or []
            steps[model] = scheduling[0]["model_name"] if scheduling else model
        return steps[model]
