"""What a rerank or score request asks, read and checked, and the call that scores it.

Every rerank and score route (Cohere's and Jina's ``/v1/rerank``, Cohere's ``/v2/rerank``,
TEI's and vLLM's ``/rerank``, vLLM's ``/score``) reads its body with these, each naming its
own fields in the messages:

* the query (:func:`parse_query`): a non-empty string;
* the documents (:func:`parse_documents`): a list of 1 to
  :data:`~triton_embed.reranking.MAX_DOCUMENTS` (1,000) non-blank strings, or objects
  ``{"text": ...}`` where the API takes them (Cohere's and Jina's v1); more is 413
  ``too_many_inputs``, none is 400 (TEI's ``Empty``);
* ``top_n`` (:func:`parse_top_n`): a whole number >= 1, or absent (every document);
* the request options (:func:`pair_options`): one
  :class:`~triton_embed.rerank_options.PairOptions`, the one parser of their values.

:func:`score` then calls the reranker (:func:`~triton_embed.transport.scoring.score_pairs`:
pieces of its ``max_batch_size`` pairs, sent concurrently within the request's token budget
``--max-request-tokens``, merged in input order), and records the pairs and tokens for the
metrics. The order of the results is :func:`triton_embed.reranking.rank`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from triton_embed.options import OptionError
from triton_embed.rerank_options import PairOptions, PairTruncation
from triton_embed.reranking import MAX_DOCUMENTS
from triton_embed.transport.catalog import RerankerInfo
from triton_embed.transport.scoring import Scores, score_pairs

from triton_embed_server.gateway.errors import BadRequest, EmptyInput, TooLarge, quote
from triton_embed_server.gateway.fair import estimate_tokens

if TYPE_CHECKING:
    from triton_embed_server.gateway.app import Gateway, RequestState

#: Documents per Cohere search unit (Cohere bills one per query of up to 100 documents).
DOCUMENTS_PER_SEARCH_UNIT = 100


def check_fields(body: Any, fields: Sequence[str]) -> dict[str, Any]:
    """``body`` as a JSON object whose every field is one of ``fields``.

    Raises:
        BadRequest: not an object, or an unknown field (names the first, ``unknown_field``).
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = [k for k in body if k not in fields]
    if unknown:
        raise BadRequest(
            f"unknown field {quote(unknown[0])}; the fields are {', '.join(fields)}",
            param=unknown[0][:64],
            code="unknown_field",
        )
    return body


def parse_model(body: dict[str, Any]) -> str | None:
    """The ``model`` a body names, or ``None`` (absent or ``null``: the default reranker).

    Raises:
        BadRequest: not a non-empty string.
    """
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise BadRequest("'model' must be a non-empty string", param="model")
    return model


def parse_flag(body: dict[str, Any], field: str, default: bool) -> bool:
    """A boolean field (absent or ``null``: ``default``).

    Raises:
        BadRequest: not ``true`` or ``false``.
    """
    value = body.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{field}' must be true or false, got {quote(value)}", param=field)
    return value


def parse_query(value: Any, field: str = "query") -> bytes:
    """The query, UTF-8.

    Raises:
        BadRequest: absent, not a string, or blank (names ``field``).
    """
    if value is None:
        raise BadRequest(
            f"'{field}' is required: the text the documents are ranked against", param=field
        )
    if not isinstance(value, str):
        raise BadRequest(f"'{field}' must be a string, got {quote(value)}", param=field)
    if not value.strip():
        raise BadRequest(
            f"'{field}' is empty; send the text the documents are ranked against", param=field
        )
    return value.encode("utf-8")


def parse_documents(
    value: Any, field: str = "documents", objects: bool = False
) -> tuple[list[bytes], list[str]]:
    """The documents: their UTF-8 payloads and their texts (for ``return_documents``).

    Args:
        value: the field's JSON value.
        field: its name, for messages.
        objects: also take objects ``{"text": "..."}`` (Cohere's and Jina's v1); their other
            fields are ignored.

    Raises:
        BadRequest: absent, not a list, an item of another type or blank (names
            ``field[i]``).
        EmptyInput: an empty list.
        TooLarge: more than :data:`~triton_embed.reranking.MAX_DOCUMENTS` documents.
    """
    forms = "a list of strings" + (' or of objects {"text": ...}' if objects else "")
    if value is None:
        raise BadRequest(f"'{field}' is required: {forms}", param=field)
    if not isinstance(value, list):
        raise BadRequest(f"'{field}' must be {forms}, got {quote(value)}", param=field)
    if not value:
        raise EmptyInput(f"'{field}' is an empty list; send at least one document", param=field)
    if len(value) > MAX_DOCUMENTS:
        raise TooLarge(
            f"'{field}' has {len(value)} documents; at most {MAX_DOCUMENTS} are reranked per "
            "request; split them over several requests",
            param=field,
            code="too_many_inputs",
        )
    texts = []
    for i, item in enumerate(value):
        text = item.get("text") if objects and isinstance(item, dict) else item
        if not isinstance(text, str):
            raise BadRequest(
                f"{field}[{i}] is {quote(item)}; '{field}' must be {forms}", param=field
            )
        if not text.strip():
            raise BadRequest(
                f"{field}[{i}] is empty; send at least one non-blank character in each document",
                param=field,
            )
        texts.append(text)
    return [text.encode("utf-8") for text in texts], texts


