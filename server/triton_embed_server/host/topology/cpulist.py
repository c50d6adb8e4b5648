"""The kernel's CPU list format (``0-3,8,10-11``): parse it, and print CPU sets in it.

The format is the one of sysfs ``cpulist`` files, ``lscpu``'s ``On-line CPU(s) list`` and
``NUMA nodeN CPU(s)`` lines and the ``CPU Affinity`` column of ``nvidia-smi topo -m``
(Linux kernel documentation, ``Documentation/admin-guide/cputopology.rst``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from triton_embed_server.host.topology.errors import TopologyParseError

# Largest CONFIG_NR_CPUS the Linux kernel accepts (arch/x86/Kconfig, NR_CPUS_RANGE_END with
# MAXSMP): CPU numbers are 0..8191, so a list naming more is a damaged capture.
MAX_CPUS = 8192


def parse_cpu_ranges(text: str, what: str = "CPU list") -> tuple[tuple[int, int], ...]:
    """Inclusive ``(start, end)`` ranges of a kernel CPU list, in the order printed.

    Args:
        text: ``"0-3,8,10-11"`` (the format of ``lscpu``, sysfs ``cpulist`` and the
            ``CPU Affinity`` column of ``nvidia-smi topo -m``); empty or blank -> ``()``.
        what: names the source in the error message.

    Returns:
        One ``(start, end)`` pair per comma-separated item; ``N`` gives ``(N, N)``.

    Raises:
        TopologyParseError: an item is not ``N`` or ``N-M`` with ``N <= M``, or names a CPU
            at or above :data:`MAX_CPUS`.
    """
    text = text.strip()
    if not text:
        return ()
    ranges = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise TopologyParseError(
                f"{what}: cannot read CPU list {text!r}: expected CPU numbers and inclusive "
                "ranges such as '0-3,8,10-11'"
            )
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        if end < start:
            raise TopologyParseError(
                f"{what}: CPU range {part.strip()!r} in {text!r} ends before it starts"
            )
        if end >= MAX_CPUS:
            raise TopologyParseError(
                f"{what}: CPU {end} in {text!r} is beyond the kernel's limit of {MAX_CPUS} CPUs "
                "(CONFIG_NR_CPUS): check the capture"
            )
        ranges.append((start, end))
    return tuple(ranges)


def parse_cpu_list(text: str, what: str = "CPU list") -> list[int]:
    """The CPUs of a kernel CPU list, in the order printed: ``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``.

    Args:
        text: the CPU list (see :func:`parse_cpu_ranges`).
        what: names the source in the error message.

    Returns:
        Every CPU of every range, ranges in the order printed.

    Raises:
        TopologyParseError: see :func:`parse_cpu_ranges`.
    """
    return [cpu for start, end in parse_cpu_ranges(text, what) for cpu in range(start, end + 1)]


def cpu_ranges_of(cpus: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Runs of consecutive CPUs as inclusive ranges: ``[0, 1, 2, 8]`` -> ``((0, 2), (8, 8))``."""
    ranges: list[tuple[int, int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], cpu)
        else:
            ranges.append((cpu, cpu))
    return tuple(ranges)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The kernel CPU list format of a set of CPUs: ``[0, 1, 2, 8]`` -> ``"0-2,8"``."""
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in cpu_ranges_of(cpus))
