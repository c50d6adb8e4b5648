"""The request options of a hybrid (BGE-M3) model, defined once.

A hybrid ensemble takes ``TEXT`` and answers, from one forward pass of its encoder, any of
three outputs (docs/sparse.md, "Hybrid models"): ``EMBEDDING`` (the dense vector),
``SPARSE`` (lexical weights, as a sparse model's) and ``TOKEN_EMBEDDINGS`` (ColBERT vectors,
as a multi-vector model's). Its request parameters (KServe v2 ``parameters``), each optional:

==================  ===============================================  =======================
parameter           values                                           when absent
==================  ===============================================  =======================
``truncation``      ``NONE``, ``END``, ``START`` (not ``CHUNK``)     the tokenizer's (END)
``allow_empty``     ``true``/``false`` (``1``/``0``, ``yes``/``no``)  the tokenizer's (false)
``invalid_utf8``    ``error``, ``replace``                           ``error``
``input_type``      a prompt name of the model (BGE-M3 has none)     no prompt
``outputs``         a comma-separated subset of ``dense``,           all three
                    ``sparse``, ``colbert`` (case-insensitive)
``top_k``           an integer >= 1: keep the ``k`` largest weights  every weight kept
``threshold``       a finite number >= 0: keep weights above it      ``0``: every non-zero
==================  ===============================================  =======================

``outputs`` picks the heads the engine step runs: an output not asked for is not computed
and its elements are empty (0 bytes). ``top_k`` and ``threshold`` cut the sparse output as
they cut a sparse model's (:mod:`triton_embed.sparse_options`). ``truncation=CHUNK`` is
refused, as for the sparse and multi-vector kinds.
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
    InvalidUtf8,
    OptionError,
    Truncation,
    parse_flag,
    parse_input_type,
    parse_unchunked_truncation,
)
from triton_embed.sparse_options import THRESHOLD, TOP_K, parse_threshold, parse_top_k

OUTPUTS = "outputs"
#: The heads of a hybrid model, in the order the parameter lists them.
HEADS = ("dense", "sparse", "colbert")
#: Each head's ensemble output tensor.
HEAD_TENSORS = {"dense": "EMBEDDING", "sparse": "SPARSE", "colbert": "TOKEN_EMBEDDINGS"}
#: The request parameters a hybrid model takes, in documentation order.
HYBRID_NAMES = (TRUNCATION, ALLOW_EMPTY, INVALID_UTF8, INPUT_TYPE, OUTPUTS, TOP_K, THRESHOLD)


def parse_hybrid_truncation(value: Any, what: str = TRUNCATION) -> Truncation:
    """Parse ``NONE`` / ``END`` / ``START`` (case-insensitive); ``CHUNK`` is refused.

    Raises:
        OptionError: another value, or ``CHUNK`` (names ``what`` and the allowed values).
    """
    why = "one window's sparse and ColBERT vectors are not a merge of several"
    return parse_unchunked_truncation(value, what, "hybrid models", why)


def parse_outputs(value: Any, what: str = OUTPUTS) -> tuple[str, ...]:
    """Parse ``outputs``: a comma-separated, non-empty subset of :data:`HEADS`.

    A tuple or list of names is taken as well (the client's). Duplicates are kept once.

    Returns:
        The heads asked for, in :data:`HEADS` order, e.g. ``("dense", "colbert")``.

    Raises:
        OptionError: an empty list, or a name that is no head (names it and the heads).
    """
    allowed = ", ".join(HEADS)
    if isinstance(value, str):
        names = [n.strip().lower() for n in value.split(",")]
    elif isinstance(value, (tuple, list)) and all(isinstance(n, str) for n in value):
        names = [n.strip().lower() for n in value]
    else:
        names = []
    unknown = [n for n in names if n not in HEADS]
    if not names or unknown or not any(names):
        bad = f" ({unknown[0]!r} is not one)" if unknown and unknown[0] else ""
        raise OptionError(
            what,
            value,
            allowed,
            f"must be a comma-separated list of {allowed}{bad}",
        )
    return tuple(h for h in HEADS if h in names)


@dataclass(frozen=True)
class HybridOptions(KindOptions):
    """One hybrid request's options; ``None``: the server's default.

    Attributes:
        truncation: over-long texts: ``NONE`` (error), ``END``, ``START``.
        allow_empty: encode empty texts instead of refusing them.
        invalid_utf8: refuse (``error``) or replace with U+FFFD (``replace``).
        input_type: the prompt to prepend (a prompt name of the model).
        outputs: the heads to run (:data:`HEADS` order); ``None``: all three.
        top_k: keep only the ``top_k`` largest sparse weights of each text.
        threshold: keep only sparse weights above this (strictly).

    Raises:
        OptionError: a value outside its allowed set.
    """

    truncation: Truncation | None = None
    allow_empty: bool | None = None
    invalid_utf8: InvalidUtf8 | None = None
    input_type: str | None = None
    outputs: tuple[str, ...] | None = None
    top_k: int | None = None
    threshold: float | None = None

    names: ClassVar[tuple[str, ...]] = HYBRID_NAMES
    parsers: ClassVar[Mapping[str, Callable[[Any, str], Any]]] = {
        TRUNCATION: parse_hybrid_truncation,
        ALLOW_EMPTY: parse_flag,
        INVALID_UTF8: InvalidUtf8.parse,
        INPUT_TYPE: parse_input_type,
        OUTPUTS: parse_outputs,
        TOP_K: parse_top_k,
        THRESHOLD: parse_threshold,
    }

    @property
    def heads(self) -> tuple[str, ...]:
        """The heads to run: :attr:`outputs`, or all of :data:`HEADS`."""
        return self.outputs or HEADS

    def to_parameters(self) -> dict[str, str | bool | int | float]:
        """The request parameters to send (``outputs`` as a comma-separated string)."""
        out = super().to_parameters()
        if self.outputs is not None:
            out[OUTPUTS] = ",".join(self.outputs)
        return out


def head_parameters(hybrid: bool, head: str, parameters: dict) -> dict:
    """A request's parameters asking a hybrid model for one head (others' unchanged).

    Args:
        hybrid: the model is a hybrid model (its config's ``kind``).
        head: the head the call serves (``dense`` for ``embed``, ``sparse``, ``colbert``).
        parameters: the call's other request parameters.
    """
    return {**parameters, OUTPUTS: head} if hybrid else parameters