def parse_top_n(value: Any, field: str = "top_n") -> int | None:
    """``top_n``: the results to return (``None``: every document).

    Raises:
        BadRequest: not a whole number >= 1.
    """
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise BadRequest(
            f"'{field}' must be a whole number >= 1 (the best results to return; leave it out "
            f"for all); got {quote(value)}",
            param=field,
        )
    return value


def pair_options(
    *,
    truncation: Any = None,
    truncation_field: str = "truncation",
    raw_scores: bool | None = None,
    max_document_tokens: Any = None,
    max_document_tokens_field: str = "max_tokens_per_doc",
    instruction: Any = None,
) -> PairOptions:
    """A rerank request's options, read and checked (``None``: the server's default).

    Args:
        truncation: a :class:`~triton_embed.rerank_options.PairTruncation` (or its value).
        truncation_field: the field it came from, for messages.
        raw_scores: return the logits (``None``: the server's default, activated scores).
        max_document_tokens: a whole number >= 1: cut each document to it first.
        max_document_tokens_field: the field it came from (Cohere's ``max_tokens_per_doc``).
        instruction: a decoder reranker's instruction (vLLM's ``instruction``).

    Raises:
        BadRequest: a value outside its allowed set (names the API's field).
    """
    fields = {
        "truncation": truncation_field,
        "max_document_tokens": max_document_tokens_field,
        "instruction": "instruction",
    }
    if max_document_tokens is not None and type(max_document_tokens) is not int:
        raise BadRequest(
            f"'{max_document_tokens_field}' must be a whole number >= 1 (tokens kept per "
            f"document); got {quote(max_document_tokens)}",
            param=max_document_tokens_field,
        )
    try:
        return PairOptions(
            truncation=truncation,
            raw_scores=raw_scores,
            max_document_tokens=max_document_tokens,
            instruction=instruction,
        )
    except OptionError as exc:
        field = fields.get(exc.name, exc.name)
        raise BadRequest(f"'{field}' {exc.reason}; got {quote(exc.value)}", param=field) from None


def cut(payload: bytes, max_chars: int) -> bytes:
    """``payload``'s first ``max_chars`` characters (UTF-8), as the pair tokenizer cuts them.

    With truncation on, the pair tokenizer keeps that many characters of a query or document
    before tokenizing and refuses a text of more than 4 bytes a kept character; cutting here
    gives the same tokens and lets a document of any size (within ``--max-body-mb``) be
    truncated, as TEI and Cohere truncate it.

    >>> cut("naïve text".encode(), 3).decode()
    'naï'
    """
    if len(payload) <= max_chars:  # no more characters than bytes
        return payload
    return payload.decode("utf-8")[:max_chars].encode("utf-8")


def search_units(documents: int) -> int:
    """Cohere's billed search units of one query over ``documents`` documents (1 per 100)."""
    return max(1, math.ceil(documents / DOCUMENTS_PER_SEARCH_UNIT))


async def score(
    gateway: Gateway,
    state: RequestState,
    model: RerankerInfo,
    queries: Sequence[bytes],
    documents: Sequence[bytes],
    options: PairOptions,
    field: str,
) -> Scores:
    """Score the pairs with ``model`` within the request's token budget; count them.

    Args:
        gateway: the gateway (its pool and ``--max-request-tokens``).
        state: the request's state: its model, pairs and tokens are recorded there.
        model: the reranker.
        queries: one query for all documents, or one per document.
        documents: the documents.
        options: the request options.
        field: the request field of the documents (named by the token budget's message).

    Raises:
        TransportError: a piece failed (a pair named by its index in ``documents``), or the
            pairs are over the token budget.
    """
    state.model = model.name
    if options.truncation is not PairTruncation.NONE and model.max_chars:
        queries = [cut(q, model.max_chars) for q in queries]
        documents = [cut(d, model.max_chars) for d in documents]
    budget = gateway.pair_budget(model, field)
    sizes = [len(queries[0 if len(queries) == 1 else i]) + len(d) for i, d in enumerate(documents)]
    estimate = estimate_tokens(sizes, model.max_length)
    async with gateway.upstream_turn(state, model.name, estimate) as turn:
        result = await score_pairs(gateway.pool, model, queries, documents, options, budget)
        turn.tokens = int(result.num_tokens.sum())
    state.inputs = len(documents)
    state.tokens = turn.tokens
    return result
