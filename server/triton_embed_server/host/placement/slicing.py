"""The one slicing rule: which CPUs each of ``count`` instances sharing a set of CPUs gets.

:func:`chunk` is the rule; :func:`cpu_slice` applies it to CPU numbers (an instance of
``threads_bind=spread`` without NUMA placement) and :func:`core_slice` to physical cores (the
doctor's plan, so an instance holds both SMT threads of its cores).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def chunk(items: Sequence[T], index: int, count: int) -> Sequence[T]:
    """Part ``index`` of ``count`` contiguous, disjoint parts of ``items``.

    The first parts take the remainder. With more parts than items, part ``i`` is item
    ``i mod len(items)``. ``index`` is taken modulo ``count``.

    Args:
        items: what to split, in order (not empty).
        index: the part wanted.
        count: the number of parts (>= 1).

    Returns:
        The part, a slice of ``items`` (one item when ``count`` >= ``len(items)``).
    """
    index %= count
    if count >= len(items):
        return [items[index % len(items)]]
    base, extra = divmod(len(items), count)
    start = index * base + min(index, extra)
    return items[start : start + base + (1 if index < extra else 0)]


def cpu_slice(cpus: Iterable[int], index: int, count: int) -> list[int]:
    """The CPUs instance ``index`` of ``count`` binds to: a :func:`chunk` of the sorted CPUs.

    Args:
        cpus: the CPUs the instances share.
        index: the instance's number (taken modulo ``count``).
        count: the number of instances.

    Returns:
        The instance's CPUs, sorted.

    Raises:
        ValueError: ``cpus`` is empty or ``count`` < 1.
    """
    ordered = sorted(cpus)
    if not ordered or count < 1:
        raise ValueError(f"cannot split {len(ordered)} CPUs among {count} replicas")
    return list(chunk(ordered, index, count))


def core_slice(cores: Sequence[Sequence[int]], index: int, count: int) -> tuple[int, ...]:
    """The CPUs of instance ``index`` of ``count`` sharing a NUMA node: whole physical cores.

    :func:`chunk` applied to cores instead of CPU numbers: each slice of cores is flattened
    to its CPUs, so an instance holds both SMT threads of its cores and no other instance
    holds either. With more instances than cores, the CPUs in core order (a core's threads
    one after the other) are chunked instead: CPUs stay disjoint, the first instances keep
    whole cores, the rest get single threads. With more instances than CPUs, instance ``i``
    gets CPU ``i mod the CPU count`` (:func:`cpu_slice`). With one CPU per core this is
    exactly :func:`cpu_slice`.

    Args:
        cores: the node's cores, each a sorted tuple of its CPUs, ordered by the lowest CPU.
        index: the instance's number among the node's instances (taken modulo ``count``).
        count: instances on the node.

    Returns:
        The instance's CPUs, sorted.

    Raises:
        ValueError: no cores or CPUs, or ``count`` < 1.
    """
    cpus = [c for core in cores for c in core]
    if not cpus or count < 1:
        raise ValueError(f"cannot split {len(cpus)} CPUs among {count} instances")
    if count <= len(cores):
        mine = [c for core in chunk(cores, index, count) for c in core]
    elif count <= len(cpus):
        mine = list(chunk(cpus, index, count))
    else:
        mine = cpu_slice(cpus, index, count)
    return tuple(sorted(mine))
