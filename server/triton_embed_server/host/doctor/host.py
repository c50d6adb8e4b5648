"""The host as the doctor sees it: its NUMA nodes, physical cores and GPUs.

:func:`build_host` combines what the sources said (each parsed by
:mod:`triton_embed_server.host.topology`) into one :class:`HostTopology`, preferring the most
direct source for each fact and recording a warning where sources disagree or a fact had to
be guessed. GPU numbers are nvidia-smi's (PCI bus order).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from triton_embed_server.host.topology import (
    CPU_PATH_LABELS,
    LSCPU_CMD,
    TOPO_CMD,
    LscpuInfo,
    NumaTopology,
    P2PMatrix,
    TopologyParseError,
    TopoMatrix,
    core_groups,
    format_cpu_list,
    infer_siblings,
    parse_cpu_list,
)


@dataclass(frozen=True)
class HostGpu:
    """One GPU as the planner sees it.

    Attributes:
        index: nvidia-smi's GPU number (``GPU3`` -> 3).
        name: the matrix name (``"GPU3"``).
        numa_node: its NUMA node; None when unknown.
        numa_source: where ``numa_node`` came from: ``"NUMA Affinity"`` (the topo -m column),
            ``"CPU affinity overlap"`` (its CPU affinity lies within one node) or ``"unknown"``.
        cpus: its CPU affinity from ``nvidia-smi topo -m``, sorted (empty when ``N/A``).
    """

    index: int
    name: str
    numa_node: int | None
    numa_source: str
    cpus: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """``index``, ``name``, ``numa_node``, ``numa_source``, ``cpu_affinity`` (CPU list)."""
        return {
            "index": self.index,
            "name": self.name,
            "numa_node": self.numa_node,
            "numa_source": self.numa_source,
            "cpu_affinity": format_cpu_list(self.cpus),
        }


@dataclass(frozen=True)
class HostTopology:
    """The host's CPUs, NUMA nodes and GPUs, combined from every source that answered.

    Attributes:
        numa_nodes: per NUMA node that has CPUs, its CPUs (sorted).
        numa_source: where ``numa_nodes`` came from (``numactl --hardware``, ``sysfs``,
            ``lscpu``, the GPUs' CPU affinity, or the process's CPU affinity).
        gpus: the GPUs in nvidia-smi order (empty on a CPU-only host).
        sources: per command, ``"ok"`` or ``"not available: <why>"``.
        topo: parsed ``nvidia-smi topo -m``; None when not available.
        p2p: parsed ``nvidia-smi topo -p2p``; None when not available.
        lscpu: parsed ``lscpu``; None when not available.
        numa: parsed ``numactl --hardware`` or sysfs; None when neither was available.
        warnings: what a person should look at (unknown NUMA node, disagreeing sources).
        cores: per NUMA node whose SMT siblings are known, its physical cores: each a sorted
            tuple of sibling CPUs (within the node's CPUs), ordered by the lowest CPU. A node
            missing here has unknown siblings (see :meth:`core_groups`).
        smt_source: where ``cores`` came from (sysfs, lscpu and the CPU numbering, ...);
            ``"unknown"`` when no node's siblings are known.
    """

    numa_nodes: dict[int, tuple[int, ...]]
    numa_source: str
    gpus: tuple[HostGpu, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)
    topo: TopoMatrix | None = None
    p2p: P2PMatrix | None = None
    lscpu: LscpuInfo | None = None
    numa: NumaTopology | None = None
    warnings: tuple[str, ...] = ()
    cores: dict[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    smt_source: str = "unknown"

    def core_groups(self, node: int) -> list[tuple[int, ...]]:
        """The physical cores of a NUMA node, each a sorted tuple of its SMT sibling CPUs.

        Ordered by the lowest CPU. When the node's siblings are unknown every CPU counts as
        its own core (slices then follow CPU numbers, as before sibling information).

        Raises:
            KeyError: ``node`` has no CPUs on this host.
        """
        if node in self.cores:
            return list(self.cores[node])
        return [(c,) for c in self.numa_nodes[node]]

    def siblings_known(self, node: int) -> bool:
        """Whether the node's SMT siblings are known (from sysfs or a reliable guess)."""
        return node in self.cores

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: summary fields plus every parsed source."""
        topo = self.topo
        return {
            "sources": dict(self.sources),
            "numa_source": self.numa_source,
            "numa_nodes": {
                str(n): {"cpus": list(c), "cpu_list": format_cpu_list(c), "cpu_count": len(c)}
                for n, c in self.numa_nodes.items()
            },
            "gpus": [g.to_dict() for g in self.gpus],
            "gpu_links": dict(topo.links) if topo else {},
            "cross_numa_pairs": topo.cross_numa_pairs if topo else [],
            "sys_pairs": topo.sys_pairs if topo else [],
            "cpu_path_pairs": topo.pairs_with(CPU_PATH_LABELS) if topo else [],
            "p2p_problems": self.p2p.non_ok_pairs if self.p2p else {},
            "topo_matrix": topo.to_dict() if topo else None,
            "p2p": self.p2p.to_dict() if self.p2p else None,
            "lscpu": self.lscpu.to_dict() if self.lscpu else None,
            "numa": self.numa.to_dict() if self.numa else None,
            "smt_source": self.smt_source,
            "physical_cores": {
                str(n): [list(core) for core in cores] for n, cores in self.cores.items()
            },
            "warnings": list(self.warnings),
        }


def build_host(
    topo: TopoMatrix | None = None,
    p2p: P2PMatrix | None = None,
    lscpu: LscpuInfo | None = None,
    numa: NumaTopology | None = None,
    sources: dict[str, str] | None = None,
    allowed_cpus: Iterable[int] | None = None,
    siblings: Mapping[int, Iterable[int]] | None = None,
) -> HostTopology:
    """Combine parsed sources into one :class:`HostTopology`.

    NUMA nodes come from ``numa`` (numactl or sysfs), else ``lscpu``'s ``NUMA nodeN CPU(s)``,
    else the union of the GPUs' CPU affinity per ``NUMA Affinity``, else one node holding
    lscpu's online CPUs or ``allowed_cpus``. A GPU's node is its ``NUMA Affinity``; without
    that column, the one node its CPU affinity overlaps.

    Physical cores per node (:attr:`HostTopology.cores`) come from ``siblings`` for a node
    whose every CPU it lists, else from :func:`~triton_embed_server.host.topology.infer_siblings`
    with
    lscpu's ``Thread(s) per core`` (None without lscpu); a node neither settles has unknown
    siblings.

    Args:
        topo: parsed ``nvidia-smi topo -m``.
        p2p: parsed ``nvidia-smi topo -p2p``.
        lscpu: parsed ``lscpu``.
        numa: parsed ``numactl --hardware`` or
            :func:`~triton_embed_server.host.topology.read_sysfs_nodes`.
        sources: per command, ``"ok"`` / ``"not available: <why>"`` (for the report).
        allowed_cpus: the CPUs this process may use (``os.sched_getaffinity(0)``); node CPU
            lists are cut down to them, with a warning, so a plan never pins outside a cpuset.
        siblings: per CPU, the CPUs of its physical core, from this host's sysfs
            (:func:`~triton_embed_server.host.topology.read_sysfs_cpu_siblings`); None for a
            capture.

    Raises:
        TopologyParseError: no source says anything about the CPUs.
    """
    warnings: list[str] = []
    nodes, numa_source = _numa_nodes(topo, lscpu, numa, allowed_cpus, warnings)
    cores, smt_source = _physical_cores(nodes, lscpu, siblings)
    if lscpu is not None and numa is not None and lscpu.numa_nodes:
        from_lscpu = {n: lscpu.node_cpus(n) for n in lscpu.numa_nodes}
        from_numa = {n: tuple(sorted(v.cpus)) for n, v in numa.nodes.items() if v.cpus}
        if from_lscpu != from_numa:
            warnings.append(
                f"lscpu and {numa.source} disagree on the NUMA nodes' CPUs; using {numa.source}"
            )
    if allowed_cpus is not None:
        allowed = set(allowed_cpus)
        cut = {n: tuple(c for c in cpus if c in allowed) for n, cpus in nodes.items()}
        if cut != nodes:
            warnings.append(
                f"this process may run on CPUs {format_cpu_list(allowed)} only (cpuset or "
                "affinity mask); the plan uses those"
            )
            nodes = {n: c for n, c in cut.items() if c}
            cores = {
                n: tuple(g for core in groups if (g := tuple(c for c in core if c in allowed)))
                for n, groups in cores.items()
                if n in nodes
            }
    gpus = _host_gpus(topo, nodes, warnings) if topo is not None else ()
    if p2p is not None and topo is not None and p2p.gpus != topo.gpus:
        warnings.append(
            f"nvidia-smi topo -p2p lists {' '.join(p2p.gpus)} but topo -m lists "
            f"{' '.join(topo.gpus)}: captured on different hosts?"
        )
    return HostTopology(
        numa_nodes=nodes,
        numa_source=numa_source,
        gpus=gpus,
        sources=dict(sources or {}),
        topo=topo,
        p2p=p2p,
        lscpu=lscpu,
        numa=numa,
        warnings=tuple(warnings),
        cores=cores,
        smt_source=smt_source,
    )


#: :attr:`HostTopology.smt_source` of sibling lists read from this host's sysfs.
SYSFS_SIBLINGS = "sysfs (cpu<N>/topology/thread_siblings_list)"


def _physical_cores(
    nodes: dict[int, tuple[int, ...]],
    lscpu: LscpuInfo | None,
    siblings: Mapping[int, Iterable[int]] | None,
) -> tuple[dict[int, tuple[tuple[int, ...], ...]], str]:
    """Physical cores of the nodes whose SMT siblings are known, and where they came from."""
    threads = lscpu.threads_per_core if lscpu is not None else None
    host_cpus = len({c for cpus in nodes.values() for c in cpus})
    cores: dict[int, tuple[tuple[int, ...], ...]] = {}
    used: list[str] = []
    for node, cpus in nodes.items():
        if siblings and all(c in siblings for c in cpus):
            known, source = siblings, SYSFS_SIBLINGS
        else:
            known = infer_siblings(cpus, threads, host_cpus)
            if known is None:
                continue
            if threads == 1:
                source = f"{LSCPU_CMD} (1 thread per core)"
            elif threads is not None:
                source = f"{LSCPU_CMD} ({threads} threads per core) and the CPU numbering"
            else:
                source = (
                    f"the CPU numbering (no {LSCPU_CMD}: each node is two equal CPU runs "
                    f"{host_cpus // 2} apart, Linux's numbering of 2 SMT threads per core)"
                )
        cores[node] = core_groups(cpus, known)
        if source not in used:
            used.append(source)
    return cores, "; ".join(used) or "unknown"


def _numa_nodes(
    topo: TopoMatrix | None,
    lscpu: LscpuInfo | None,
    numa: NumaTopology | None,
    allowed_cpus: Iterable[int] | None,
    warnings: list[str],
) -> tuple[dict[int, tuple[int, ...]], str]:
    if numa is not None and any(n.cpus for n in numa.nodes.values()):
        memory_only = [n for n, v in numa.nodes.items() if not v.cpus]
        if memory_only:
            warnings.append(
                f"NUMA node(s) {', '.join(map(str, memory_only))} have memory but no CPUs; "
                "nothing is placed there"
            )
        return {n: tuple(sorted(v.cpus)) for n, v in numa.nodes.items() if v.cpus}, numa.source
    if lscpu is not None and lscpu.numa_nodes:
        nodes = {n: lscpu.node_cpus(n) for n in lscpu.numa_nodes}
        return {n: c for n, c in nodes.items() if c}, LSCPU_CMD
    if topo is not None and topo.numa_groups:
        nodes: dict[int, set[int]] = {}
        for node, names in topo.numa_groups.items():
            for name in names:
                nodes.setdefault(node, set()).update(topo.gpu_affinity[name].cpus)
        if all(nodes.values()):
            warnings.append(
                "no lscpu or numactl output: each NUMA node's CPUs are taken from the CPU "
                "affinity of its GPUs, which may leave out CPUs"
            )
            return {
                n: tuple(sorted(c)) for n, c in sorted(nodes.items())
            }, f"{TOPO_CMD} (GPU CPU affinity)"
    if lscpu is not None:
        online = lscpu.online_cpus
        cpus = parse_cpu_list(online, LSCPU_CMD) if online else list(range(lscpu.cpus))
        warnings.append("lscpu lists no NUMA nodes: all CPUs are taken as one node 0")
        return {0: tuple(sorted(cpus))}, f"{LSCPU_CMD} (one node)"
    if allowed_cpus is not None:
        warnings.append(
            "no NUMA information: the CPUs this process may use are taken as one node 0"
        )
        return {0: tuple(sorted(allowed_cpus))}, "process CPU affinity (one node)"
    raise TopologyParseError(
        "no CPU information: none of lscpu, numactl --hardware, sysfs or nvidia-smi topo -m "
        "(with CPU and NUMA affinity) gave CPU lists; capture lscpu.txt or numactl.txt"
    )


def _host_gpus(
    topo: TopoMatrix, nodes: dict[int, tuple[int, ...]], warnings: list[str]
) -> tuple[HostGpu, ...]:
    gpus = []
    for name in topo.gpus:
        aff = topo.gpu_affinity[name]
        cpus = aff.cpus
        node, source = aff.numa_node, "NUMA Affinity"
        if node is None:
            hit = [n for n, node_cpus in nodes.items() if set(cpus) & set(node_cpus)]
            if len(hit) == 1:
                node, source = hit[0], "CPU affinity overlap"
            else:
                source = "unknown"
                why = (
                    f"its CPU affinity {aff.cpu_affinity} spans NUMA nodes "
                    f"{', '.join(map(str, hit))}"
                    if hit
                    else "nvidia-smi gives neither a NUMA Affinity nor a usable CPU affinity"
                )
                warnings.append(f"{name}: NUMA node unknown ({why}); its instances are not pinned")
        elif node not in nodes:
            warnings.append(
                f"{name}: nvidia-smi says NUMA node {node}, which has no CPUs in the host's NUMA "
                "list; its instances are not pinned"
            )
            node, source = None, "unknown"
        elif cpus and set(cpus) != set(nodes[node]):
            warnings.append(
                f"{name}: nvidia-smi's CPU affinity {aff.cpu_affinity} is not the CPU list of NUMA "
                f"node {node} ({format_cpu_list(nodes[node])}): were the outputs captured on "
                "different hosts? Capture them all on the serving host"
            )
        gpus.append(HostGpu(int(name[3:]), name, node, source, cpus))
    return tuple(gpus)
