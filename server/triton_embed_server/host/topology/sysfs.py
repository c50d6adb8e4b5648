"""Where the kernel's sysfs topology is read: NUMA nodes and SMT siblings.

* :func:`read_sysfs_nodes` -- ``/sys/devices/system/node`` (``node<N>/cpulist``,
  ``meminfo``, ``distance`` and ``online``; Linux kernel documentation,
  ``Documentation/ABI/stable/sysfs-devices-node``), the fallback when numactl is not
  installed;
* :func:`read_sysfs_cpu_siblings` -- ``/sys/devices/system/cpu/cpu<N>/topology`` (which CPUs
  are SMT threads of one physical core; ``Documentation/admin-guide/cputopology.rst``).
"""

from __future__ import annotations

import re
from pathlib import Path

from triton_embed_server.host.topology.cpulist import parse_cpu_list
from triton_embed_server.host.topology.errors import TopologyParseError
from triton_embed_server.host.topology.numactl import NumaNode, NumaTopology

SYSFS_NODE_ROOT = Path("/sys/devices/system/node")
SYSFS_CPU_ROOT = Path("/sys/devices/system/cpu")


def read_sysfs_nodes(root: Path = SYSFS_NODE_ROOT) -> NumaTopology:
    """NUMA nodes as the kernel exposes them under ``/sys/devices/system/node``.

    Reads ``node<N>/cpulist``, ``node<N>/meminfo`` (``MemTotal``/``MemFree`` kB, shown as
    MB = kB >> 10, the unit numactl prints), ``node<N>/distance`` and ``online``.

    Args:
        root: the ``node`` folder (a copy of it in tests).

    Raises:
        TopologyParseError: no ``node<N>`` folders, or an unreadable ``cpulist``.
    """
    dirs = sorted(
        (int(p.name[4:]), p)
        for p in (root.iterdir() if root.is_dir() else ())
        if re.fullmatch(r"node\d+", p.name)
    )
    if not dirs:
        raise TopologyParseError(
            f"sysfs: {root} has no node<N> folders (no NUMA information from the kernel)"
        )
    nodes: dict[int, NumaNode] = {}
    rows: list[tuple[int, ...]] = []
    for number, folder in dirs:
        try:
            cpulist = (folder / "cpulist").read_text()
        except OSError as exc:
            raise TopologyParseError(f"sysfs: cannot read {folder / 'cpulist'}: {exc}") from exc
        meminfo = _read_optional(folder / "meminfo")
        total = re.search(r"MemTotal:\s*(\d+)\s*kB", meminfo)
        free = re.search(r"MemFree:\s*(\d+)\s*kB", meminfo)
        nodes[number] = NumaNode(
            cpus=tuple(parse_cpu_list(cpulist, f"sysfs: {folder / 'cpulist'}")),
            size_mb=int(total.group(1)) >> 10 if total else None,
            free_mb=int(free.group(1)) >> 10 if free else None,
        )
        distance = _read_optional(folder / "distance").split()
        rows.append(tuple(int(d) for d in distance if d.isdigit()))
    numbers = tuple(n for n, _ in dirs)
    square = all(len(r) == len(numbers) for r in rows)
    online = _read_optional(root / "online").strip() or None
    return NumaTopology(
        nodes=nodes,
        nodes_listed=online,
        distance_nodes=numbers if square else (),
        distance_matrix=tuple(rows) if square else (),
        source="sysfs",
    )


def _read_optional(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def read_sysfs_cpu_siblings(root: Path = SYSFS_CPU_ROOT) -> dict[int, tuple[int, ...]]:
    """Per CPU, the CPUs of its physical core, as the kernel exposes them in sysfs.

    Reads ``cpu<N>/topology/thread_siblings_list`` (``core_cpus_list``, its newer name, when
    the old file is absent) under ``/sys/devices/system/cpu``: the logical CPUs that are SMT
    threads of the same core (``"0,48"``; ``"3"`` without SMT).

    Args:
        root: the ``cpu`` folder (a copy of it in tests).

    Returns:
        ``{cpu: sorted siblings, the CPU itself included}`` for every ``cpu<N>`` folder; a CPU
        whose file is missing, unreadable or garbled (an offline CPU has no ``topology``) is
        its own core. Empty when ``root`` is not a readable folder. Never raises.
    """
    try:
        entries = list(root.iterdir())
    except OSError:
        return {}
    siblings: dict[int, tuple[int, ...]] = {}
    for entry in entries:
        match = re.fullmatch(r"cpu(\d+)", entry.name)
        if not match:
            continue
        cpu = int(match.group(1))
        topology = entry / "topology"
        text = _read_optional(topology / "thread_siblings_list") or _read_optional(
            topology / "core_cpus_list"
        )
        try:
            found = set(parse_cpu_list(text, f"sysfs: {topology}"))
        except TopologyParseError:
            found = set()
        siblings[cpu] = tuple(sorted(found | {cpu}))
    return dict(sorted(siblings.items()))
