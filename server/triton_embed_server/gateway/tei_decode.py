"""text-embeddings-inference's ``POST /decode``: token IDs back to text.

TEI's schema (``router/src/http/types.rs``: ``DecodeRequest``, ``InputIds``,
``DecodeResponse``): ``{"ids": [int, ...] or [[int, ...], ...], "skip_special_tokens":
true}`` -> ``["text", ...]``, one string per sequence (one for a flat list too), plus the
gateway's ``model`` (absent: ``--default-model``, as ``/tokenize``, whose output it
inverts). Name the model whose IDs they are: to read ``/embed_sparse`` indices as tokens,
send the ``model`` that ``/embed_sparse`` used, one ID per sequence
(``{"ids": [[2003], [4937]]}`` -> ``["is", "cat"]``).

The IDs are decoded by the model's tokenizer step on the Triton side (its ``DECODE_IDS``
input, :mod:`triton_embed_server.steps.detokenization`): the model's own
``tokenizer.json``, whatever gateway serves it. Bounds, before any upstream call:

* ``ids`` not empty, a list of whole numbers or a list of such lists (400);
* each ID from 0 to 2,147,483,647 (int32, the wire's type; 400 naming the sequence and
  position); the tokenizer step then refuses an ID outside its vocabulary, ``[0,
  vocab_size)`` (400, the server's message naming the sequence, the ID and the range);
* at most 2,048 sequences (413, the inputs of any route) and ``--max-request-tokens`` IDs
  in all (413); the step's own token budget applies too (``max_request_tokens``).

A reranker has no decoding step: naming one is 400 ``wrong_model_kind``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from triton_embed.decode_options import DecodeOptions
from triton_embed.transport import inference
from triton_embed.transport.catalog import RerankerInfo

from triton_embed_server.gateway.errors import BadRequest, EmptyInput, TooLarge, quote
from triton_embed_server.gateway.tei_api import JSON, _flag, _object

if TYPE_CHECKING:
    from triton_embed_server.gateway.app import Gateway, RequestState

DECODE_FIELDS = ("ids", "skip_special_tokens", "model")
#: The largest token ID the wire carries (little-endian int32).
MAX_TOKEN_ID = 2**31 - 1
FORMS = "a list of token IDs ([101, 2023]) or a list of such lists ([[101], [2023, 102]])"


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_ids(value: Any, max_ids: int) -> list[list[int]]:
    """TEI's ``ids``: one sequence (a flat list) or several (a list of lists).

    Args:
        value: the field as sent.
        max_ids: the most IDs in all (the gateway's ``--max-request-tokens``).

    Returns:
        The sequences, each a list of IDs in ``[0, 2**31)``.

    Raises:
        EmptyInput: ``ids`` is missing or ``[]``.
        BadRequest: another shape, or an ID that is no whole number in int32's range
            (names the sequence and position).
        TooLarge: more than 2,048 sequences or ``max_ids`` IDs (names the limit).
    """
    if value is None or value == []:
        raise EmptyInput(f"'ids' is required and must not be empty: {FORMS}", param="ids")
    if not isinstance(value, list):
        raise BadRequest(f"'ids' must be {FORMS}, got {quote(value)}", param="ids")
    flat = not any(isinstance(v, list) for v in value)  # one sequence; its items checked below
    sequences = [value] if flat else value
    if not all(isinstance(s, list) for s in sequences):
        raise BadRequest(f"'ids' must be {FORMS}, not a mix of IDs and lists", param="ids")
    if len(sequences) > inference.MAX_INPUTS:
        raise TooLarge(
            f"'ids' holds {len(sequences)} sequences, over the limit of {inference.MAX_INPUTS} "
            "per request; send them in several requests",
            param="ids",
        )
    total = sum(len(s) for s in sequences)
    if total > max_ids:
        raise TooLarge(
            f"'ids' holds {total} token IDs, over the limit of {max_ids} per request (the "
            "gateway's --max-request-tokens); send them in several requests",
            param="ids",
        )
    for i, sequence in enumerate(sequences):
        for j, token_id in enumerate(sequence):
            if not _is_id(token_id) or not 0 <= token_id <= MAX_TOKEN_ID:
                where = f"ids[{j}]" if flat else f"ids[{i}][{j}]"
                raise BadRequest(
                    f"{where} is {quote(token_id)}, not a token ID: a whole number from "
                    f"0 to {MAX_TOKEN_ID} (the model's vocabulary, [0, vocab_size), is "
                    "checked by its tokenizer)",
                    param="ids",
                )
    return sequences


def parse_decode_request(
    body: Any, max_ids: int
) -> tuple[list[list[int]], DecodeOptions, str | None]:
    """Read a ``POST /decode`` body: the sequences, the options and the ``model`` asked for.

    Raises:
        BadRequest, EmptyInput, TooLarge: as :func:`parse_ids`; an unknown field, a
            ``skip_special_tokens`` that is no boolean, a ``model`` that is no string.
    """
    body = _object(body, DECODE_FIELDS)
    sequences = parse_ids(body.get("ids"), max_ids)
    skip = _flag(body, "skip_special_tokens", True)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {quote(model)}", param="model")
    return sequences, DecodeOptions(skip_special_tokens=skip), model


async def decode(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``POST /decode``: TEI's decoded texts, ``["text", ...]`` (its body already read)."""
    sequences, options, name = parse_decode_request(state.body, gateway.max_request_tokens)
    model = gateway.model(name or gateway.default_model)
    if isinstance(model, RerankerInfo):
        raise BadRequest(
            f"the model {quote(name or model.name)} is a reranker; /decode decodes the token IDs "
            "of an embedding, sparse, multi-vector or hybrid model (its tokenizer step): name "
            "one with 'model'",
            param="model",
            code="wrong_model_kind",
        )
    state.model = model.name
    ids = sum(len(s) for s in sequences)
    async with gateway.upstream_turn(state, model.name, ids) as turn:
        texts = await inference.decode(gateway.pool, model, sequences, options)
        turn.tokens = ids
    state.inputs, state.tokens = len(sequences), ids
    return Response(orjson.dumps(texts), media_type=JSON)
