"""OpenAI's embeddings API: ``POST /v1/embeddings`` and ``GET /v1/models``.

``POST /v1/embeddings`` takes OpenAI's request body (API reference, "Create embeddings"):

* ``input`` (required): a string, a list of strings, a list of token IDs or a list of
  token-ID lists (:func:`~triton_embed_server.gateway.inputs.parse_inputs`), at most 2,048;
* ``model`` (required): an ensemble name or its ``served_model_name``;
* ``encoding_format``: ``float`` (the API's default) or ``base64``: the base64 of each
  ``EMBEDDING`` element's bytes exactly as the server produced them (little-endian
  float32; nothing is parsed on that path). The ``openai`` Python SDK asks for ``base64``
  unless told otherwise and decodes it with ``numpy.frombuffer(..., "float32")``;
* ``dimensions``: the request parameter ``dimensions`` (a Matryoshka dimension of the model);
* extensions, as vLLM and NVIDIA NIM accept them: ``input_type`` (a prompt name: ``query``,
  ``document``) and ``truncate`` or ``truncation`` (``NONE``, ``END``, ``START``, ``CHUNK``);
* ``user``: accepted and ignored.

Any other field is 400 naming it. ``null`` counts as absent for the optional fields. With
token-ID input, ``input_type`` and ``truncate`` do not apply (the IDs are embedded as
given, and over-long ones are refused by the server) and are refused.

The answer is OpenAI's shape, ``{"object": "list", "data": [{"object": "embedding",
"index": i, "embedding": [...] | "<base64>"}], "model": <as requested>, "usage":
{"prompt_tokens": N, "total_tokens": N}}``, N the sum of ``NUM_TOKENS``.

``GET /v1/models`` lists every name ``model`` accepts (of the models the request's tenant
may use): each ensemble and each alias, of both kinds, in OpenAI's list shape plus
``root`` (the ensemble a name stands for, as vLLM writes it), ``kind`` (``embedding`` or
``reranker``), ``dimension`` (``null`` for a reranker) and ``max_length`` (the token budget
per text, or per query-document pair).

``model`` naming a reranker is 400 (``wrong_model_kind``, naming the routes that serve it).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from triton_embed.options import RequestOptions
from triton_embed.transport import inference
from triton_embed.transport.catalog import ModelInfo, ModelKind

from triton_embed_server.gateway.errors import BadRequest, quote
from triton_embed_server.gateway.inputs import (
    Inputs,
    embed_inputs,
    parse_inputs,
    request_options,
)

if TYPE_CHECKING:
    from triton_embed_server.gateway.app import Gateway, RequestState
    from triton_embed_server.gateway.tenants import Tenant

FIELDS = (
    "input",
    "model",
    "encoding_format",
    "dimensions",
    "input_type",
    "truncate",
    "truncation",
    "user",
)
ENCODINGS = ("float", "base64")
OWNED_BY = "triton-embed"
JSON = "application/json"


@dataclass(frozen=True)
class EmbeddingsRequest:
    """One ``POST /v1/embeddings`` body, read and checked.

    Attributes:
        model: the name as requested (echoed in the answer).
        inputs: texts or token-ID lists.
        encoding_format: ``float`` or ``base64``.
        options: the request options to send (``truncation``, ``input_type``,
            ``dimensions``).
        info: the ensemble ``model`` names (``None``: read without a catalog).
    """

    model: str
    inputs: Inputs
    encoding_format: str
    options: RequestOptions
    info: ModelInfo | None = None


def parse_embeddings_request(
    body: Any, resolve: Callable[[str], ModelInfo] | None = None
) -> EmbeddingsRequest:
    """Read an embeddings request body.

    Args:
        body: the decoded JSON body.
        resolve: the ensemble of a model name (raises for an unknown one); with it, the
            options are checked against that model (``dimensions`` not above its size).

    Raises:
        BadRequest: not an object, an unknown field, a missing or mistyped one, a value
            outside its set (each message names the field).
        EmptyInput, TooLarge: no inputs, or more than 2,048.
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = [k for k in body if k not in FIELDS]
    if unknown:
        raise BadRequest(
            f"unknown field {quote(unknown[0])}; the fields are {', '.join(FIELDS)}",
            param=unknown[0][:64],  # a field name of any length is quoted bounded
            code="unknown_field",
        )
    model = body.get("model")
    if model is None:
        raise BadRequest(
            "'model' is required: the name of an embedding model (GET /v1/models lists them)",
            param="model",
        )
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string", param="model")
    info = None if resolve is None else resolve(model)
    if "input" not in body or body["input"] is None:
        raise BadRequest(
            "'input' is required: a string, a list of strings, a list of token IDs or a "
            "list of token-ID lists",
            param="input",
        )
    encoding = body.get("encoding_format")
    encoding = "float" if encoding is None else encoding
    if encoding not in ENCODINGS:
        raise BadRequest(
            f"'encoding_format' must be 'float' or 'base64', got {quote(encoding)}",
            param="encoding_format",
        )
    truncate, truncation = body.get("truncate"), body.get("truncation")
    if truncate is not None and truncation is not None:
        raise BadRequest(
            "send one of 'truncate' and 'truncation' (the same option), not both",
            param="truncation",
        )
    inputs = parse_inputs(body["input"], "input")
    truncation_field = "truncate" if truncate is not None else "truncation"
    truncation = truncate if truncate is not None else truncation
    input_type = body.get("input_type")
    if inputs.token_ids is not None:
        for field, value in ((truncation_field, truncation), ("input_type", input_type)):
            if value is not None:
                raise BadRequest(
                    f"'{field}' applies to text input; token IDs are embedded as given (send "
                    "text, or leave it out)",
                    param=field,
                )
    options = request_options(
        truncation=truncation,
        truncation_field=truncation_field,
        input_type=input_type,
        dimensions=body.get("dimensions"),
        model=info,
    )
    return EmbeddingsRequest(model, inputs, encoding, options, info)


