"""text-embeddings-inference's API: ``/embed``, ``/tokenize``, ``/info``, ``/health``.

The request and response shapes are TEI's (``router/src/http/types.rs`` and ``server.rs`` of
huggingface/text-embeddings-inference; its OpenAPI at
https://huggingface.github.io/text-embeddings-inference/), so TEI clients work unchanged.
TEI serves one model; these routes use the gateway's default model (``--default-model``).

* ``POST /embed`` ``{"inputs", "normalize", "truncate", "truncation_direction",
  "prompt_name", "dimensions"}`` -> ``[[float, ...], ...]`` (one vector per input, also for
  a single string). ``inputs`` takes the same four forms as OpenAI's ``input``.
  ``truncate`` (default false) maps to the request parameter ``truncation``: ``NONE``, or
  with ``true`` ``END`` (``truncation_direction`` ``Right``, the default) or ``START``
  (``Left``). ``prompt_name`` is ``input_type``. ``normalize`` (default true), as TEI, which
  never applies a model's ``Normalize`` module itself: ``false`` is the request parameter
  ``normalize=false``, so the embedder step returns the pooled vectors without L2
  normalization (Haystack's TEI embedders send it by default); ``true`` returns them
  L2-normalized (normalized here for a model that does not normalize).
* ``POST /embed_sparse`` ``{"inputs", "truncate", "truncation_direction", "prompt_name"}``
  plus the gateway's ``model`` (a sparse model; absent: ``--default-model`` when it is one,
  else the only sparse model served) and two extensions, ``top_k`` and ``threshold`` (the
  sparse ensemble's request parameters, docs/sparse.md) -> ``[[{"index", "value"}, ...],
  ...]``: per input its non-zero vocabulary entries, ascending by index, as TEI answers.
  A dense model named here is 400 (``wrong_model_kind``), as a sparse one named in
  ``/embed`` or ``/v1/embeddings`` is.
* ``POST /embed_all`` ``{"inputs", "truncate", "truncation_direction", "prompt_name"}`` plus
  the gateway's ``model`` (a multi-vector model; absent: ``--default-model`` when it is one,
  else the only multi-vector model served) -> ``[[[float, ...], ...], ...]``: per input one
  vector per token, as TEI answers (TEI's are the raw last hidden states; a ColBERT model's
  here are its projected, L2-normalized vectors, docs/sparse.md). ``prompt_name`` is the
  ``input_type``: ``query`` or ``document``. A dense model named here is 400
  (``wrong_model_kind``), as a multi-vector one named in ``/embed`` or ``/v1/embeddings`` is.
* ``POST /tokenize`` ``{"inputs", "add_special_tokens", "prompt_name"}`` ->
  ``[[{"id", "text", "special", "start", "stop"}, ...], ...]``: the IDs the model's
  tokenizer step makes (``truncation=NONE``: all of them, or 400 past the token budget).
  The step returns IDs only, so ``text``, ``special``, ``start`` and ``stop`` are ``null``
  (TEI fills them from the tokenizer's offsets). ``add_special_tokens: false`` is 400: the
  step always adds the model's special tokens. Its inverse, ``POST /decode``, is
  :mod:`~triton_embed_server.gateway.tei_decode`'s.
* ``GET /info``: TEI's ``Info`` object from the model's config; ``model_type`` is
  ``{"embedding": {"pooling": ...}}``, or for a reranker ``{"reranker": {"id2label":
  {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}`` (TEI's one-label classifier, the label
  ``transformers`` names by default) with the gateway's ``family``. ``--default-model`` may
  name a reranker: ``/info`` then describes it, and ``/embed`` refuses it (400).
* ``GET /health``: 200 (empty body) while at least one upstream is ready, else 503.
* TEI's base-URL routes (``router/src/http/server.rs``): ``POST /`` and ``POST
  /invocations`` (SageMaker) are ``/embed`` (what TEI maps them to for an embedding model;
  ``huggingface_hub.InferenceClient(model="http://host:port").feature_extraction`` posts to
  ``/``), ``GET /`` and ``GET /ping`` (SageMaker) are ``/health``.

Unknown fields are 400 (TEI ignores them; a misspelt option is better refused).
"""

from __future__ import annotations

import asyncio
import dataclasses
from importlib import metadata
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response
from triton_embed.multivector_options import MultiVectorOptions
from triton_embed.options import OptionError, RequestOptions, Truncation
from triton_embed.reranking import MAX_DOCUMENTS
from triton_embed.serving_limits import token_matrix_bytes
from triton_embed.sparse_options import SparseOptions
from triton_embed.transport import inference
from triton_embed.transport.catalog import ModelInfo, ModelKind, MultiVectorInfo, RerankerInfo

