"""Batch once, split once: flatten the requests of one ``execute`` call and split results back.

The same rule pytriton's ``@batch`` decorator follows: one engine call per ``execute``,
results split by per-request counts, and the total checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def flatten(per_request: Sequence[Sequence[T]]) -> tuple[list[T], list[int]]:
    """Concatenate per-request items.

    Args:
        per_request: one sequence of items per request (texts, token-ID lists, ...).

    Returns:
        ``(flat, counts)``: all items in request order, and the number of items of each
        request (``sum(counts) == len(flat)``).
    """
    flat: list[T] = []
    counts: list[int] = []
    for items in per_request:
        flat.extend(items)
        counts.append(len(items))
    return flat, counts


def split(flat: Sequence[T], counts: Sequence[int]) -> list[Sequence[T]]:
    """Split ``flat`` into consecutive slices of ``counts[i]`` items (numpy arrays too).

    Args:
        flat: the results of all requests, in request order (a list, or an array whose
            first axis is the item axis).
        counts: items per request, as :func:`flatten` returned them.

    Returns:
        ``len(counts)`` slices of ``flat``, of the same type (a numpy slice is a view).

    Raises:
        ValueError: a count is negative or the counts do not add up to ``len(flat)``.
    """
    if any(c < 0 for c in counts):
        raise ValueError(f"negative count in {list(counts)}")
    total = sum(counts)
    if total != len(flat):
        raise ValueError(f"counts add up to {total} but there are {len(flat)} results")
    out: list[Sequence[T]] = []
    pos = 0
    for c in counts:
        out.append(flat[pos : pos + c])
        pos += c
    return out
