"""Which routes serve which kind of model, and the answer to a request for the other kind.

The catalog holds embedding models and rerankers in one name space
(:class:`~triton_embed.transport.catalog.ModelKind`), so a request that names a model of the
other kind (``/v1/embeddings`` with a reranker, ``/v1/rerank`` with an embedding model) is
told what the model is and where it is served, instead of "not found".
"""

from __future__ import annotations

from triton_embed.transport.catalog import ModelKind

from triton_embed_server.gateway.errors import BadRequest, quote

#: The routes that serve each kind of model, as the messages name them.
KIND_ROUTES = {
    ModelKind.EMBEDDING: "POST /v1/embeddings, /embed (and TEI's POST /, /invocations)",
    ModelKind.RERANKER: "POST /v1/rerank, /v2/rerank, /rerank, /score, /v1/score",
}
#: A kind of model in a sentence: one, and several.
KIND_NAMES = {ModelKind.EMBEDDING: "an embedding model", ModelKind.RERANKER: "a reranker"}
KIND_PLURALS = {ModelKind.EMBEDDING: "embedding models", ModelKind.RERANKER: "rerankers"}


def wrong_kind(name: str, has: ModelKind, wanted: ModelKind) -> BadRequest:
    """The 400 of a request for a ``wanted`` model that names ``name``, a model of kind ``has``.

    >>> wrong_kind("rerank", ModelKind.RERANKER, ModelKind.EMBEDDING).code
    'wrong_model_kind'
    """
    return BadRequest(
        f"the model {quote(name)} is {KIND_NAMES[has]}, not {KIND_NAMES[wanted]}: "
        f"{KIND_PLURALS[has]} are served by {KIND_ROUTES[has]}, {KIND_PLURALS[wanted]} by "
        f"{KIND_ROUTES[wanted]}; GET /v1/models lists each model's kind",
        param="model",
        code="wrong_model_kind",
    )
