"""The request options of the ``embed`` ensemble, defined once.

A request's options travel as KServe v2 request ``parameters`` (gRPC ``parameters=`` of
``infer()``, HTTP ``"parameters": {...}``); the ensemble forwards them to its ``tokenizer``
step. This module holds their names, allowed values and defaults, and the one parser of
their values. The client library and the CLI build requests with it; the server's tokenizer
step (``triton_embed_server.steps.tokenization``) parses them with it.

========================  ==========================  ==========================================
parameter                 values (case-insensitive)   when absent
========================  ==========================  ==========================================
``truncation``            ``NONE``, ``END``,          the ``tokenizer`` model's ``truncation``
                          ``START``, ``CHUNK``        parameter (``END`` unless configured)
``allow_empty``           ``true``/``false`` (bool,   the ``tokenizer`` model's ``allow_empty``
                          ``1``/``0``, ``yes``/``no``)  parameter (``false`` unless configured)
``invalid_utf8``          ``error``, ``replace``      ``error``
``input_type``            ``document`` (always), or a  the model's ``default_prompt_name`` (no
                          prompt name of the model    prompt when it has none)
                          (``query``, ...; exact case)
``dimensions``            an integer >= 1: one of     the model's full dimension
                          the model's dimensions
``embedding_type``        ``float32``, ``float16``,   ``float32``
                          ``ubinary``
``normalize``             ``true``/``false`` (bool,   the model's own normalization (its
                          ``1``/``0``, ``yes``/``no``)  ``Normalize`` module, or the embedder's
                                                      ``normalize`` parameter)
========================  ==========================  ==========================================

``truncation`` has a fourth value, ``CHUNK``: a text over the token budget is cut into
consecutive windows that each fit it, and its vector is the token-count-weighted mean of
theirs (``docs/input-contract.md``, "Long inputs"). ``normalize=false`` returns the pooled
vectors without L2 normalization, as text-embeddings-inference's ``normalize`` does (TEI
never applies the model's ``Normalize`` module itself); ``true`` L2-normalizes them.
Which ``input_type`` and ``dimensions`` values a model accepts is the model's
(:mod:`triton_embed_server.models.model_spec`); this module checks only their form.

A value outside its allowed set is an :class:`OptionError` (a ``ValueError``) that names the
parameter, the value and the allowed values. A parameter with any other name is an error too
(a misspelt option must not be silently ignored), except the names the KServe v2 / Triton
protocols reserve for themselves (:data:`RESERVED`, and any name starting with
``triton_``), and the request's priority class (:data:`triton_embed.priority.CLASS_PARAMETER`,
read by the engine steps), which are left alone.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from triton_embed.priority import CLASS_PARAMETER
from triton_embed.quoting import quote

TRUNCATION = "truncation"
ALLOW_EMPTY = "allow_empty"
INVALID_UTF8 = "invalid_utf8"
INPUT_TYPE = "input_type"
DIMENSIONS = "dimensions"
EMBEDDING_TYPE = "embedding_type"
NORMALIZE = "normalize"
#: The request-parameter names this service reads, in documentation order.
NAMES = (TRUNCATION, ALLOW_EMPTY, INVALID_UTF8, INPUT_TYPE, DIMENSIONS, EMBEDDING_TYPE, NORMALIZE)


#: Request-parameter names Triton's protocols use for their own purposes (Triton's
#: ``docs/protocol/extension_parameters.md`` and ``extension_sequence.md``); they are not
#: options of this service and are ignored, as are names starting with ``triton_``.
RESERVED = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "binary_data_output",
        "binary_data",
        "binary_data_size",
        "headers",
        CLASS_PARAMETER,
    }
)

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


class OptionError(ValueError):
    """An option's value outside its allowed set; the message says which option and why.

    Attributes:
        name: how the option is named, e.g. ``"dimensions"`` or ``"parameter truncation"``.
        value: the value as received.
        allowed: what the option accepts, e.g. ``"NONE, END, START, CHUNK"`` or
            ``"a whole number >= 1"``.
        prefix: words before the name in the message, e.g. ``"request parameter "``.

    The message is ``<prefix><name>=<quoted value> <reason>``, e.g.
    ``dimensions='x' must be a whole number >= 1``.
    """

    def __init__(self, name: str, value: Any, allowed: str, reason: str, prefix: str = "") -> None:
        self.name = name
        self.value = value
        self.allowed = allowed
        self.reason = reason
        self.prefix = prefix
        super().__init__(f"{prefix}{name}={quote(value)} {reason}")

    def with_prefix(self, prefix: str) -> OptionError:
        """The same error, its message starting with ``prefix`` (e.g. ``"request parameter "``)."""
        return OptionError(self.name, self.value, self.allowed, self.reason, prefix + self.prefix)


def parse_member(cls: type[enum.Enum], value: Any, what: str, fold) -> Any:
    """The member of ``cls`` whose value is ``fold(str(value).strip())``; a member: itself.

    Raises:
        OptionError: none is (names ``what``, the value and the allowed values).
    """
    if isinstance(value, cls):
        return value  # already parsed: a member is never turned into text and read back
    try:
        return cls(fold(str(value).strip()))
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise OptionError(what, value, allowed, f"is not one of {allowed}") from None


class Truncation(str, enum.Enum):
    """What to do with a text longer than the token budget (TEI's and vLLM's terms)."""

    NONE = "NONE"  # an over-long text is an error
    END = "END"  # keep the start, cut the end
    START = "START"  # keep the end, cut the start
    CHUNK = "CHUNK"  # embed consecutive windows, return their token-weighted mean

    @classmethod
    def parse(cls, value: Any, what: str = TRUNCATION) -> Truncation:
        """Parse ``NONE`` / ``END`` / ``START`` / ``CHUNK`` (case-insensitive, blanks ignored).

        Args:
            value: the raw value (a :class:`Truncation`, or anything whose ``str`` is one).
            what: how the error message names the value, e.g. ``"parameter truncation"``.

        Raises:
            OptionError: another value (names ``what``, the value and the allowed values).
        """
        return parse_member(cls, value, what, str.upper)


class InvalidUtf8(str, enum.Enum):
    """What to do with a text whose bytes are not valid UTF-8."""

    ERROR = "error"  # the request fails with INVALID_ARG naming the text and byte offset
    REPLACE = "replace"  # each invalid sequence becomes U+FFFD

    @classmethod
    def parse(cls, value: Any, what: str = INVALID_UTF8) -> InvalidUtf8:
        """Parse ``error`` / ``replace`` (case-insensitive, surrounding blanks ignored).

        Args:
            value: the raw value (an :class:`InvalidUtf8`, or anything whose ``str`` is one).
            what: how the error message names the value.

        Raises:
            OptionError: another value (names ``what``, the value and the allowed values).
        """
        return parse_member(cls, value, what, str.lower)


class EmbeddingType(str, enum.Enum):
    """How each ``EMBEDDING`` element encodes a vector of ``d`` values.

    ``float32``: ``4 * d`` bytes, little-endian IEEE-754 single precision;
    ``float16``: ``2 * d`` bytes, little-endian IEEE-754 half precision;
    ``ubinary``: ``ceil(d / 8)`` bytes, the sign bits (``value > 0`` is 1) packed 8 per byte,
    most significant bit first, zero bits padding the last byte (``np.packbits(v > 0)``,
    sentence-transformers' ``quantize_embeddings(..., precision="ubinary")``).
    """

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    UBINARY = "ubinary"

    @classmethod
    def parse(cls, value: Any, what: str = EMBEDDING_TYPE) -> EmbeddingType:
        """Parse ``float32`` / ``float16`` / ``ubinary`` (case-insensitive).

        Raises:
            OptionError: another value (names ``what``, the value and the allowed values).
        """
        return parse_member(cls, value, what, str.lower)

    def element_bytes(self, dimension: int) -> int:
        """Bytes of one ``EMBEDDING`` element holding a ``dimension``-value vector."""
        if self is EmbeddingType.FLOAT32:
            return 4 * dimension
        if self is EmbeddingType.FLOAT16:
            return 2 * dimension
        return (dimension + 7) // 8


def parse_dimensions(value: Any, what: str = DIMENSIONS) -> int:
    """Parse a ``dimensions`` value: a whole number >= 1 (an int, or a string of one).

    Raises:
        OptionError: anything else (names ``what`` and the value).
    """
    number = 0
    if not isinstance(value, bool):
        try:
            number = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            pass
    if number < 1:
        allowed = "a whole number >= 1"
        raise OptionError(what, value, allowed, f"must be {allowed}")
    return number


def parse_input_type(value: Any, what: str = INPUT_TYPE) -> str:
    """Parse an ``input_type`` value: a non-empty prompt name (blanks around it dropped).

    Raises:
        OptionError: an empty or non-string value.
    """
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        allowed = "a prompt name such as query or document"
        raise OptionError(what, value, allowed, f"must be {allowed}")
    return text


DEFAULT_TRUNCATION = Truncation.END
DEFAULT_ALLOW_EMPTY = False
DEFAULT_INVALID_UTF8 = InvalidUtf8.ERROR
DEFAULT_EMBEDDING_TYPE = EmbeddingType.FLOAT32


#: The truncations of the kinds whose output is one answer per window of text (sparse,
#: multi-vector): every one but ``CHUNK``, which is an embedding model's.
UNCHUNKED_TRUNCATIONS = (Truncation.NONE, Truncation.END, Truncation.START)


def parse_unchunked_truncation(value: Any, what: str, kind: str, why: str) -> Truncation:
    """Parse ``NONE`` / ``END`` / ``START`` (case-insensitive) for a ``kind`` of model.

    Args:
        value: the value sent.
        what: the option's name in the message.
        kind: the model kind in the message ("sparse models").
        why: why ``CHUNK`` is not offered for it (the message's parenthesis).

    Raises:
        OptionError: another value, or ``CHUNK`` (names ``what`` and the allowed values).
    """
    truncation = Truncation.parse(value, what)
    if truncation not in UNCHUNKED_TRUNCATIONS:
        allowed = ", ".join(t.value for t in UNCHUNKED_TRUNCATIONS)
        raise OptionError(
            what, value, allowed, f"is not offered for {kind} ({why}); use one of {allowed}"
        )
    return truncation


def parse_flag(value: Any, what: str = ALLOW_EMPTY) -> bool:
    """Parse a boolean: ``True``/``False``, or ``true``/``false``/``1``/``0``/``yes``/``no``.

    The project's one flag parser: request options, CLI flags and config parameters.

    Args:
        value: the raw value (gRPC ``bool_param``, ``int64_param`` or ``string_param``;
            strings are case-insensitive, surrounding blanks ignored).
        what: how the error message names the value.

    Raises:
        OptionError: another value (names ``what`` and the value).
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise OptionError(what, value, "true or false", "must be true or false")


def check_known(parameters: Mapping[str, Any], names: tuple[str, ...]) -> None:
    """Refuse request parameters that are not options of this service.

    Args:
        parameters: a request's KServe v2 parameters.
        names: the options the model takes; keys in :data:`RESERVED` or starting with
            ``triton_`` (Triton's own) are always allowed.

    Raises:
        ValueError: names at most three unknown keys and lists ``names``.
    """
    unknown = sorted(
        str(k)
        for k in parameters
        if k not in names and k not in RESERVED and not str(k).startswith("triton_")
    )
    if not unknown:
        return
    listed = ", ".join(quote(k) for k in unknown[:3]) + (
        f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
    )
    one = len(unknown) == 1
    what = "parameter {} is not an option" if one else "parameters {} are not options"
    fix = "remove it or fix its spelling" if one else "remove them or fix their spelling"
    raise ValueError(
        f"request {what.format(listed)} of this service; the options are {', '.join(names)}; {fix}"
    )


@dataclass(frozen=True)
class RequestOptions:
    """One request's options; ``None`` means "not set: the server's default applies".

    Values are parsed on construction, so ``RequestOptions(truncation="start")`` holds
    :attr:`Truncation.START`.

    Attributes:
        truncation: over-long texts (``NONE`` errors, ``END`` keeps the start, ``START``
            keeps the end).
        allow_empty: embed empty texts instead of rejecting them.
        invalid_utf8: reject (``error``) or replace with U+FFFD (``replace``) invalid UTF-8.
        input_type: the prompt to prepend (``query``, ``document`` or a prompt name of the
            model).
        dimensions: cut each vector to its first ``dimensions`` values, L2-normalized again.
        embedding_type: the encoding of each ``EMBEDDING`` element.
        normalize: ``False``: the pooled vectors as the model's pooling makes them, not
            L2-normalized (TEI's ``normalize=false``); ``True``: L2-normalized.

    Raises:
        OptionError: a value outside its allowed set (names the option and the allowed values).
    """

    truncation: Truncation | None = None
    allow_empty: bool | None = None
    invalid_utf8: InvalidUtf8 | None = None
    input_type: str | None = None
    dimensions: int | None = None
    embedding_type: EmbeddingType | None = None
    normalize: bool | None = None

    def __post_init__(self) -> None:
        if self.truncation is not None:
            object.__setattr__(self, "truncation", Truncation.parse(self.truncation))
        if self.allow_empty is not None:
            object.__setattr__(self, "allow_empty", parse_flag(self.allow_empty))
        if self.invalid_utf8 is not None:
            object.__setattr__(self, "invalid_utf8", InvalidUtf8.parse(self.invalid_utf8))
        if self.input_type is not None:
            object.__setattr__(self, "input_type", parse_input_type(self.input_type))
        if self.dimensions is not None:
            object.__setattr__(self, "dimensions", parse_dimensions(self.dimensions))
        if self.embedding_type is not None:
            object.__setattr__(self, "embedding_type", EmbeddingType.parse(self.embedding_type))
        if self.normalize is not None:
            object.__setattr__(self, "normalize", parse_flag(self.normalize, NORMALIZE))

    @classmethod
    def from_args(cls, args: Any, input_type_default: str | None = None) -> RequestOptions:
        """Read the options from parsed command-line flags.

        The flags are those :func:`triton_embed.cli_args.add_request_option_args` defines
        (``--truncation``, ``--allow-empty``, ``--input-type``, ``--dimensions``,
        ``--embedding-type``, ``--normalize``), used by every ``triton-embed`` command that
        embeds and by ``python -m triton_embed.bulk.ray_job``.

        Args:
            args: an ``argparse.Namespace`` (any object with attributes). Its attributes named
                as the options, :data:`NAMES` (``truncation``, ``allow_empty``,
                ``invalid_utf8``, ``input_type``, ``dimensions``, ``embedding_type``,
                ``normalize``), are read; one that is ``None`` or missing (a command without
                that flag, as ``query`` has no ``--embedding-type``) leaves its option unset.
                No other attribute is read.
            input_type_default: the ``input_type`` when ``args.input_type`` is ``None`` or
                missing, e.g. ``"document"`` for a corpus; ``None`` leaves it unset (the
                model's default prompt).

        Raises:
            OptionError: a value outside its allowed set (a ``ValueError``; the message names
                the option, the value and the allowed values), e.g. an ``input_type`` that
                is empty or blank.
        """
        given = {name: getattr(args, name, None) for name in NAMES}
        if given[INPUT_TYPE] is None:
            given[INPUT_TYPE] = input_type_default
        return cls(**given)

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any]) -> RequestOptions:
        """Read the options from a request's parameters.

        Args:
            parameters: the request's KServe v2 parameters, e.g. ``{"truncation": "NONE"}``.
                Keys in :data:`RESERVED` or starting with ``triton_`` are ignored.

        Raises:
            ValueError: an option has a value outside its allowed set (the message starts
                with ``request parameter <name>=<value>`` and lists the allowed values), or a
                key is not an option of this service (the message names it and the options).
        """
        check_known(parameters, NAMES)
        try:
            return cls(**{name: parameters[name] for name in NAMES if name in parameters})
        except OptionError as exc:
            raise exc.with_prefix("request parameter ") from None

    def to_parameters(self) -> dict[str, str | bool | int]:
        """The request parameters to send: only the options that are set.

        Returns:
            ``{"truncation": "NONE" | "END" | "START" | "CHUNK", "allow_empty": bool,
            "invalid_utf8": "error" | "replace", "input_type": str, "dimensions": int,
            "embedding_type": "float32" | "float16" | "ubinary", "normalize": bool}``,
            without the keys that are ``None``.
        """
        out: dict[str, str | bool | int] = {}
        for name in NAMES:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.value if isinstance(value, enum.Enum) else value
        return out
