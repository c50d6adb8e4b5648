"""What a request asks to embed, read and checked: its inputs and its request options.

Both APIs take the same four forms of input (OpenAI's ``input``, TEI's ``inputs``):

* a string: one text;
* a list of strings: several texts;
* a list of whole numbers: one input given as token IDs;
* a list of lists of whole numbers: several inputs given as token IDs.

Texts go to the ensemble as UTF-8; token IDs go to its embedder step as little-endian int32
(:func:`triton_embed.codec.encode_token_ids`) and are validated there (vocabulary, token
budget). A request holds at most :data:`~triton_embed.transport.inference.MAX_INPUTS`
inputs. The options are read once, into one :class:`triton_embed.options.RequestOptions`
value (the one parser of their values), which the gateway's checks, its request merging and
the transport read as it is; it becomes KServe v2 request parameters only where the Triton
request is built (:mod:`triton_embed.transport.inference`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from triton_embed.options import (
    DIMENSIONS,
    INPUT_TYPE,
    OptionError,
    RequestOptions,
    Truncation,
    parse_input_type,
)
from triton_embed.transport import inference
from triton_embed.transport.catalog import ModelInfo
from triton_embed.transport.hybrid_info import head_options
from triton_embed.transport.inference import MAX_INPUTS

from triton_embed_server.gateway.errors import BadRequest, EmptyInput, TooLarge, quote
from triton_embed_server.gateway.fair import estimate_tokens

if TYPE_CHECKING:
    from triton_embed_server.gateway.app import Gateway, RequestState

#: The largest token ID int32 can carry.
MAX_TOKEN_ID = 2**31 - 1
#: The largest ``dimensions`` any model could have (int32; the request parameter is int64
#: on the wire, and 2**63 or more would overflow it).
MAX_DIMENSIONS = 2**31 - 1
#: The longest prompt name (``input_type``) sent on; the models' are a word or two.
MAX_PROMPT_NAME_CHARS = 256
FORMS = "a string, a list of strings, a list of token IDs or a list of token-ID lists"


@dataclass(frozen=True)
class Inputs:
    """A request's inputs: texts or token-ID lists (one of the two is set).

    Attributes:
        texts: UTF-8 payloads, one per input.
        token_ids: token-ID lists, one per input.
    """

    texts: list[bytes] | None = None
    token_ids: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids or [])


def _type_name(value: Any) -> str:
    return {
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _token_ids(values: list[Any], where: str) -> list[int]:
    """``values`` checked as token IDs (whole numbers from 0 to :data:`MAX_TOKEN_ID`).

    Raises:
        BadRequest: names the first bad element, ``where[j]``.
    """
    if not all(type(v) is int and 0 <= v <= MAX_TOKEN_ID for v in values):
        j, bad = next(
            (j, v) for j, v in enumerate(values) if type(v) is not int or not 0 <= v <= MAX_TOKEN_ID
        )
        raise BadRequest(
            f"{where}[{j}] is {quote(bad)}; a token ID is a whole number from 0 to {MAX_TOKEN_ID}",
            param=where.split("[", 1)[0],
        )
    return values


def parse_inputs(value: Any, field: str) -> Inputs:
    """Read ``value`` (the request's ``input`` / ``inputs``) in one of its four forms.

    Args:
        value: the field's JSON value.
        field: its name, for messages.

    Raises:
        BadRequest: another type, a list mixing forms, or a bad token ID (names the
            element, e.g. ``input[2]``).
        EmptyInput: an empty list.
        TooLarge: more than :data:`MAX_INPUTS` inputs.
    """
    if isinstance(value, str):
        return Inputs(texts=[value.encode("utf-8")])
    if not isinstance(value, list):
        raise BadRequest(f"'{field}' must be {FORMS}; got {_type_name(value)}", param=field)
    if not value:
        raise EmptyInput(f"'{field}' is an empty list; send at least one input", param=field)
    first = value[0]
    if isinstance(first, list):
        lists = _items(value, list, field, "a list of token IDs", "lists of token IDs", _token_ids)
        return Inputs(token_ids=lists)
    if type(first) is int:
        return Inputs(token_ids=[_token_ids(value, field)])
    if isinstance(first, str):
        texts = _items(value, str, field, "a string", "strings")
        return Inputs(texts=[text.encode("utf-8") for text in texts])
    raise BadRequest(f"{field}[0] is {_type_name(first)}; '{field}' must be {FORMS}", param=field)


def _items(
    value: list[Any], kind: type, field: str, first: str, items: str, each: Any = None
) -> list[Any]:
    """The items of ``value``, each a ``kind`` (and passed through ``each(item, where)``).

    Args:
        value: the field's list.
        kind: the type every item must have (that of the first).
        field: the field's name, for messages.
        first: what the first item is, e.g. ``"a string"``.
        items: what every item must be, e.g. ``"strings"``.
        each: checks one item, e.g. :func:`_token_ids`; ``None``: none.

    Raises:
        TooLarge: more than :data:`MAX_INPUTS` items.
        BadRequest: names the first bad item in order, e.g. ``input[3]``.
    """
    _check_count(len(value), field)
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, kind):
            raise BadRequest(
                f"{field}[{i}] is {_type_name(item)}; a list that starts with {first} "
                f"must hold only {items}",
                param=field,
            )
        out.append(item if each is None else each(item, f"{field}[{i}]"))
    return out


def _check_count(count: int, field: str) -> None:
    if count > MAX_INPUTS:
        raise TooLarge(
            f"'{field}' has {count} inputs; at most {MAX_INPUTS} are allowed per request; "
            "split them over several requests",
            param=field,
            code="too_many_inputs",
        )


def check_not_empty(inputs: Inputs, model: ModelInfo, field: str) -> None:
    """Refuse an empty text unless ``model``'s tokenizer step embeds them by default.

    The step's own message points to its request parameter ``allow_empty``, which the HTTP
    APIs do not have; this one names the API's field.

    Raises:
        BadRequest: ``field[i]`` is an empty string (names the first).
    """
    if inputs.texts is None or model.allow_empty:
        return
    for i, text in enumerate(inputs.texts):
        if not text:
            raise BadRequest(
                f"{field}[{i}] is an empty string; model {model.name!r} does not embed empty "
                "texts: send at least one character in each input",
                param=field,
            )


def _dimensions(value: Any, field: str) -> int:
    """A ``dimensions`` value: a whole number from 1 to :data:`MAX_DIMENSIONS`.

    Raises:
        BadRequest: a boolean, a float, a string, or a number out of range (names ``field``).
    """
    if type(value) is not int or not 1 <= value <= MAX_DIMENSIONS:
        raise BadRequest(
            f"'{field}' must be a whole number from 1 to {MAX_DIMENSIONS} (one of the model's "
            f"dimensions; GET /v1/models lists its full dimension); got {quote(value)}",
            param=field,
        )
    return value


def _model_dimensions(wanted: int, model: ModelInfo, field: str) -> int:
    """``wanted`` unless it is above ``model``'s vector size (when the config states it).

    Raises:
        BadRequest: it is (names ``field``, the value and the model's dimension).
    """
    if model.dimension is not None and wanted > model.dimension:
        raise BadRequest(
            f"'{field}' is {wanted}; the vectors of model {model.name!r} have "
            f"{model.dimension} dimensions: send a number from 1 to {model.dimension} (one "
            "of the model's dimensions), or leave it out",
            param=field,
        )
    return wanted


def request_options(
    *,
    truncation: Any = None,
    truncation_field: str = "truncation",
    input_type: Any = None,
    input_type_field: str = INPUT_TYPE,
    dimensions: Any = None,
    dimensions_field: str = DIMENSIONS,
    model: ModelInfo | None = None,
) -> RequestOptions:
    """A request's options, read and checked (``None``: not set, the server's default applies).

    Args:
        truncation: ``NONE`` / ``END`` / ``START`` / ``CHUNK`` (case-insensitive), or a
            :class:`~triton_embed.options.Truncation`.
        truncation_field: the field it came in, for messages.
        input_type: a prompt name of the model (``query``, ``document``, ...).
        input_type_field: the field it came in, for messages.
        dimensions: a whole number from 1 to :data:`MAX_DIMENSIONS`, and not above
            ``model``'s vector size where ``model`` is given (the embedder step checks it is
            one of the model's Matryoshka dimensions).
        dimensions_field: the field it came in, for messages.
        model: the ensemble the request asks for (``None``: not checked against a model).

    Returns:
        The frozen (hashable) options, their values typed: ``truncation`` a
        :class:`~triton_embed.options.Truncation`, ``input_type`` a ``str``, ``dimensions``
        an ``int``; the other options unset.

    Raises:
        BadRequest: a value outside its allowed set (names the API's field and the allowed
            values; quotes at most a bounded prefix of the value).
    """
    if truncation is not None:
        try:
            truncation = Truncation.parse(truncation, what=truncation_field)
        except ValueError:
            allowed = ", ".join(t.value for t in Truncation)
            raise BadRequest(
                f"'{truncation_field}' must be one of {allowed}; got {quote(truncation)}",
                param=truncation_field,
            ) from None
    if input_type is not None:
        if not isinstance(input_type, str) or len(input_type) > MAX_PROMPT_NAME_CHARS:
            raise BadRequest(
                f"'{input_type_field}' must be a prompt name of the model such as query or "
                f"document (at most {MAX_PROMPT_NAME_CHARS} characters); got {quote(input_type)}",
                param=input_type_field,
            )
        try:
            input_type = parse_input_type(input_type, what=input_type_field)
        except ValueError:
            raise BadRequest(
                f"'{input_type_field}' must be a prompt name of the model such as query or "
                f"document; got {quote(input_type)}",
                param=input_type_field,
            ) from None
    if dimensions is not None:
        dimensions = _dimensions(dimensions, dimensions_field)
        if model is not None:
            dimensions = _model_dimensions(dimensions, model, dimensions_field)
    return RequestOptions(truncation=truncation, input_type=input_type, dimensions=dimensions)


async def embed_inputs(
    gateway: Gateway,
    state: RequestState,
    model: ModelInfo,
    inputs: Inputs,
    options: Any,
    field: str,
    text_options: RequestOptions | None = None,
) -> inference.Embeddings:
    """Embed a request's texts (merged with others) or token IDs with ``model``; count them.

    Args:
        gateway: the gateway (its pool, merger and token budget).
        state: the request's state: its model, inputs and tokens are recorded there.
        model: the ensemble (dense or sparse).
        inputs: the request's texts or token-ID lists.
        options: the request options sent upstream.
        field: the request field of the inputs, for messages.
        text_options: the options that bound the tokens (``truncation``); default
            ``options``.

    The upstream calls run in the request's turn (:meth:`~.app.Gateway.upstream_turn`:
    its tenant's rights to ``model``, fair shares, priority level).

    Raises:
        BadRequest: an empty text the model does not embed.
        Forbidden: the request's tenant may not use ``model``.
        TransportError: a piece failed, or the inputs are over the token budget.
    """
    state.model = model.name
    check_not_empty(inputs, model, field)
    if getattr(model, "head", None):  # a hybrid model's view: ask for that head only
        try:
            options = head_options(options, model.head)
        except OptionError as exc:
            raise BadRequest(str(exc), param=exc.name) from None
    budget = gateway.token_budget(model, text_options or options, field)
    if inputs.texts is not None:
        estimate = estimate_tokens([len(t) for t in inputs.texts], budget.max_tokens_per_text)
    else:
        estimate = sum(len(ids) for ids in inputs.token_ids or [])
    async with gateway.upstream_turn(state, model.name, estimate) as turn:
        if inputs.texts is not None:
            result = await gateway.merger.embed_texts(model, inputs.texts, options, budget)
        else:
            result = await inference.embed_token_ids(
                gateway.pool, model, inputs.token_ids or [], options, budget
            )
        turn.tokens = int(result.num_tokens.sum())
    state.inputs = len(inputs)
    state.tokens = turn.tokens
    return result
