"""Where host-topology command outputs are read: plain parsers, one module per command.

Each parser takes the text a command printed (or a sysfs folder) and runs no subprocess:

* :mod:`.nvidia_smi_topo` -- ``nvidia-smi topo -m``: :func:`parse_topo_matrix` (GPU/NIC
  link matrix, CPU and NUMA affinity per GPU, ``NIC Legend``) -> :class:`TopoMatrix`;
* :mod:`.nvidia_smi_p2p` -- ``nvidia-smi topo -p2p r|w|n|a|p``: :func:`parse_p2p`
  (peer-to-peer status matrix) -> :class:`P2PMatrix`;
* :mod:`.lscpu` -- ``lscpu`` (C locale; old flat and newer sectioned layouts):
  :func:`parse_lscpu` -> :class:`LscpuInfo`;
* :mod:`.numactl` -- ``numactl --hardware``: :func:`parse_numactl` -> :class:`NumaTopology`;
* :mod:`.sysfs` -- the kernel's view: :func:`read_sysfs_nodes` (``/sys/devices/system/node``,
  the fallback when numactl is not installed) and :func:`read_sysfs_cpu_siblings`
  (``/sys/devices/system/cpu/cpu<N>/topology``: which CPUs are SMT siblings of one core);
* :mod:`.cores` -- :func:`core_groups` (CPUs -> physical cores, given a sibling map) and
  :func:`infer_siblings` (the documented guess of a sibling map from captured outputs,
  which carry no sibling information);
* :mod:`.cpulist` -- the kernel's CPU list format (``0-3,8,10-11``): :func:`parse_cpu_list`,
  :func:`parse_cpu_ranges`, :func:`cpu_ranges_of`, :func:`format_cpu_list`;
* :mod:`.errors` -- :class:`TopologyParseError`, the one exception every parser raises,
  naming the command and what it expected (never an ``IndexError``/``KeyError``).

:mod:`triton_embed_server.host.doctor` runs the commands and combines the results. Results are
frozen dataclasses whose ``to_dict()`` uses the field names of the ``expected_*.json`` files
of the topology test captures (``tests/data/topology/README.md``): GPU pair keys
``"GPUi-GPUj"`` with ``i < j`` in matrix order, inclusive ``[start, end]`` CPU ranges, NUMA
node keys as strings.
"""

from __future__ import annotations

from triton_embed_server.host.topology.cores import core_groups, infer_siblings
from triton_embed_server.host.topology.cpulist import (
    cpu_ranges_of,
    format_cpu_list,
    parse_cpu_list,
    parse_cpu_ranges,
)
from triton_embed_server.host.topology.errors import TopologyParseError
from triton_embed_server.host.topology.lscpu import LSCPU_CMD, LscpuInfo, parse_lscpu
from triton_embed_server.host.topology.numactl import NUMACTL_CMD, NumaTopology, parse_numactl
from triton_embed_server.host.topology.nvidia_smi_p2p import (
    P2P_CMD,
    P2P_LEGEND,
    P2PMatrix,
    parse_p2p,
)
from triton_embed_server.host.topology.nvidia_smi_topo import (
    CPU_PATH_LABELS,
    SMP_LABELS,
    TOPO_CMD,
    TopoMatrix,
    parse_topo_matrix,
)
from triton_embed_server.host.topology.sysfs import (
    SYSFS_CPU_ROOT,
    SYSFS_NODE_ROOT,
    read_sysfs_cpu_siblings,
    read_sysfs_nodes,
)

__all__ = [
    "CPU_PATH_LABELS",
    "LSCPU_CMD",
    "NUMACTL_CMD",
    "P2P_CMD",
    "P2P_LEGEND",
    "SMP_LABELS",
    "SYSFS_CPU_ROOT",
    "SYSFS_NODE_ROOT",
    "TOPO_CMD",
    "LscpuInfo",
    "NumaTopology",
    "P2PMatrix",
    "TopoMatrix",
    "TopologyParseError",
    "core_groups",
    "cpu_ranges_of",
    "format_cpu_list",
    "infer_siblings",
    "parse_cpu_list",
    "parse_cpu_ranges",
    "parse_lscpu",
    "parse_numactl",
    "parse_p2p",
    "parse_topo_matrix",
    "read_sysfs_cpu_siblings",
    "read_sysfs_nodes",
]
