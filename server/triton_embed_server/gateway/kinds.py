"""Which routes serve which kind of model, and the answer to a request for the other kind.

The catalog holds embedding models and rerankers in one name space
(:class:`~triton_embed.transport.catalog.ModelKind`), so a request that names a model of the
other kind (``/v1/embeddings`` with a reranker, a sparse or a multi-vector model,
``/v1/rerank`` with an embedding model, ``/embed_sparse`` or ``/embed_all`` with a dense one)
is told what the model is and where it is served, instead of "not found".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triton_embed.transport.catalog import ModelKind

from triton_embed_server.gateway.errors import BadRequest, NotFound, quote

if TYPE_CHECKING:
    from triton_embed_server.gateway.app import Gateway

#: The routes that serve each kind of model, as the messages name them.
KIND_ROUTES = {
    ModelKind.EMBEDDING: "POST /v1/embeddings, /embed (and TEI's POST /, /invocations)",
    ModelKind.RERANKER: "POST /v1/rerank, /v2/rerank, /rerank, /score, /v1/score",
    ModelKind.SPARSE: "POST /embed_sparse",
    ModelKind.MULTIVECTOR: "POST /embed_all",
    ModelKind.HYBRID: "POST /v1/embeddings, /embed_sparse and /embed_all",
}
#: Where the docs say how to serve a model of each kind.
KIND_DOCS = {
    ModelKind.EMBEDDING: "README.md, 'Any model, several per server'",
    ModelKind.RERANKER: "docs/rerank.md, 'Adding one'",
    ModelKind.SPARSE: "docs/sparse.md, 'Adding one'",
    ModelKind.MULTIVECTOR: "docs/sparse.md, 'Multi-vector'",
    ModelKind.HYBRID: "docs/sparse.md, 'Hybrid models'",
}
#: A kind of model in a sentence: one, and several.
KIND_NAMES = {
    ModelKind.EMBEDDING: "an embedding model",
    ModelKind.RERANKER: "a reranker",
    ModelKind.SPARSE: "a sparse model",
    ModelKind.MULTIVECTOR: "a multi-vector model",
    ModelKind.HYBRID: "a hybrid model (BGE-M3)",
}
KIND_PLURALS = {
    ModelKind.EMBEDDING: "embedding models",
    ModelKind.RERANKER: "rerankers",
    ModelKind.SPARSE: "sparse models",
    ModelKind.MULTIVECTOR: "multi-vector models",
    ModelKind.HYBRID: "hybrid models",
}


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


def model_of_kind(gateway: Gateway, name: str | None, kind: ModelKind, default: str | None) -> Any:
    """The model ``name`` of ``kind``, else ``default``, else the only one of ``kind`` served.

    Raises:
        Unavailable, NotFound, BadRequest: as :meth:`~.app.Gateway.model`; no model of
            ``kind`` is served (404), or several and the request names none (400, lists them).
    """
    if name is None:
        name = default
    if name is not None:
        return gateway.model(name, kind)
    served = gateway.visible(gateway.pool.catalog.of_kind(kind))
    if len(served) == 1:
        return gateway.model(served[0], kind)
    gateway.require_ready()
    if not served:
        raise NotFound(
            f"no {KIND_NAMES[kind].split(' ', 1)[1]} is served: the upstreams have none "
            f"ready ({KIND_DOCS[kind]}); GET /v1/models lists the models",
            param="model",
        )
    flag = "--default-reranker" if kind is ModelKind.RERANKER else "--default-model"
    raise BadRequest(
        f"several {KIND_PLURALS[kind]} are served ({', '.join(served)}): send 'model', or "
        f"start the gateway with {flag}",
        param="model",
    )
