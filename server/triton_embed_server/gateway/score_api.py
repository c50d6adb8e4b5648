"""vLLM's score API: ``POST /score`` and ``POST /v1/score`` (vLLM's ``ScoreTextRequest``).

The body (``vllm/entrypoints/pooling/scoring/protocol.py``):

* ``model``: a reranker (absent: the default reranker, as for ``/v1/rerank``);
* ``text_1``: a string or a list of strings; ``text_2``: a string or a list of strings.
  One ``text_1`` is scored against every ``text_2`` (1:N); as many ``text_1`` as ``text_2``
  are scored pair by pair (N:N); any other count is 400, as vLLM answers it. At most 1,000
  pairs, none blank;
* ``instruction``, ``use_activation`` (``false``: logits), ``max_tokens_per_doc``, as vLLM
  takes them; ``user``: accepted and ignored. Any other field is 400.

The answer is vLLM's ``ScoreResponse``: ``{"id", "object": "list", "created", "model",
"data": [{"index", "object": "score", "score"}], "usage": {"prompt_tokens", "total_tokens"}}``,
``data`` in the order of the pairs (not ranked). Errors are in OpenAI's envelope, as vLLM's.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from triton_embed_server.gateway import pairs
from triton_embed_server.gateway.errors import BadRequest, quote
from triton_embed_server.gateway.pairs import (
    check_fields,
    pair_options,
    parse_documents,
    parse_flag,
    parse_model,
    parse_query,
)

if TYPE_CHECKING:
    from triton_embed_server.gateway.app import Gateway, RequestState

JSON = "application/json"
FIELDS = (
    "model",
    "text_1",
    "text_2",
    "instruction",
    "use_activation",
    "max_tokens_per_doc",
    "user",
)


def _texts(value: Any, field: str) -> list[bytes]:
    """``text_1`` or ``text_2``: a string, or a list of 1 to 1,000 strings, as UTF-8."""
    if isinstance(value, str):
        return [parse_query(value, field)]
    return parse_documents(value, field)[0]


def parse_score_request(body: Any) -> tuple[str | None, list[bytes], list[bytes], Any]:
    """Read a score body: the model, the queries (1 or N), the documents (N), the options.

    Raises:
        BadRequest, EmptyInput, TooLarge: a malformed field (names it), or counts that are
            neither 1:N nor N:N.
    """
    body = check_fields(body, FIELDS)
    name = parse_model(body)
    queries = _texts(body.get("text_1"), "text_1")
    documents = _texts(body.get("text_2"), "text_2")
    if len(queries) not in (1, len(documents)):
        raise BadRequest(
            f"'text_1' has {len(queries)} texts and 'text_2' {len(documents)}: send one "
            "text_1 for all text_2 (1:N) or as many as text_2 (N:N)",
            param="text_1",
        )
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest(f"'user' must be a string, got {quote(user)}", param="user")
    options = pair_options(
        raw_scores=None if parse_flag(body, "use_activation", True) else True,
        max_document_tokens=body.get("max_tokens_per_doc"),
        instruction=body.get("instruction"),
    )
    return name, queries, documents, options


async def score(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``POST /score`` and ``POST /v1/score`` (its body already read: ``state.body``)."""
    name, queries, documents, options = parse_score_request(state.body)
    model = gateway.reranker(name)
    result = await pairs.score(gateway, state, model, queries, documents, options, "text_2")
    answer = {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": name or model.name,
        "data": [
            {"index": i, "object": "score", "score": float(s)}
            for i, s in enumerate(result.scores.tolist())
        ],
        "usage": {"prompt_tokens": state.tokens, "total_tokens": state.tokens},
    }
    return Response(orjson.dumps(answer), media_type=JSON)