def render_embeddings(model: str, embeddings: inference.Embeddings, encoding: str) -> bytes:
    """OpenAI's embeddings response as JSON bytes.

    ``base64``: each element's bytes as the server sent them, base64-encoded. ``float``: the
    same bytes viewed as float32, written by ``orjson`` (each value the shortest decimal
    that reads back as the same float32).
    """
    if encoding == "base64":
        data = [
            {"object": "embedding", "index": i, "embedding": base64.b64encode(e).decode("ascii")}
            for i, e in enumerate(embeddings.elements)
        ]
    else:
        matrix = embeddings.matrix()
        data = [
            {"object": "embedding", "index": i, "embedding": matrix[i]} for i in range(len(matrix))
        ]
    tokens = int(embeddings.num_tokens.sum())
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


async def embeddings(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``POST /v1/embeddings`` (its body already read: ``state.body``)."""
    parsed = parse_embeddings_request(
        state.body, lambda name: gateway.model(name, ModelKind.EMBEDDING)
    )
    model = parsed.info or gateway.model(parsed.model, ModelKind.EMBEDDING)
    result = await embed_inputs(gateway, state, model, parsed.inputs, parsed.options, "input")
    return Response(
        render_embeddings(parsed.model, result, parsed.encoding_format), media_type=JSON
    )


def render_models(gateway: Gateway, tenant: Tenant | None = None) -> bytes:
    """OpenAI's model list: every ensemble and every alias (those ``tenant`` may use)."""
    catalog = gateway.pool.catalog
    data = []
    for name in catalog.names():
        info = catalog.resolve(name)
        if info is None:
            continue
        if tenant is not None and not gateway.tenancy.may_use(
            tenant, info.name, gateway.resolve_name
        ):
            continue
        data.append(
            {
                "id": name,
                "object": "model",
                "created": gateway.started_at,
                "owned_by": OWNED_BY,
                "root": info.name,
                "kind": info.kind.value,
                "dimension": info.dimension if isinstance(info, ModelInfo) else None,
                "max_length": info.max_length,
            }
        )
    return orjson.dumps({"object": "list", "data": data})


async def models(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``GET /v1/models``."""
    gateway.require_ready()
    return Response(render_models(gateway, state.tenant), media_type=JSON)
