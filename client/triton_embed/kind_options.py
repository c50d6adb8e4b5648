"""The request options the sparse and multi-vector kinds share (one place for both)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from triton_embed.options import OptionError, RequestOptions, check_known


class KindOptions:
    """What the request options of the sparse and multi-vector kinds share (frozen dataclasses).

    A subclass declares its fields (``truncation``, ``allow_empty``, ``invalid_utf8``,
    ``input_type`` and its own), :attr:`names` (the request parameters, in documentation
    order) and :attr:`parsers` (parameter -> parser); values are parsed on construction.
    """

    names: ClassVar[tuple[str, ...]] = ()
    parsers: ClassVar[Mapping[str, Callable[[Any, str], Any]]] = {}

    def __post_init__(self) -> None:
        for name, parse in self.parsers.items():
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse(value, name))

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any]) -> Any:
        """Read the options from a request's KServe v2 parameters.

        Raises:
            ValueError: an unknown parameter, or a value outside its allowed set (the
                message starts with ``request parameter <name>=<value>``).
        """
        check_known(parameters, cls.names)
        try:
            return cls(**{n: parameters[n] for n in cls.names if n in parameters})
        except OptionError as exc:
            raise exc.with_prefix("request parameter ") from None

    def text_options(self) -> RequestOptions:
        """The options the tokenizer step applies to the texts (truncation, prompt, ...)."""
        return RequestOptions(
            truncation=self.truncation,  # type: ignore[attr-defined]
            allow_empty=self.allow_empty,  # type: ignore[attr-defined]
            invalid_utf8=self.invalid_utf8,  # type: ignore[attr-defined]
            input_type=self.input_type,  # type: ignore[attr-defined]
        )

    def to_parameters(self) -> dict[str, str | bool | int | float]:
        """The request parameters to send: only the options that are set."""
        out: dict[str, str | bool | int | float] = {}
        for name in self.names:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.value if isinstance(value, enum.Enum) else value
        return out
