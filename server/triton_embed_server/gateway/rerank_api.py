"""The rerank APIs: Cohere's and Jina's ``/v1/rerank``, Cohere's ``/v2/rerank``, ``/rerank``.

**Cohere and Jina** (``POST /v1/rerank``, ``POST /v2/rerank``; what the ``cohere`` SDK's
``Client.rerank`` and ``ClientV2.rerank`` post, Jina's ``/v1/rerank`` and vLLM's, which
follow the same shape):

* ``model``: a reranker's ensemble name or ``served_model_name`` (absent: the default
  reranker, ``--default-reranker`` or the only one served);
* ``query`` (required) and ``documents`` (required): strings, or on ``/v1/rerank`` objects
  ``{"text": ...}`` as Cohere's v1 and Jina take them; 1 to 1,000;
* ``top_n``: the best results to return (absent: all); ``return_documents`` (default false):
  each result carries ``document: {"text": ...}``;
* ``max_tokens_per_doc``: the request parameter ``max_document_tokens``;
* ``rank_fields`` (Cohere v1): absent or ``["text"]`` (the only field ranked);
* ``instruction`` and ``use_activation`` (vLLM's): a decoder reranker's instruction, and
  ``false`` for the logits (the request parameter ``raw_scores``);
* ``priority`` (Cohere v2) and ``user``: accepted and ignored. Any other field is 400.

The answer: ``{"id", "model", "results": [{"index", "relevance_score", "document"?}],
"meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": S}, "tokens":
{"input_tokens": N}}, "usage": {"prompt_tokens": N, "total_tokens": N}}``: results best
first (ties by lower index), cut to ``top_n``; ``S`` is one search unit per 100 documents
(Cohere's billing), ``N`` the sum of ``NUM_TOKENS``; ``usage`` is Jina's and vLLM's. Errors
are Cohere's envelope, ``{"message": "..."}``.

**TEI and vLLM** (``POST /rerank``): the body's fields choose the API. With ``texts`` it is
text-embeddings-inference's (``router/src/http/types.rs``, ``RerankRequest``): ``query``,
``texts``, ``raw_scores`` (default false), ``return_text`` (default false), ``truncate``
(default false: an over-long pair is 400, request parameter ``truncation=none``; true:
``longest_first``), ``truncation_direction`` (``Right`` only: the reranker cuts a pair at
its end), and the gateway's ``model`` (absent: the default reranker); it answers
``[{"index", "score", "text"?}]`` best first, errors in TEI's envelope. With ``documents``
it is vLLM's ``/rerank`` (Jina's shape, as ``/v1/rerank`` above), errors in OpenAI's
envelope, as vLLM answers them.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from triton_embed.rerank_options import PairTruncation
from triton_embed.reranking import rank

from triton_embed_server.gateway.errors import OPENAI, BadRequest, quote
from triton_embed_server.gateway.pairs import (
    check_fields,
    pair_options,
    parse_documents,
    parse_flag,
    parse_model,
    parse_query,
    parse_top_n,
    score,
    search_units,
)

if TYPE_CHECKING:
    from triton_embed_server.gateway.app import Gateway, RequestState

JSON = "application/json"
COHERE_FIELDS = (
    "model",
    "query",
    "documents",
    "top_n",
    "return_documents",
    "max_tokens_per_doc",
    "rank_fields",
    "instruction",
    "use_activation",
    "priority",
    "user",
)
TEI_FIELDS = (
    "query",
    "texts",
    "raw_scores",
    "return_text",
    "truncate",
    "truncation_direction",
    "model",
)


def _rank_fields(value: Any) -> None:
    """Cohere v1's ``rank_fields``: only ``text`` is ranked.

    Raises:
        BadRequest: anything but absent, ``null`` or ``["text"]``.
    """
    if value is None or value == ["text"]:
        return
    raise BadRequest(
        f"'rank_fields' may only be [\"text\"]: the reranker ranks each document's text; got "
        f"{quote(value)}",
        param="rank_fields",
    )


async def _cohere(gateway: Gateway, state: RequestState, objects: bool) -> Response:
    """One Cohere/Jina/vLLM rerank request (``objects``: documents may be ``{"text": ...}``)."""
    body = check_fields(state.body, COHERE_FIELDS)
    name = parse_model(body)
    model = gateway.reranker(name)
    query = parse_query(body.get("query"))
    payloads, texts = parse_documents(body.get("documents"), objects=objects)
    top_n = parse_top_n(body.get("top_n"))
    return_documents = parse_flag(body, "return_documents", False)
    use_activation = parse_flag(body, "use_activation", True)
    _rank_fields(body.get("rank_fields"))
    for ignored in ("priority", "user"):
        value = body.get(ignored)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, str))):
            raise BadRequest(f"'{ignored}' must be a number or a string", param=ignored)
    options = pair_options(
        raw_scores=None if use_activation else True,
        max_document_tokens=body.get("max_tokens_per_doc"),
        instruction=body.get("instruction"),
    )
    result = await score(gateway, state, model, [query], payloads, options, "documents")
    results = []
    for i in rank(result.scores, top_n).tolist():
        item: dict[str, Any] = {"index": i, "relevance_score": float(result.scores[i])}
        if return_documents:
            item["document"] = {"text": texts[i]}
        results.append(item)
    tokens = state.tokens
    answer = {
        "id": str(uuid.uuid4()),
        "model": name or model.name,
        "results": results,
        "meta": {
            "api_version": {"version": "2"},
            "billed_units": {"search_units": search_units(len(payloads))},
            "tokens": {"input_tokens": tokens},
        },
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return Response(orjson.dumps(answer), media_type=JSON)


async def rerank_v1(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``POST /v1/rerank``: Cohere's v1 and Jina's (documents: strings or ``{"text"}``)."""
    return await _cohere(gateway, state, objects=True)


