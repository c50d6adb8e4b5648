"""Where ``lscpu`` is parsed: CPU count, sockets, cores, threads and NUMA node CPU lists.

:func:`parse_lscpu` reads what ``lscpu`` (util-linux; see the lscpu(1) manual page) printed in
the C locale, in the old flat layout or the newer one with sections and wrapped values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from triton_embed_server.host.topology import _text
from triton_embed_server.host.topology.cpulist import parse_cpu_list, parse_cpu_ranges
from triton_embed_server.host.topology.errors import TopologyParseError

LSCPU_CMD = "lscpu"


def _count(ranges: Iterable[tuple[int, int]]) -> int:
    """Number of CPUs in inclusive ``(start, end)`` ranges."""
    return sum(b - a + 1 for a, b in ranges)


@dataclass(frozen=True)
class LscpuInfo:
    """What ``lscpu`` says about CPUs, sockets and NUMA nodes.

    Attributes:
        cpus: logical CPUs (``CPU(s)``).
        online_cpus: ``On-line CPU(s) list`` as printed; None when absent.
        vendor_id: ``Vendor ID``; None when absent.
        model_name: the first ``Model name``; None when absent.
        threads_per_core: ``Thread(s) per core``; None when absent or ``-``.
        cores_per_socket: ``Core(s) per socket``; None when absent or ``-``.
        sockets: ``Socket(s)``; None when absent or ``-``.
        numa_node_count: ``NUMA node(s)``, else the number of node lines.
        numa_nodes: per node number, its ``NUMA nodeN CPU(s)`` list as printed.
    """

    cpus: int
    online_cpus: str | None
    vendor_id: str | None
    model_name: str | None
    threads_per_core: int | None
    cores_per_socket: int | None
    sockets: int | None
    numa_node_count: int
    numa_nodes: dict[int, str]

    @property
    def physical_cores_total(self) -> int | None:
        """``cores_per_socket * sockets``; None when either is unknown."""
        if self.cores_per_socket is None or self.sockets is None:
            return None
        return self.cores_per_socket * self.sockets

    def node_cpus(self, node: int) -> tuple[int, ...]:
        """The CPUs of a NUMA node, sorted."""
        return tuple(sorted(parse_cpu_list(self.numa_nodes[node], f"{LSCPU_CMD}: NUMA node{node}")))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; keys follow ``expected_lscpu_*.json``."""
        nodes = {}
        for node, cpu_list in self.numa_nodes.items():
            ranges = parse_cpu_ranges(cpu_list, f"{LSCPU_CMD}: NUMA node{node}")
            nodes[str(node)] = {
                "cpu_list": cpu_list,
                "cpu_ranges": _text.ranges_json(ranges),
                "cpu_count": _count(ranges),
            }
        return {
            "cpus": self.cpus,
            "online_cpus": self.online_cpus,
            "vendor_id": self.vendor_id,
            "model_name": self.model_name,
            "threads_per_core": self.threads_per_core,
            "cores_per_socket": self.cores_per_socket,
            "sockets": self.sockets,
            "numa_node_count": self.numa_node_count,
            "numa_nodes": nodes,
            "physical_cores_total": self.physical_cores_total,
        }


def _lscpu_fields(lines: list[str]) -> list[tuple[str, str]]:
    """``(key, value)`` per ``Key: value`` line; wrapped values (``Flags``) are re-joined.

    A line indented at least as far as the previous value's column continues that value
    (the newer tty layout wraps at the terminal width, sometimes inside a word).
    """
    fields: list[tuple[str, str]] = []
    value_col = 0
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" \t"))
        if fields and value_col and indent >= value_col:
            key, value = fields[-1]
            fields[-1] = (key, value + line[value_col:].rstrip())
            continue
        match = re.fullmatch(r"\s*([^:]+?):(\s*)(.*?)\s*", line)
        if not match:
            continue
        fields.append((match.group(1), match.group(3)))
        value_col = match.start(3) if match.group(3) else 0
    return fields


def parse_lscpu(text: str) -> LscpuInfo:
    """Parse the output of ``lscpu`` (C locale), old flat or newer sectioned layout.

    Args:
        text: the command's standard output.

    Raises:
        TopologyParseError: no ``Key: value`` lines, no ``CPU(s):`` line, or a count or
            CPU list that cannot be read.
    """
    if not text or not text.strip():
        raise TopologyParseError(
            f"{LSCPU_CMD}: empty output; expected 'CPU(s):', 'NUMA node0 CPU(s):' ..."
        )
    fields = _lscpu_fields(_text.lines(text))
    if not fields:
        raise TopologyParseError(
            f"{LSCPU_CMD}: no 'Key: value' lines; expected the output of 'lscpu' in the C locale"
        )
    first: dict[str, str] = {}
    for key, value in fields:
        first.setdefault(key, value)

    def count(key: str) -> int | None:
        value = first.get(key)
        if value is None or value == "-":
            return None
        if not value.isdigit():
            raise TopologyParseError(f"{LSCPU_CMD}: '{key}: {value}': expected a whole number")
        return int(value)

    cpus = count("CPU(s)")
    if cpus is None:
        raise TopologyParseError(
            f"{LSCPU_CMD}: no 'CPU(s):' line; expected the output of 'lscpu' in the C locale "
            "(run it with LC_ALL=C)"
        )
    numa_nodes: dict[int, str] = {}
    for key, value in fields:
        match = re.fullmatch(r"NUMA node(\d+) CPU\(s\)", key)
        if match:
            parse_cpu_ranges(value, f"{LSCPU_CMD}: {key}")
            numa_nodes[int(match.group(1))] = value
    online = first.get("On-line CPU(s) list")
    if online is not None:
        parse_cpu_ranges(online, f"{LSCPU_CMD}: On-line CPU(s) list")
    node_count = count("NUMA node(s)")
    return LscpuInfo(
        cpus=cpus,
        online_cpus=online,
        vendor_id=first.get("Vendor ID"),
        model_name=first.get("Model name"),
        threads_per_core=count("Thread(s) per core"),
        cores_per_socket=count("Core(s) per socket"),
        sockets=count("Socket(s)"),
        numa_node_count=node_count if node_count is not None else len(numa_nodes),
        numa_nodes=dict(sorted(numa_nodes.items())),
    )
