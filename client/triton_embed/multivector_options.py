"""The request options of a multi-vector (late interaction) model, defined once.

A multi-vector ensemble takes ``TEXT`` like an embedding ensemble and answers
``TOKEN_EMBEDDINGS``: per text, one float32 vector per token (docs/sparse.md,
"Multi-vector"). Its request parameters (KServe v2 ``parameters``), each optional:

==================  ===============================================  =======================
parameter           values                                           when absent
==================  ===============================================  =======================
``truncation``      ``NONE``, ``END``, ``START`` (not ``CHUNK``)     the tokenizer's (END)
``allow_empty``     ``true``/``false`` (``1``/``0``, ``yes``/``no``)  the tokenizer's (false)
``invalid_utf8``    ``error``, ``replace``                           ``error``
``input_type``      ``query`` or ``document``                        ``document``
==================  ===============================================  =======================

``input_type`` picks ColBERT's marker (``[Q]`` or ``[D]``) and, for a query, its length and
its augmentation with ``[MASK]`` tokens; a model without markers (hidden states) reads both
the same. ``truncation=CHUNK`` is refused: the windows' token vectors would repeat the
special tokens and markers of each window, which no reference does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from triton_embed.kind_options import KindOptions
from triton_embed.options import (
    ALLOW_EMPTY,
    INPUT_TYPE,
    INVALID_UTF8,
    TRUNCATION,
    UNCHUNKED_TRUNCATIONS,
    InvalidUtf8,
    OptionError,
    Truncation,
    parse_flag,
    parse_unchunked_truncation,
)

#: The request parameters a multi-vector model takes, in documentation order.
MULTIVECTOR_NAMES = (TRUNCATION, ALLOW_EMPTY, INVALID_UTF8, INPUT_TYPE)
#: The ``input_type`` values of a multi-vector model; the first is the default.
INPUT_TYPES = ("document", "query")
#: The truncations a multi-vector model offers.
MULTIVECTOR_TRUNCATIONS = UNCHUNKED_TRUNCATIONS


def parse_multivector_truncation(value: Any, what: str = TRUNCATION) -> Truncation:
    """Parse ``NONE`` / ``END`` / ``START`` (case-insensitive); ``CHUNK`` is refused.

    Raises:
        OptionError: another value, or ``CHUNK`` (names ``what`` and the allowed values).
    """
    why = "each window would bring its own special tokens and marker"
    return parse_unchunked_truncation(value, what, "multi-vector models", why)


def parse_side(value: Any, what: str = INPUT_TYPE) -> str:
    """Parse ``query`` or ``document`` (case-insensitive).

    Raises:
        OptionError: another value (names ``what`` and the allowed values).
    """
    allowed = ", ".join(INPUT_TYPES)
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in INPUT_TYPES:
        raise OptionError(what, value, allowed, f"must be one of {allowed}")
    return text


@dataclass(frozen=True)
class MultiVectorOptions(KindOptions):
    """One multi-vector request's options; ``None``: the server's default.

    Attributes:
        truncation: over-long texts: ``NONE`` (error), ``END``, ``START``.
        allow_empty: encode empty texts instead of refusing them.
        invalid_utf8: refuse (``error``) or replace with U+FFFD (``replace``).
        input_type: ``query`` or ``document``.

    Raises:
        OptionError: a value outside its allowed set.
    """

    truncation: Truncation | None = None
    allow_empty: bool | None = None
    invalid_utf8: InvalidUtf8 | None = None
    input_type: str | None = None

    names: ClassVar[tuple[str, ...]] = MULTIVECTOR_NAMES
    parsers: ClassVar[Mapping[str, Callable[[Any, str], Any]]] = {
        TRUNCATION: parse_multivector_truncation,
        ALLOW_EMPTY: parse_flag,
        INVALID_UTF8: InvalidUtf8.parse,
        INPUT_TYPE: parse_side,
    }

    @property
    def side(self) -> str:
        """``query`` or ``document`` (the default)."""
        return self.input_type or INPUT_TYPES[0]
