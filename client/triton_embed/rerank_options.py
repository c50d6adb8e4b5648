"""The request options of a reranker (a cross-encoder scoring query-document pairs).

A reranker ensemble takes ``QUERY`` and ``DOCUMENT`` (one pair per row) and these request
parameters (KServe v2 ``parameters``); each is optional, the server's default applies:

* ``truncation``: a pair longer than the model's token budget: ``longest_first`` (the
  default, as ``transformers`` tokenizers and sentence-transformers' ``CrossEncoder`` cut a
  pair: one token at a time from the longer of the two), ``only_second`` (cut the document
  only; the query is kept whole), or ``none`` (an over-long pair is an error);
* ``raw_scores``: ``true`` returns the model's logit; ``false`` (the default) applies the
  model's activation (the sigmoid for a one-label model, as ``CrossEncoder.predict`` does);
* ``max_document_tokens``: a whole number >= 1: each document is cut to this many tokens
  before the pair is truncated (Cohere's ``max_tokens_per_doc``); absent: no cut;
* ``instruction``: a decoder reranker's ``<Instruct>`` line (at most
  :data:`MAX_INSTRUCTION_CHARS` characters); absent: the model's default instruction;
* ``invalid_utf8``: ``error`` (the default) or ``replace`` with U+FFFD, as for embeddings.

The tensors and defaults are documented in ``docs/rerank.md``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from triton_embed.options import (
    INVALID_UTF8,
    TRUNCATION,
    InvalidUtf8,
    OptionError,
    check_known,
    parse_dimensions,
    parse_flag,
    parse_member,
)

RAW_SCORES = "raw_scores"
MAX_DOCUMENT_TOKENS = "max_document_tokens"
INSTRUCTION = "instruction"
#: The request parameters a reranker takes.
PAIR_NAMES = (TRUNCATION, RAW_SCORES, MAX_DOCUMENT_TOKENS, INSTRUCTION, INVALID_UTF8)
#: The longest ``instruction``: a request's work stays bounded (Qwen3-Reranker's own
#: instructions are one sentence, under 200 characters).
MAX_INSTRUCTION_CHARS = 2048


class PairTruncation(str, enum.Enum):
    """How a query-document pair over the token budget is cut (Hugging Face's strategy names)."""

    LONGEST_FIRST = "longest_first"
    ONLY_SECOND = "only_second"
    NONE = "none"

    @classmethod
    def parse(cls, value: Any, what: str = TRUNCATION) -> PairTruncation:
        """Parse ``longest_first`` / ``only_second`` / ``none`` (case-insensitive).

        Raises:
            OptionError: another value (names ``what``, the value and the allowed values).
        """
        return parse_member(cls, value, what, str.lower)


DEFAULT_PAIR_TRUNCATION = PairTruncation.LONGEST_FIRST


def parse_instruction(value: Any, what: str = INSTRUCTION) -> str:
    """Parse an ``instruction``: a non-empty string of at most :data:`MAX_INSTRUCTION_CHARS`.

    Raises:
        OptionError: not a string, empty, or longer (names ``what`` and the limit).
    """
    allowed = f"a non-empty text of at most {MAX_INSTRUCTION_CHARS} characters"
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_INSTRUCTION_CHARS:
        raise OptionError(what, value, allowed, f"must be {allowed}")
    return value


@dataclass(frozen=True)
class PairOptions:
    """One rerank request's options; ``None``: the server's default.

    Attributes:
        truncation: see :class:`PairTruncation`.
        raw_scores: return logits instead of the activated scores.
        max_document_tokens: cut each document to this many tokens first.
        instruction: a decoder reranker's instruction.
        invalid_utf8: reject or replace invalid UTF-8 in the query or a document.

    Raises:
        OptionError: a value outside its allowed set.
    """

    truncation: PairTruncation | None = None
    raw_scores: bool | None = None
    max_document_tokens: int | None = None
    instruction: str | None = None
    invalid_utf8: InvalidUtf8 | None = None

    def __post_init__(self) -> None:
        if self.truncation is not None:
            object.__setattr__(self, "truncation", PairTruncation.parse(self.truncation))
        if self.raw_scores is not None:
            object.__setattr__(self, "raw_scores", parse_flag(self.raw_scores, RAW_SCORES))
        if self.max_document_tokens is not None:
            tokens = parse_dimensions(self.max_document_tokens, MAX_DOCUMENT_TOKENS)
            object.__setattr__(self, "max_document_tokens", tokens)
        if self.instruction is not None:
            object.__setattr__(self, "instruction", parse_instruction(self.instruction))
        if self.invalid_utf8 is not None:
            object.__setattr__(self, "invalid_utf8", InvalidUtf8.parse(self.invalid_utf8))

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any]) -> PairOptions:
        """Read the options from a request's KServe v2 parameters.

        Raises:
            ValueError: an unknown parameter, or a value outside its allowed set (the
                message starts with ``request parameter <name>=<value>``).
        """
        check_known(parameters, PAIR_NAMES)
        try:
            return cls(**{n: parameters[n] for n in PAIR_NAMES if n in parameters})
        except OptionError as exc:
            raise exc.with_prefix("request parameter ") from None

    def to_parameters(self) -> dict[str, str | bool]:
        """The request parameters to send: only the options that are set."""
        out: dict[str, str | bool] = {}
        for name in PAIR_NAMES:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.value if isinstance(value, enum.Enum) else value
        return out