async def rerank_v2(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``POST /v2/rerank``: Cohere's v2 (documents: strings)."""
    return await _cohere(gateway, state, objects=False)


async def _tei(gateway: Gateway, state: RequestState) -> Response:
    """TEI's ``/rerank``: ``[{"index", "score", "text"?}]``, best first."""
    body = check_fields(state.body, TEI_FIELDS)
    model = gateway.reranker(parse_model(body))
    query = parse_query(body.get("query"))
    payloads, texts = parse_documents(body.get("texts"), "texts")
    raw_scores = parse_flag(body, "raw_scores", False)
    return_text = parse_flag(body, "return_text", False)
    truncate = parse_flag(body, "truncate", False)
    direction = body.get("truncation_direction")
    if direction is not None and (not isinstance(direction, str) or direction.lower() != "right"):
        raise BadRequest(
            "'truncation_direction' must be 'Right' (the reranker cuts a pair at its end); "
            f"got {quote(direction)}",
            param="truncation_direction",
        )
    options = pair_options(
        truncation=PairTruncation.LONGEST_FIRST if truncate else PairTruncation.NONE,
        truncation_field="truncate",
        raw_scores=True if raw_scores else None,
    )
    result = await score(gateway, state, model, [query], payloads, options, "texts")
    ranks = []
    for i in rank(result.scores).tolist():
        item: dict[str, Any] = {"index": i, "score": float(result.scores[i])}
        if return_text:
            item["text"] = texts[i]
        ranks.append(item)
    return Response(orjson.dumps(ranks), media_type=JSON)


async def rerank(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``POST /rerank``: TEI's with ``texts``, vLLM's (Jina's shape) with ``documents``."""
    body = state.body
    if isinstance(body, dict) and "documents" in body and "texts" not in body:
        state.api = OPENAI  # vLLM answers its errors in OpenAI's envelope
        return await _cohere(gateway, state, objects=True)
    if isinstance(body, dict) and "texts" not in body:
        raise BadRequest(
            "'texts' is required (text-embeddings-inference's /rerank: a list of strings); or "
            "send 'documents' instead (vLLM's and Jina's /rerank)",
            param="texts",
        )
    return await _tei(gateway, state)
