"""Byte units of the host checks (``/dev/shm``, NUMA node memory) and of their messages."""

from __future__ import annotations

MIB = 1 << 20
GIB = 1 << 30


def mib(n: int) -> str:
    """``n`` bytes in MiB (one decimal), for messages."""
    return f"{n / MIB:.1f} MiB"


def gib(n: int) -> str:
    """``n`` bytes in GiB (two decimals), for messages."""
    return f"{n / GIB:.2f} GiB"
