"""How an error message quotes an offending value: cut, so the message stays small.

A message travels back in gRPC's trailing metadata, so every client-side and step-side
message quotes what it was sent through :func:`quote`.
"""

from __future__ import annotations

from typing import Any

#: The most characters of an offending value (or name) an error message quotes. A message
#: travels back in gRPC's trailing metadata (``grpc-message``), which clients cap at 8 KiB by
#: default (``grpc.max_metadata_size``); a longer message turns the answer into
#: ``RESOURCE_EXHAUSTED`` instead of the real ``INVALID_ARGUMENT``.
QUOTE_CHARS = 64


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters.

    Args:
        value: the offending value or name, as received.
        limit: the most characters of the value's ``repr`` kept.

    Returns:
        ``repr(value)`` when it is at most ``limit`` characters; else its first ``limit``
        characters, ``...`` and, for a string, its length: ``'aaaa... (100000 characters)``.
    """
    if isinstance(value, (str, bytes)):
        shown = repr(value[: limit + 1])
    else:
        try:
            shown = repr(value)
        except ValueError:  # an int past Python's int-to-str digit limit
            return f"<{type(value).__name__} too long to show>"
    if len(shown) <= limit and not (isinstance(value, (str, bytes)) and len(value) > limit):
        return shown
    size = f" ({len(value)} characters)" if isinstance(value, (str, bytes)) else ""
    return f"{shown[:limit]}...{size}"
