"""The request options of a sparse (SPLADE) model, defined once.

A sparse ensemble takes ``TEXT`` like an embedding ensemble and answers ``SPARSE``: per text,
its non-zero vocabulary indices and their weights (``docs/sparse.md``). Its request
parameters (KServe v2 ``parameters``) are the text options of the embedding ensemble that
apply to it and two of its own; each is optional, the server's default applies:

==================  ===============================================  =======================
parameter           values                                           when absent
==================  ===============================================  =======================
``truncation``      ``NONE``, ``END``, ``START`` (not ``CHUNK``)     the tokenizer's (END)
``allow_empty``     ``true``/``false`` (``1``/``0``, ``yes``/``no``)  the tokenizer's (false)
``invalid_utf8``    ``error``, ``replace``                           ``error``
``input_type``      a prompt name of the model (``query``, ...)      the model's default
``top_k``           an integer >= 1: keep the ``k`` largest weights  every weight kept
``threshold``       a finite number >= 0: keep weights above it      ``0``: every non-zero
==================  ===============================================  =======================

``truncation=CHUNK`` is refused: a text's sparse vector is the max over its tokens of one
window; the windows' vectors would have to be merged in a way the model was not trained for
(a mean is not a SPLADE vector, a max is not what the model computes on the whole text).
A value outside its allowed set is an :class:`~triton_embed.options.OptionError`
(``ValueError``) that names the parameter; an unknown parameter is refused as for embeddings
(:func:`~triton_embed.options.check_known`).
"""

from __future__ import annotations

import math
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
    parse_dimensions,
    parse_flag,
    parse_input_type,
    parse_unchunked_truncation,
)

TOP_K = "top_k"
THRESHOLD = "threshold"
#: The request parameters a sparse model takes, in documentation order.
SPARSE_NAMES = (TRUNCATION, ALLOW_EMPTY, INVALID_UTF8, INPUT_TYPE, TOP_K, THRESHOLD)
#: The truncations a sparse model offers (``CHUNK`` is an embedding model's).
SPARSE_TRUNCATIONS = UNCHUNKED_TRUNCATIONS


def parse_sparse_truncation(value: Any, what: str = TRUNCATION) -> Truncation:
    """Parse ``NONE`` / ``END`` / ``START`` (case-insensitive); ``CHUNK`` is refused.

    Raises:
        OptionError: another value, or ``CHUNK`` (names ``what`` and the allowed values).
    """
    why = "one window's sparse vector is not a merge of several"
    return parse_unchunked_truncation(value, what, "sparse models", why)


def parse_top_k(value: Any, what: str = TOP_K) -> int:
    """Parse a ``top_k``: a whole number >= 1 (an int, or a string of one).

    Raises:
        OptionError: anything else (names ``what`` and the value).
    """
    return parse_dimensions(value, what)


def parse_threshold(value: Any, what: str = THRESHOLD) -> float:
    """Parse a ``threshold``: a finite number >= 0 (an int, a float, or a string of one).

    Raises:
        OptionError: a bool, a non-number, NaN, an infinity or a negative number.
    """
    allowed = "a finite number >= 0"
    number = math.nan
    if not isinstance(value, bool):
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            pass
    if not math.isfinite(number) or number < 0:
        raise OptionError(what, value, allowed, f"must be {allowed}")
    return number


@dataclass(frozen=True)
class SparseOptions(KindOptions):
    """One sparse request's options; ``None``: the server's default.

    Values are parsed on construction, so ``SparseOptions(top_k="5")`` holds ``5``.

    Attributes:
        truncation: over-long texts: ``NONE`` (error), ``END``, ``START``.
        allow_empty: encode empty texts instead of refusing them.
        invalid_utf8: refuse (``error``) or replace with U+FFFD (``replace``).
        input_type: the prompt to prepend (a prompt name of the model).
        top_k: keep only the ``top_k`` largest weights of each text.
        threshold: keep only weights above this (strictly).

    Raises:
        OptionError: a value outside its allowed set.
    """

    truncation: Truncation | None = None
    allow_empty: bool | None = None
    invalid_utf8: InvalidUtf8 | None = None
    input_type: str | None = None
    top_k: int | None = None
    threshold: float | None = None

    names: ClassVar[tuple[str, ...]] = SPARSE_NAMES
    parsers: ClassVar[Mapping[str, Callable[[Any, str], Any]]] = {
        TRUNCATION: parse_sparse_truncation,
        ALLOW_EMPTY: parse_flag,
        INVALID_UTF8: InvalidUtf8.parse,
        INPUT_TYPE: parse_input_type,
        TOP_K: parse_top_k,
        THRESHOLD: parse_threshold,
    }