from triton_embed_server.gateway.errors import BadRequest, TooLarge, Unavailable, quote
from triton_embed_server.gateway.fair import estimate_tokens
from triton_embed_server.gateway.inputs import (
    FORMS,
    Inputs,
    check_not_empty,
    embed_inputs,
    parse_inputs,
    request_options,
)

if TYPE_CHECKING:
    from triton_embed_server.gateway.app import Gateway, RequestState

EMBED_FIELDS = (
    "inputs",
    "normalize",
    "truncate",
    "truncation_direction",
    "prompt_name",
    "dimensions",
)
TOKENIZE_FIELDS = ("inputs", "add_special_tokens", "prompt_name")
SPARSE_FIELDS = (
    "inputs",
    "truncate",
    "truncation_direction",
    "prompt_name",
    "model",
    "top_k",
    "threshold",
)
EMBED_ALL_FIELDS = ("inputs", "truncate", "truncation_direction", "prompt_name", "model")
DIRECTIONS = {"right": Truncation.END, "left": Truncation.START}
JSON = "application/json"


def _object(body: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = [k for k in body if k not in fields]
    if unknown:
        raise BadRequest(f"unknown field {quote(unknown[0])}; the fields are {', '.join(fields)}")
    return body


def _flag(body: dict[str, Any], field: str, default: bool) -> bool:
    value = body.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{field}' must be true or false, got {quote(value)}")
    return value


def _inputs(value: Any) -> Inputs:
    if value is None:
        raise BadRequest(f"'inputs' is required: {FORMS}")
    return parse_inputs(value, "inputs")


def parse_embed_request(body: Any, model: ModelInfo) -> tuple[Inputs, RequestOptions, bool]:
    """Read a ``POST /embed`` body for ``model``.

    Returns:
        The inputs, the request options (``normalize=False`` when ``normalize`` is false),
        and whether the gateway must L2-normalize the vectors (``normalize`` asked for and
        the model not known to normalize).

    Raises:
        BadRequest: a malformed field.
        EmptyInput, TooLarge: no inputs, or more than 2,048.
    """
    body = _object(body, EMBED_FIELDS)
    inputs = _inputs(body.get("inputs"))
    normalize = _flag(body, "normalize", True)
    truncation = _truncation(body, inputs)
    prompt_name = body.get("prompt_name")
    options = request_options(
        truncation=truncation,
        input_type=prompt_name,
        input_type_field="prompt_name",
        dimensions=body.get("dimensions"),
        model=model,
    )
    if not normalize:  # the embedder step returns the pooled vectors as they are
        options = dataclasses.replace(options, normalize=False)
    return inputs, options, normalize and model.normalize is not True


def _truncation(body: dict[str, Any], inputs: Inputs) -> Truncation | None:
    """TEI's ``truncate`` and ``truncation_direction`` as a truncation (``None``: token IDs).

    Raises:
        BadRequest: a malformed field, or a text option sent with token IDs.
    """
    truncate = _flag(body, "truncate", False)
    direction = body.get("truncation_direction")
    direction = "right" if direction is None else direction
    if not isinstance(direction, str) or direction.lower() not in DIRECTIONS:
        raise BadRequest(
            f"'truncation_direction' must be 'Left' or 'Right', got {quote(direction)}"
        )
    if inputs.token_ids is None:
        return DIRECTIONS[direction.lower()] if truncate else Truncation.NONE
    for field, value in (("truncate", truncate or None), ("prompt_name", body.get("prompt_name"))):
        if value is not None:
            raise BadRequest(
                f"'{field}' applies to text input; token IDs are embedded as given (send "
                "text, or leave it out)"
            )
    return None


def parse_sparse_request(body: Any) -> tuple[Inputs, SparseOptions, str | None]:
    """Read a ``POST /embed_sparse`` body: the inputs, the options and the ``model`` asked for.

    Raises:
        BadRequest: a malformed field (names it and what it takes).
        EmptyInput, TooLarge: no inputs, or more than 2,048.
    """
    body = _object(body, SPARSE_FIELDS)
    inputs = _inputs(body.get("inputs"))
    truncation = _truncation(body, inputs)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {quote(model)}", param="model")
    text = request_options(
        truncation=truncation, input_type=body.get("prompt_name"), input_type_field="prompt_name"
    )
    try:
        options = SparseOptions(
            truncation=text.truncation,
            input_type=text.input_type,
            top_k=body.get("top_k"),
            threshold=body.get("threshold"),
        )
    except OptionError as exc:
        raise BadRequest(str(exc), param=exc.name) from None
    return inputs, options, model


async def embed_sparse(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``POST /embed_sparse``: TEI's sparse embeddings, ``[[{"index", "value"}, ...], ...]``."""
    inputs, options, name = parse_sparse_request(state.body)
    model = gateway.vectors_model(name, ModelKind.SPARSE)
    result = await embed_inputs(
        gateway, state, model, inputs, options, "inputs", options.text_options()
    )
    try:
        vectors = result.sparse()
    except ValueError as exc:
        raise inference.bad_answer(model.name, exc) from None
    # float32 scalars, so orjson writes each weight's shortest float32 form, as TEI does.
    answer = [
        [{"index": i, "value": v} for i, v in zip(idx.tolist(), val, strict=True)]
        for idx, val in vectors
    ]
    return Response(orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY), media_type=JSON)


def parse_embed_all_request(body: Any) -> tuple[Inputs, MultiVectorOptions, str | None]:
    """Read a ``POST /embed_all`` body: the inputs, the options and the ``model`` asked for.

    Raises:
        BadRequest: a malformed field (names it and what it takes).
        EmptyInput, TooLarge: no inputs, or more than 2,048.
    """
    body = _object(body, EMBED_ALL_FIELDS)
    inputs = _inputs(body.get("inputs"))
    truncation = _truncation(body, inputs)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {quote(model)}", param="model")
    try:
        options = MultiVectorOptions(truncation=truncation, input_type=body.get("prompt_name"))
    except OptionError as exc:
        field = "prompt_name" if exc.name == "input_type" else "truncate"
        raise BadRequest(str(exc).replace(exc.name, field, 1), param=field) from None
    return inputs, options, model


def check_embed_all_size(model: MultiVectorInfo, inputs: int) -> None:
    """Refuse an ``/embed_all`` request whose answer could exceed one server response.

    An ``/embed_all`` response carries at most the model's ``max_response_bytes`` of float32
    token matrices (16 MiB by default; about 10 bytes of JSON per value, so about 45 MB of
    JSON), whatever the pieces the gateway splits it into: at most ``max_response_bytes //
    (4 x max_length x dim)`` inputs, each counted at the model's full token budget (the
    bound is known before any work is done). A bigger job is several requests, or the
    client library's ``embed_tokens`` (raw float32, split for you).

    Raises:
        TooLarge: more inputs than that (413, naming the arithmetic).
    """
    if model.dimension is None or model.max_length is None:
        return
    per_input = token_matrix_bytes(model.max_length, model.dimension)
    most = max(1, model.max_response_bytes // per_input)
    if inputs > most:
        raise TooLarge(
            f"/embed_all takes at most {most} inputs for model {quote(model.name)}, got "
            f"{inputs}: each may carry {model.max_length} tokens x {model.dimension} values x "
            f"4 bytes = {per_input} bytes and a response at most {model.max_response_bytes} "
            f"bytes (the model's max_response_bytes); send at most {most} inputs per request",
            param="inputs",
        )


async def embed_all(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``POST /embed_all``: TEI's token embeddings, ``[[[float, ...], ...], ...]``.

    Bounded by :func:`check_embed_all_size`; the JSON is written off the event loop.
    """
    inputs, options, name = parse_embed_all_request(state.body)
    model = gateway.vectors_model(name, ModelKind.MULTIVECTOR)
    check_embed_all_size(model, len(inputs))
    result = await embed_inputs(
        gateway, state, model, inputs, options, "inputs", options.text_options()
    )
    try:
        matrices = result.token_matrices(getattr(model, "rows_skipped", 0))
    except ValueError as exc:
        raise inference.bad_answer(model.name, exc) from None
    body = await asyncio.to_thread(orjson.dumps, matrices, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, media_type=JSON)


def l2_normalized(matrix: np.ndarray) -> np.ndarray:
    """Rows of ``matrix`` divided by their L2 norm (zero rows stay zero), float32."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.where(norms == 0, 1, norms)).astype(np.float32, copy=False)


async def embed(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``POST /embed`` (also ``POST /`` and ``POST /invocations``, as TEI routes them)."""
    model = gateway.model(gateway.default_model, ModelKind.EMBEDDING)
    inputs, options, normalize = parse_embed_request(state.body, model)
    result = await embed_inputs(gateway, state, model, inputs, options, "inputs")
    matrix = result.matrix()
    if normalize:
        matrix = l2_normalized(matrix)
    return Response(orjson.dumps(matrix, option=orjson.OPT_SERIALIZE_NUMPY), media_type=JSON)


def parse_tokenize_request(body: Any) -> tuple[list[bytes], RequestOptions]:
    """Read a ``POST /tokenize`` body: the texts and the request options.

    Raises:
        BadRequest: a malformed field, token IDs as input, or ``add_special_tokens: false``.
        EmptyInput, TooLarge: no inputs, or more than 2,048.
    """
    body = _object(body, TOKENIZE_FIELDS)
    inputs = _inputs(body.get("inputs"))
    if inputs.texts is None:
        raise BadRequest("'inputs' of /tokenize must be a string or a list of strings")
    if not _flag(body, "add_special_tokens", True):
        raise BadRequest(
            "add_special_tokens=false is not supported: the model's tokenizer step always "
            "adds its special tokens"
        )
    options = request_options(
        truncation=Truncation.NONE,
        input_type=body.get("prompt_name"),
        input_type_field="prompt_name",
    )
    return inputs.texts, options


async def tokenize(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``POST /tokenize`` (its body already read: ``state.body``)."""
    model = gateway.model(gateway.default_model, ModelKind.EMBEDDING)
    state.model = model.name
    texts, options = parse_tokenize_request(state.body)
    check_not_empty(Inputs(texts=texts), model, "inputs")
    estimate = estimate_tokens([len(t) for t in texts], model.max_length)
    async with gateway.upstream_turn(state, model.name, estimate) as turn:
        token_ids = await inference.tokenize(gateway.pool, model, texts, options)
        turn.tokens = sum(len(ids) for ids in token_ids)
    tokens = [
        [{"id": i, "text": None, "special": None, "start": None, "stop": None} for i in ids]
        for ids in token_ids
    ]
    return Response(orjson.dumps(tokens), media_type=JSON)


def version() -> str:
    """The installed ``triton-embed`` version ("unknown" when not installed)."""
    try:
        return metadata.version("triton-embed")
    except metadata.PackageNotFoundError:
        return "unknown"


#: TEI's ``model_type`` of a reranker: a one-label classifier (``transformers``' label name).
RERANKER_TYPE = {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}


def render_info(gateway: Gateway, model: ModelInfo | RerankerInfo) -> dict[str, Any]:
    """TEI's ``Info`` for ``model``; what the config does not state is ``null`` or left out."""
    info: dict[str, Any] = {
        "model_id": model.served_model_name or model.name,
        "model_sha": None,
        "model_dtype": model.dtype,
        "served_model_name": model.name,
    }
    if isinstance(model, RerankerInfo):
        info["model_type"] = {"reranker": {**RERANKER_TYPE, "family": model.family}}
        info.update(
            {
                "max_concurrent_requests": gateway.max_in_flight,
                "max_input_length": model.max_length,
                "max_batch_requests": model.max_batch_size,
                "max_client_batch_size": MAX_DOCUMENTS,
                "auto_truncate": False,
                "version": version(),
            }
        )
        return info
    if model.kind is ModelKind.SPARSE:  # TEI names a SPLADE model's pooling "splade"
        info["model_type"] = {"embedding": {"pooling": "splade"}}
    elif model.pooling is not None:
        info["model_type"] = {"embedding": {"pooling": model.pooling}}
    info.update(
        {
            "max_concurrent_requests": gateway.max_in_flight,
            "max_input_length": model.max_length,
            "max_batch_tokens": model.max_batch_tokens,
            "max_batch_requests": model.max_batch_size,
            "max_client_batch_size": inference.MAX_INPUTS,
            "auto_truncate": False,
            "tokenization_workers": None,
            "version": version(),
            "sha": None,
            "docker_label": None,
            "dimension": model.dimension,
            "normalize": model.normalize,
        }
    )
    return info


async def info(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``GET /info`` (403 for a tenant that may not use the default model)."""
    model = gateway.model(gateway.default_model)
    if state.tenant is not None:
        gateway.tenancy.check_model(state.tenant, model.name, gateway.resolve_name)
    state.model = model.name
    return Response(orjson.dumps(render_info(gateway, model)), media_type=JSON)


async def health(gateway: Gateway, request: Request, state: RequestState) -> Response:
    """``GET /health``: 200 while an upstream is ready, else 503 (TEI's ``Unhealthy``)."""
    if not gateway.pool.any_ready():
        raise Unavailable("no upstream is ready")
    return Response(b"", status_code=200)
