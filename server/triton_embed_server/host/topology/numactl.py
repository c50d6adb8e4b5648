"""Where ``numactl --hardware`` is parsed: NUMA nodes, their CPUs and memory, and distances.

:func:`parse_numactl` reads what ``numactl --hardware`` (``numactl -H``; see the numactl(8)
manual page) printed into a :class:`NumaTopology`, the result type that
:func:`~triton_embed_server.host.topology.sysfs.read_sysfs_nodes` also gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from triton_embed_server.host.topology import _text
from triton_embed_server.host.topology.cpulist import cpu_ranges_of
from triton_embed_server.host.topology.errors import TopologyParseError

NUMACTL_CMD = "numactl --hardware"


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its CPUs and memory.

    Attributes:
        cpus: CPU numbers in the order listed (empty for a memory-only node).
        size_mb: memory size in MB as printed by numactl (MiB: bytes >> 20); None when unknown.
        free_mb: free memory in MB (same unit); None when unknown.
    """

    cpus: tuple[int, ...]
    size_mb: int | None
    free_mb: int | None

    def to_dict(self) -> dict[str, Any]:
        """``cpus``, ``cpu_ranges`` (consecutive runs), ``cpu_count``, ``size_mb``, ``free_mb``."""
        return {
            "cpus": list(self.cpus),
            "cpu_ranges": _text.ranges_json(cpu_ranges_of(self.cpus)),
            "cpu_count": len(self.cpus),
            "size_mb": self.size_mb,
            "free_mb": self.free_mb,
        }


@dataclass(frozen=True)
class NumaTopology:
    """NUMA nodes and their distances, from ``numactl --hardware`` or sysfs.

    Attributes:
        nodes: per node number, its CPUs and memory.
        nodes_listed: the node list as printed (``available: 2 nodes (0-1)`` -> ``"0-1"``,
            sysfs ``online``); None when not printed.
        distance_nodes: the nodes of the distance matrix's rows and columns, in order.
        distance_matrix: ACPI SLIT distances (10 = local), rows/columns per ``distance_nodes``.
        source: ``"numactl --hardware"`` or ``"sysfs"``.
    """

    nodes: dict[int, NumaNode]
    nodes_listed: str | None
    distance_nodes: tuple[int, ...]
    distance_matrix: tuple[tuple[int, ...], ...]
    source: str = NUMACTL_CMD

    @property
    def node_count(self) -> int:
        """Number of nodes."""
        return len(self.nodes)

    @property
    def distances(self) -> dict[int, dict[int, int]]:
        """``distances[a][b]``: the distance from node ``a`` to node ``b``."""
        return {
            a: dict(zip(self.distance_nodes, row, strict=True))
            for a, row in zip(self.distance_nodes, self.distance_matrix, strict=True)
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; keys follow ``expected_numactl_*.json``."""
        sizes = [n.size_mb for n in self.nodes.values()]
        frees = [n.free_mb for n in self.nodes.values()]
        diagonal = [row[i] for i, row in enumerate(self.distance_matrix)]
        flat = [d for row in self.distance_matrix for d in row]
        return {
            "source": self.source,
            "node_count": self.node_count,
            "nodes_listed": self.nodes_listed,
            "nodes": {str(k): v.to_dict() for k, v in self.nodes.items()},
            "total_cpus": sum(len(n.cpus) for n in self.nodes.values()),
            "total_size_mb": None if None in sizes else sum(sizes),  # type: ignore[arg-type]
            "total_free_mb": None if None in frees else sum(frees),  # type: ignore[arg-type]
            "distance_nodes": list(self.distance_nodes),
            "distance_matrix": [list(r) for r in self.distance_matrix],
            "distances": {
                str(a): {str(b): d for b, d in row.items()} for a, row in self.distances.items()
            },
            "local_distance": min(diagonal) if diagonal else None,
            "max_distance": max(flat) if flat else None,
        }


def parse_numactl(text: str) -> NumaTopology:
    """Parse the output of ``numactl --hardware`` (``numactl -H``).

    Args:
        text: the command's standard output (trailing spaces on distance rows are fine).

    Raises:
        TopologyParseError: ``No NUMA available``, no ``available: N nodes`` line, a node
            count that differs from the ``node N cpus:`` lines, a CPU that is not a number,
            or a distance matrix that is not square.
    """
    if not text or not text.strip():
        raise TopologyParseError(
            f"{NUMACTL_CMD}: empty output; expected 'available: N nodes (...)'"
        )
    lines = [ln.strip() for ln in _text.lines(text)]
    if any(ln.startswith("No NUMA available") for ln in lines):
        raise TopologyParseError(
            f"{NUMACTL_CMD}: 'No NUMA available on this system' (the kernel exposes no NUMA "
            "nodes); use sysfs or lscpu instead"
        )
    available = next(
        (
            m
            for ln in lines
            if (m := re.fullmatch(r"available:\s*(\d+)\s+nodes?\s*(?:\((.*)\))?", ln))
        ),
        None,
    )
    if available is None:
        raise TopologyParseError(
            f"{NUMACTL_CMD}: no 'available: N nodes (...)' line; expected the output of "
            "'numactl --hardware'"
        )
    cpus: dict[int, tuple[int, ...]] = {}
    size: dict[int, int] = {}
    free: dict[int, int] = {}
    distance_nodes: tuple[int, ...] = ()
    distance_rows: list[tuple[int, tuple[int, ...]]] = []
    in_distances = False
    for ln in lines:
        if m := re.fullmatch(r"node\s+(\d+)\s+cpus:\s*(.*)", ln):
            tokens = m.group(2).split()
            if not all(t.isdigit() for t in tokens):
                raise TopologyParseError(
                    f"{NUMACTL_CMD}: {ln!r}: expected CPU numbers separated by spaces"
                )
            cpus[int(m.group(1))] = tuple(int(t) for t in tokens)
        elif m := re.fullmatch(r"node\s+(\d+)\s+(size|free):\s*(\d+)\s*MB", ln):
            (size if m.group(2) == "size" else free)[int(m.group(1))] = int(m.group(3))
        elif ln == "node distances:":
            in_distances = True
        elif in_distances and (m := re.fullmatch(r"node((?:\s+\d+)+)", ln)):
            distance_nodes = tuple(int(t) for t in m.group(1).split())
        elif in_distances and (m := re.fullmatch(r"(\d+):((?:\s+\d+)+)", ln)):
            distance_rows.append((int(m.group(1)), tuple(int(t) for t in m.group(2).split())))
    declared = int(available.group(1))
    if len(cpus) != declared:
        raise TopologyParseError(
            f"{NUMACTL_CMD}: 'available: {declared} nodes' but {len(cpus)} 'node N cpus:' lines; "
            "truncated output?"
        )
    matrix = tuple(row for _, row in distance_rows)
    if distance_rows or distance_nodes:
        width = len(distance_nodes)
        if [n for n, _ in distance_rows] != list(distance_nodes) or any(
            len(r) != width for r in matrix
        ):
            raise TopologyParseError(
                f"{NUMACTL_CMD}: the distance matrix is not square over nodes "
                f"{' '.join(map(str, distance_nodes)) or '(no header)'}; truncated output?"
            )
    nodes = {
        n: NumaNode(cpus=c, size_mb=size.get(n), free_mb=free.get(n))
        for n, c in sorted(cpus.items())
    }
    return NumaTopology(
        nodes=nodes,
        nodes_listed=available.group(2),
        distance_nodes=distance_nodes,
        distance_matrix=matrix,
        source=NUMACTL_CMD,
    )
