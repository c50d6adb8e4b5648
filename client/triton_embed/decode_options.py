"""The request options of decoding token IDs (the tokenizer step's ``DECODE_IDS``), defined once.

A request to an ensemble's tokenizer step that sends ``DECODE_IDS`` (per sequence, its token
IDs as little-endian int32) gets ``DECODED`` (per sequence, its UTF-8 text), TEI's
``/decode`` (docs/sparse.md, "Token IDs to text"). Its one request parameter:

=======================  ================================================  ==========
parameter                values                                            when absent
=======================  ================================================  ==========
``skip_special_tokens``  ``true``/``false`` (``1``/``0``, ``yes``/``no``)   ``true``
=======================  ================================================  ==========
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from triton_embed.kind_options import KindOptions
from triton_embed.options import parse_flag

SKIP_SPECIAL_TOKENS = "skip_special_tokens"
#: Inputs and outputs of the tokenizer step's decoding (docs/sparse.md).
DECODE_INPUT = "DECODE_IDS"
DECODE_OUTPUT = "DECODED"


@dataclass(frozen=True)
class DecodeOptions(KindOptions):
    """One decode request's options; ``None``: the server's default.

    Attributes:
        skip_special_tokens: leave the tokenizer's special tokens (``[CLS]``, ``<s>``...)
            out of the text (default ``True``, as TEI's ``/decode``).

    Raises:
        OptionError: a value that is not a flag.
    """

    skip_special_tokens: bool | None = None

    names: ClassVar[tuple[str, ...]] = (SKIP_SPECIAL_TOKENS,)
    parsers: ClassVar[Mapping[str, Callable[[Any, str], Any]]] = {SKIP_SPECIAL_TOKENS: parse_flag}

    @property
    def skips_special_tokens(self) -> bool:
        """:attr:`skip_special_tokens`, the default (``True``) when not set."""
        return self.skip_special_tokens is not False
