"""``triton-embed doctor``: read the host's topology and plan where embedder instances run.

Three steps, each a plain function:

* :func:`gather_host` runs ``nvidia-smi topo -m``, ``nvidia-smi topo -p2p w``, ``lscpu`` and
  ``numactl --hardware`` (or reads their captured outputs from a folder, see
  :data:`CAPTURE_FILES`), falls back to sysfs for NUMA nodes, and combines the parsed
  results (:mod:`triton_embed_server.topology`) into a :class:`HostTopology` via :func:`build_host`.
* :func:`plan_placement` turns a host into a :class:`PlacementPlan`: which instances, cores
  and GPUs go on which NUMA node, tensor-parallel groups that never cross a NUMA node, and
  one server per NUMA node (``numactl --cpunodebind=N --membind=N``, ``CUDA_VISIBLE_DEVICES``).
  Each instance gets whole physical cores (both SMT threads), disjoint from the other
  instances' cores: :func:`core_slice` of the node's cores (:meth:`HostTopology.core_groups`,
  from sysfs live, guessed by :func:`~triton_embed_server.topology.infer_siblings` from a capture).
* :func:`render_report` prints both for a person; ``to_dict()`` of each gives the JSON.

GPU numbers are nvidia-smi's (PCI bus order); a server's environment therefore sets
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA numbers the GPUs the same way.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triton_embed_server.engine import chunk, cpu_slice
from triton_embed_server.topology import (
    CPU_PATH_LABELS,
    LSCPU_CMD,
    NUMACTL_CMD,
    P2P_CMD,
    P2P_LEGEND,
    SMP_LABELS,
    SYSFS_CPU_ROOT,
    SYSFS_NODE_ROOT,
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
    parse_lscpu,
    parse_numactl,
    parse_p2p,
    parse_topo_matrix,
    read_sysfs_cpu_siblings,
    read_sysfs_nodes,
)

#: File names ``--from-dir`` reads: the captured standard output of each command.
CAPTURE_FILES = {
    "topo_m": "topo_m.txt",  # nvidia-smi topo -m
    "p2p": "p2p.txt",  # nvidia-smi topo -p2p w (or r)
    "lscpu": "lscpu.txt",  # LC_ALL=C lscpu
    "numactl": "numactl.txt",  # numactl --hardware
}
#: The commands :func:`gather_host` runs on this host.
COMMANDS = {
    "topo_m": ("nvidia-smi", "topo", "-m"),
    "p2p": ("nvidia-smi", "topo", "-p2p", "w"),
    "lscpu": ("lscpu",),
    "numactl": ("numactl", "--hardware"),
}
COMMAND_TIMEOUT_S = 10.0
OK = "ok"

#: Order of preference among link labels for tensor-parallel groups (lower is better).
_LINK_ORDER = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5, "SOC": 5}
_MAX_COMBINATIONS = 20_000


# --- gathering ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandOutput:
    """A command's standard output, or why there is none.

    Attributes:
        text: the output; None when the command could not give one.
        status: ``"ok"`` or ``"not available: <why>"``.
    """

    text: str | None
    status: str


def run_command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> CommandOutput:
    """Run a read-only host command in the C locale; never raises.

    Returns:
        The output, or ``"not available: ..."`` naming a missing command, a timeout, or a
        non-zero exit status with the first line the command printed.
    """
    if shutil.which(argv[0]) is None:
        return CommandOutput(None, f"not available: {argv[0]} not found on PATH")
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired:
        return CommandOutput(
            None, f"not available: {' '.join(argv)} timed out after {timeout_s:g} s"
        )
    except OSError as exc:
        return CommandOutput(None, f"not available: {' '.join(argv)}: {exc}")
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        why = f": {said[0].strip()}" if said else ""
        return CommandOutput(
            None, f"not available: {' '.join(argv)} exited with status {done.returncode}{why}"
        )
    return CommandOutput(done.stdout, OK)


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

    def link(self, a: int, b: int) -> str | None:
        """The ``topo -m`` link label between GPUs ``a`` and ``b``; None without a matrix."""
        if self.topo is None:
            return None
        return self.topo.link(f"GPU{a}", f"GPU{b}")

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
    whose every CPU it lists, else from :func:`~triton_embed_server.topology.infer_siblings` with
    lscpu's ``Thread(s) per core`` (None without lscpu); a node neither settles has unknown
    siblings.

    Args:
        topo: parsed ``nvidia-smi topo -m``.
        p2p: parsed ``nvidia-smi topo -p2p``.
        lscpu: parsed ``lscpu``.
        numa: parsed ``numactl --hardware`` or :func:`read_sysfs_nodes`.
        sources: per command, ``"ok"`` / ``"not available: <why>"`` (for the report).
        allowed_cpus: the CPUs this process may use (``os.sched_getaffinity(0)``); node CPU
            lists are cut down to them, with a warning, so a plan never pins outside a cpuset.
        siblings: per CPU, the CPUs of its physical core, from this host's sysfs
            (:func:`~triton_embed_server.topology.read_sysfs_cpu_siblings`); None for a capture.

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
        gpus.append(HostGpu(int(name[3:]), name, node, source, cpus))
    return tuple(gpus)


def gather_host(
    from_dir: Path | None = None,
    *,
    run: Callable[[Sequence[str], float], CommandOutput] = run_command,
    timeout_s: float = COMMAND_TIMEOUT_S,
    sysfs_root: Path = SYSFS_NODE_ROOT,
    process_cpus: Callable[[], Iterable[int]] = lambda: os.sched_getaffinity(0),
    cpu_sysfs_root: Path = SYSFS_CPU_ROOT,
) -> HostTopology:
    """Read this host's topology, or one captured in a folder.

    Live (``from_dir`` None): runs the :data:`COMMANDS` with ``timeout_s`` each; a missing
    command, a timeout or a non-zero exit is recorded as ``"not available: <why>"``; without
    numactl the NUMA nodes come from ``sysfs_root``; SMT siblings come from
    ``cpu_sysfs_root``; node CPU lists are cut to this process's CPU affinity. From a
    folder: reads the :data:`CAPTURE_FILES` that exist (no sysfs, no affinity: the folder
    describes another host; SMT siblings are guessed from lscpu and the CPU numbering).

    Args:
        from_dir: folder of captured outputs; None to run the commands here.
        run: runs one command (tests pass a fake).
        timeout_s: limit per command, seconds.
        sysfs_root: the sysfs NUMA folder used when numactl is not available.
        process_cpus: the CPUs this process may use (live only; tests pass a fake).
        cpu_sysfs_root: the sysfs ``cpu`` folder read for SMT siblings (live only).

    Raises:
        TopologyParseError: an output is present but cannot be parsed (the message names
            the command or file), or no source gives the CPUs.
        FileNotFoundError: ``from_dir`` is not a folder.
    """
    texts: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    if from_dir is not None:
        if not from_dir.is_dir():
            raise FileNotFoundError(f"--from-dir {from_dir}: no such folder")
        for key, fname in CAPTURE_FILES.items():
            path = from_dir / fname
            texts[key] = path.read_text(errors="replace") if path.is_file() else None
            sources[_label(key)] = OK if texts[key] is not None else f"not available: no {path}"
        if all(t is None for t in texts.values()):
            raise TopologyParseError(
                f"--from-dir {from_dir}: holds none of {', '.join(CAPTURE_FILES.values())}"
            )
    else:
        for key in ("topo_m", "p2p", "lscpu", "numactl"):
            if key == "p2p" and texts.get("topo_m") is None:
                texts[key], sources[_label(key)] = (
                    None,
                    "not available: no GPU matrix (nvidia-smi topo -m)",
                )
                continue
            out = run(COMMANDS[key], timeout_s)
            texts[key], sources[_label(key)] = out.text, out.status

    def parsed(key: str, parse: Callable[[str], Any]) -> Any:
        text = texts.get(key)
        if text is None:
            return None
        try:
            return parse(text)
        except TopologyParseError as exc:
            where = f" ({from_dir / CAPTURE_FILES[key]})" if from_dir is not None else ""
            raise TopologyParseError(f"{exc}{where}") from exc

    p2p_mode = "w" if from_dir is None else None
    topo = parsed("topo_m", parse_topo_matrix)
    p2p = parsed("p2p", lambda t: parse_p2p(t, mode=p2p_mode))
    lscpu = parsed("lscpu", parse_lscpu)
    numa = parsed("numactl", parse_numactl)
    allowed = None
    siblings = None
    if from_dir is None:
        siblings = read_sysfs_cpu_siblings(cpu_sysfs_root)
        if numa is None:
            try:
                numa = read_sysfs_nodes(sysfs_root)
                sources["sysfs"] = OK
            except TopologyParseError as exc:
                sources["sysfs"] = f"not available: {exc}"
        allowed = sorted(process_cpus())
    return build_host(topo, p2p, lscpu, numa, sources, allowed_cpus=allowed, siblings=siblings)


def _label(key: str) -> str:
    return _LABELS[key]


_LABELS = {"topo_m": TOPO_CMD, "p2p": P2P_CMD, "lscpu": LSCPU_CMD, "numactl": NUMACTL_CMD}
#: One line naming each capture file and its command (for ``--help``).
CAPTURE_FILES_HELP = ", ".join(
    f"{name} ({'nvidia-smi topo -p2p w|r' if key == 'p2p' else _LABELS[key]})"
    for key, name in CAPTURE_FILES.items()
)


# --- planning ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedInstance:
    """One embedder instance: where it runs.

    Attributes:
        index: instance number, 0-based, in GPU order (``instances_per_gpu`` per GPU or
            tensor-parallel group) or NUMA-node order on a CPU-only host.
        numa_node: the node it is bound to; None when its GPU's node is unknown.
        cpus: its CPUs, sorted: a :func:`core_slice` of the node's physical cores (whole
            cores, disjoint from the other instances on the node unless there are more
            instances than cores); empty when not pinned.
        gpu: nvidia-smi GPU number (the tensor-parallel group's first GPU, rank 0); None on
            a CPU-only host.
        gpus: all its GPUs (``[gpu]`` without tensor parallelism; empty on a CPU-only host).
        tp_group: index into :attr:`PlacementPlan.tp_groups`; None when ``tp_size`` is 1.
    """

    index: int
    numa_node: int | None
    cpus: tuple[int, ...]
    gpu: int | None
    gpus: tuple[int, ...] = ()
    tp_group: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"index", "numa_node", "cpus", "gpu", "gpus", "tp_group"}``."""
        return {
            "index": self.index,
            "numa_node": self.numa_node,
            "cpus": list(self.cpus),
            "gpu": self.gpu,
            "gpus": list(self.gpus),
            "tp_group": self.tp_group,
        }


@dataclass(frozen=True)
class TensorParallelGroup:
    """GPUs that serve one model replica together, all on one NUMA node.

    Attributes:
        index: group number.
        numa_node: the node of every GPU in it.
        gpus: nvidia-smi GPU numbers, ascending.
        worst_link: the slowest ``topo -m`` link label inside the group (None without a matrix).
    """

    index: int
    numa_node: int
    gpus: tuple[int, ...]
    worst_link: str | None

    def to_dict(self) -> dict[str, Any]:
        """``{"index", "numa_node", "gpus", "worst_link"}``."""
        return {
            "index": self.index,
            "numa_node": self.numa_node,
            "gpus": list(self.gpus),
            "worst_link": self.worst_link,
        }


@dataclass(frozen=True)
class UngroupedGpu:
    """A GPU left out of every tensor-parallel group, and why."""

    gpu: int
    numa_node: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """``{"gpu", "numa_node", "reason"}``."""
        return {"gpu": self.gpu, "numa_node": self.numa_node, "reason": self.reason}


@dataclass(frozen=True)
class ServerPlan:
    """One tritonserver process: one per NUMA node on a multi-node host, else one.

    Attributes:
        numa_node: the node it is bound to; None for instances whose node is unknown.
        cpus: the node's CPUs (every CPU on a single-node host).
        gpus: nvidia-smi numbers of its GPUs; inside the server they are 0, 1, ... in this order.
        instances: indices of its :class:`PlannedInstance` s.
        numactl_prefix: ``["numactl", "--cpunodebind=N", "--membind=N"]`` to start it with;
            None on a single-node host or for an unknown node.
        cuda_visible_devices: ``CUDA_VISIBLE_DEVICES`` value (``"2,3"``); None without GPUs.
    """

    numa_node: int | None
    cpus: tuple[int, ...]
    gpus: tuple[int, ...]
    instances: tuple[int, ...]
    numactl_prefix: tuple[str, ...] | None
    cuda_visible_devices: str | None

    @property
    def env(self) -> dict[str, str]:
        """Environment for the server: its GPUs, numbered in PCI bus order as nvidia-smi does."""
        if self.cuda_visible_devices is None:
            return {}
        return {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": self.cuda_visible_devices,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``numactl_prefix`` as an argv list)."""
        return {
            "numa_node": self.numa_node,
            "cpus": list(self.cpus),
            "gpus": list(self.gpus),
            "instances": list(self.instances),
            "numactl_prefix": list(self.numactl_prefix) if self.numactl_prefix else None,
            "cuda_visible_devices": self.cuda_visible_devices,
            "env": self.env,
        }


@dataclass(frozen=True)
class PlacementPlan:
    """Where embedder instances, cores and GPUs go. JSON via :meth:`to_dict`.

    Attributes:
        kind: ``"gpu"`` or ``"cpu"`` (no GPU matrix: a CPU-only host).
        instances_per_gpu: instances per GPU (per tensor-parallel group when ``tp_size`` > 1).
        cpu_instances: instances on a CPU-only host; None on a GPU host.
        tp_size: GPUs per tensor-parallel group.
        instances: the instances.
        tp_groups: tensor-parallel groups (empty when ``tp_size`` is 1).
        ungrouped_gpus: GPUs not placed in any group, with the reason.
        servers: the tritonserver processes.
        warnings: what a person should look at.
    """

    kind: str
    instances_per_gpu: int | None
    cpu_instances: int | None
    tp_size: int
    instances: tuple[PlannedInstance, ...]
    tp_groups: tuple[TensorParallelGroup, ...]
    ungrouped_gpus: tuple[UngroupedGpu, ...]
    servers: tuple[ServerPlan, ...]
    warnings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "kind": self.kind,
            "instances_per_gpu": self.instances_per_gpu,
            "cpu_instances": self.cpu_instances,
            "tp_size": self.tp_size,
            "instances": [i.to_dict() for i in self.instances],
            "tp_groups": [g.to_dict() for g in self.tp_groups],
            "ungrouped_gpus": [g.to_dict() for g in self.ungrouped_gpus],
            "servers": [s.to_dict() for s in self.servers],
            "warnings": list(self.warnings),
        }


def link_rank(label: str | None) -> tuple[int, int]:
    """Sort key of a ``topo -m`` link label, best first.

    NV# (more links first), PIX, PXB, PHB, NODE, SYS/SOC, then unknown labels and None.
    """
    if label is not None and label.startswith("NV") and label[2:].isdigit():
        return (0, -int(label[2:]))
    return (_LINK_ORDER.get(label or "", 6), 0)


def form_tp_groups(
    host: HostTopology, tp_size: int
) -> tuple[list[TensorParallelGroup], list[UngroupedGpu]]:
    """Tensor-parallel groups of ``tp_size`` GPUs, each within one NUMA node.

    Per node, groups are picked greedily: the group whose slowest link is best (NV# over
    PIX/PXB over PHB/NODE/SYS), then the best sum of links, then the lowest GPU numbers.
    GPUs left over on a node, and GPUs of unknown node, are returned as ungrouped: a group
    never crosses a NUMA node.
    """
    groups: list[TensorParallelGroup] = []
    ungrouped: list[UngroupedGpu] = []
    by_node: dict[int, list[int]] = {}
    for gpu in host.gpus:
        if gpu.numa_node is None:
            ungrouped.append(UngroupedGpu(gpu.index, None, "NUMA node unknown"))
        else:
            by_node.setdefault(gpu.numa_node, []).append(gpu.index)

    def key(combo: tuple[int, ...]) -> tuple:
        ranks = [link_rank(host.link(a, b)) for a, b in itertools.combinations(combo, 2)]
        return (max(ranks), sum(r[0] for r in ranks), sum(r[1] for r in ranks), combo)

    for node in sorted(by_node):
        left = sorted(by_node[node])
        while len(left) >= tp_size:
            if math.comb(len(left), tp_size) > _MAX_COMBINATIONS:
                best = tuple(left[:tp_size])
            else:
                best = min(itertools.combinations(left, tp_size), key=key)
            worst = None
            if host.topo is not None:
                worst = max(
                    (host.link(a, b) for a, b in itertools.combinations(best, 2)), key=link_rank
                )
            groups.append(TensorParallelGroup(len(groups), node, best, worst))
            left = [g for g in left if g not in best]
        for gpu in left:
            ungrouped.append(
                UngroupedGpu(
                    gpu,
                    node,
                    f"NUMA node {node} has {len(by_node[node])} GPU(s); {len(left)} left over "
                    f"after groups of {tp_size}, and a group may not cross NUMA nodes",
                )
            )
    return groups, sorted(ungrouped, key=lambda u: u.gpu)


def core_slice(cores: Sequence[Sequence[int]], index: int, count: int) -> tuple[int, ...]:
    """The CPUs of instance ``index`` of ``count`` sharing a NUMA node: whole physical cores.

    The rule of :func:`~triton_embed_server.engine.cpu_slice` applied to cores instead of
    CPU numbers: the cores are split into ``count`` contiguous, disjoint slices (the first
    slices get the remainder) and each slice is flattened to its CPUs, so an instance holds
    both SMT threads of its cores and no other instance holds either. With more instances
    than cores, the CPUs in core order (a core's threads one after the other) are split the
    same way: CPUs stay disjoint, the first instances keep whole cores, the rest get single
    threads. With more instances than CPUs, ``cpu_slice``'s rule: instance ``i`` gets CPU
    ``i mod the CPU count``. With one CPU per core this is exactly ``cpu_slice``.

    Args:
        cores: the node's cores, ordered by their lowest CPU (:meth:`HostTopology.core_groups`).
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


def plan_placement(
    host: HostTopology,
    instances_per_gpu: int = 4,
    cpu_instances: int | None = None,
    tp_size: int = 1,
) -> PlacementPlan:
    """Plan instances, cores, GPUs and servers for a host.

    GPU host: each GPU's instances (each tensor-parallel group's, when ``tp_size`` > 1) go
    on that GPU's NUMA node; the node's physical cores are split among all instances on the
    node with :func:`core_slice`, so slices are whole cores (SMT siblings kept together) and
    disjoint. A node whose SMT siblings are unknown counts each CPU as a core (a warning
    says so). CPU-only host:
    ``cpu_instances`` spread evenly over the nodes (the first nodes take the remainder),
    each with a disjoint slice of its node. One server per NUMA node on a multi-node host,
    else one.

    Args:
        host: from :func:`gather_host` or :func:`build_host`.
        instances_per_gpu: instances per GPU, or per tensor-parallel group.
        cpu_instances: instances on a CPU-only host; None = one per NUMA node. Ignored on a
            GPU host.
        tp_size: GPUs per tensor-parallel group; ignored (with a warning) on a CPU-only host.

    Raises:
        ValueError: a count below 1.
    """
    for name, value in (
        ("instances_per_gpu", instances_per_gpu),
        ("tp_size", tp_size),
        ("cpu_instances", cpu_instances),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    warnings: list[str] = []
    multi_node = len(host.numa_nodes) > 1
    groups: list[TensorParallelGroup] = []
    ungrouped: list[UngroupedGpu] = []
    if host.gpus:
        if tp_size == 1:
            units = [(g.numa_node, (g.index,), None) for g in host.gpus]
        else:
            groups, ungrouped = form_tp_groups(host, tp_size)
            units = [(g.numa_node, g.gpus, g.index) for g in groups]
            _warn_tp(host, tp_size, groups, ungrouped, warnings)
        per_node: dict[int | None, int] = {}
        for node, _, _ in units:
            per_node[node] = per_node.get(node, 0) + instances_per_gpu
        slot: dict[int | None, int] = {}
        instances = []
        for node, gpus, group in units:
            for _ in range(instances_per_gpu):
                i = slot[node] = slot.get(node, -1) + 1
                cpus = (
                    core_slice(host.core_groups(node), i, per_node[node])
                    if node is not None
                    else ()
                )
                instances.append(PlannedInstance(len(instances), node, cpus, gpus[0], gpus, group))
        kind, cpu_count = "gpu", None
    else:
        if tp_size > 1:
            warnings.append(f"--tp-size {tp_size} applies to GPUs; ignored on this CPU-only host")
        nodes = sorted(host.numa_nodes)
        cpu_count = cpu_instances if cpu_instances is not None else len(nodes)
        base, extra = divmod(cpu_count, len(nodes))
        per_node = {n: base + (1 if k < extra else 0) for k, n in enumerate(nodes)}
        instances = []
        for node in nodes:
            for i in range(per_node[node]):
                cpus = core_slice(host.core_groups(node), i, per_node[node])
                instances.append(PlannedInstance(len(instances), node, cpus, None))
        kind = "cpu"
    _warn_cpus(host, per_node, warnings)
    servers = _servers(host, instances, multi_node)
    return PlacementPlan(
        kind=kind,
        instances_per_gpu=instances_per_gpu if kind == "gpu" else None,
        cpu_instances=cpu_count,
        tp_size=tp_size,
        instances=tuple(instances),
        tp_groups=tuple(groups),
        ungrouped_gpus=tuple(ungrouped),
        servers=servers,
        warnings=tuple(warnings),
    )


def _warn_tp(
    host: HostTopology,
    tp_size: int,
    groups: list[TensorParallelGroup],
    ungrouped: list[UngroupedGpu],
    warnings: list[str],
) -> None:
    if not groups:
        counts = {}
        for g in host.gpus:
            if g.numa_node is not None:
                counts[g.numa_node] = counts.get(g.numa_node, 0) + 1
        largest = max(counts.values(), default=0)
        if largest:
            warnings.append(
                f"tensor-parallel size {tp_size} does not fit within one NUMA node (the most GPUs "
                f"on one node is {largest}); groups may not cross NUMA nodes, so nothing is "
                f"placed: use --tp-size {largest} or less"
            )
        else:
            warnings.append(
                f"tensor-parallel size {tp_size}: no GPU has a known NUMA node, so nothing is "
                "placed"
            )
    elif ungrouped:
        warnings.append(
            f"GPU(s) {', '.join(str(u.gpu) for u in ungrouped)} are in no tensor-parallel group "
            f"of {tp_size} (a group may not cross NUMA nodes) and get no instances"
        )
    for g in groups:
        if g.worst_link in CPU_PATH_LABELS:
            warnings.append(
                f"tensor-parallel group {g.index} (GPUs {', '.join(map(str, g.gpus))}) talks "
                f"through the CPU root complex ({g.worst_link}); expect slower all-reduce than "
                "NVLink or a PCIe switch"
            )
        if host.p2p is not None:
            bad = [
                f"GPU{a}-GPU{b} {host.p2p.pairs.get(f'GPU{a}-GPU{b}')}"
                for a, b in itertools.combinations(g.gpus, 2)
                if host.p2p.pairs.get(f"GPU{a}-GPU{b}", "OK") != "OK"
            ]
            if bad:
                warnings.append(
                    f"tensor-parallel group {g.index}: no peer-to-peer access ({', '.join(bad)})"
                )


def _warn_cpus(host: HostTopology, per_node: dict[int | None, int], warnings: list[str]) -> None:
    smt = host.lscpu.threads_per_core if host.lscpu is not None else None
    for node, count in sorted(per_node.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        if node is None:
            continue
        cpus = host.numa_nodes[node]
        cores = host.core_groups(node)
        if count > len(cpus):
            warnings.append(
                f"NUMA node {node}: {count} instances but {len(cpus)} CPUs; instances share CPUs "
                "(cpu_slice gives instance i the CPU i mod the CPU count)"
            )
        elif count > len(cores):
            warnings.append(
                f"NUMA node {node}: {count} instances but {len(cores)} physical cores "
                f"({len(cpus)} CPUs); CPUs stay disjoint, but some instances get single SMT "
                "threads of a core another instance also runs on"
            )
        elif count > 1 and not host.siblings_known(node):
            why = (
                f"{LSCPU_CMD} says {smt} threads per core, but the CPU numbers do not show "
                "which CPUs share a core"
                if smt is not None
                else f"no sysfs thread_siblings_list and no {LSCPU_CMD} 'Thread(s) per core'"
            )
            warnings.append(
                f"NUMA node {node} ({format_cpu_list(cpus)}): SMT siblings unknown ({why}); "
                "CPU slices follow CPU numbers, so one instance's slice may hold the SMT "
                "siblings of another's cores"
            )


def _servers(
    host: HostTopology, instances: list[PlannedInstance], multi_node: bool
) -> tuple[ServerPlan, ...]:
    def server(node: int | None, members: list[PlannedInstance], cpus: Iterable[int]) -> ServerPlan:
        gpus = sorted({g for i in members for g in i.gpus})
        bind = multi_node and node is not None
        return ServerPlan(
            numa_node=node,
            cpus=tuple(sorted(cpus)),
            gpus=tuple(gpus),
            instances=tuple(i.index for i in members),
            numactl_prefix=("numactl", f"--cpunodebind={node}", f"--membind={node}")
            if bind
            else None,
            cuda_visible_devices=",".join(map(str, gpus)) if gpus else None,
        )

    if not multi_node:
        node = next(iter(host.numa_nodes), None)
        all_cpus = sorted({c for cpus in host.numa_nodes.values() for c in cpus})
        return (server(node, instances, all_cpus),)
    out = []
    nodes = sorted({i.numa_node for i in instances if i.numa_node is not None})
    for node in nodes:
        out.append(
            server(node, [i for i in instances if i.numa_node == node], host.numa_nodes[node])
        )
    unknown = [i for i in instances if i.numa_node is None]
    if unknown:
        out.append(server(None, unknown, ()))
    return tuple(out)


# --- report ------------------------------------------------------------------------------


def _pairs_line(pairs: Sequence[str], labels: dict[str, str]) -> str:
    if not pairs:
        return "none"
    kinds = sorted({labels[p] for p in pairs})
    if len(pairs) == len(labels) > 1:
        return f"all {len(pairs)} pairs ({', '.join(kinds)})"
    return ", ".join(f"{p} ({labels[p]})" for p in pairs)


def render_report(host: HostTopology, plan: PlacementPlan) -> str:
    """A readable report: sources, CPUs per NUMA node, GPUs, links, P2P, the plan, warnings."""
    out: list[str] = ["triton-embed doctor", "", "Sources:"]
    width = max((len(k) for k in host.sources), default=0)
    out += [f"  {k:<{width}}  {v}" for k, v in host.sources.items()]

    out += ["", "CPUs:"]
    cpu = host.lscpu
    if cpu is not None:
        shape = " x ".join(
            f"{v} {what}"
            for v, what in (
                (cpu.sockets, "socket(s)"),
                (cpu.cores_per_socket, "cores"),
                (cpu.threads_per_core, "thread(s) per core"),
            )
            if v is not None
        )
        out.append(
            f"  {cpu.model_name or 'unknown model'} ({cpu.vendor_id or 'unknown vendor'}): "
            f"{cpu.cpus} logical CPUs, online {cpu.online_cpus or '?'}"
            + (f"; {shape}" if shape else "")
        )
    out.append(f"  NUMA nodes (from {host.numa_source}):")
    numa = host.numa
    for node, cpus in host.numa_nodes.items():
        mem = ""
        if numa is not None and node in numa.nodes and numa.nodes[node].size_mb is not None:
            mem = f", {numa.nodes[node].size_mb} MB memory ({numa.nodes[node].free_mb} MB free)"
        out.append(f"    node {node}: CPUs {format_cpu_list(cpus)} ({len(cpus)} CPUs){mem}")
    if numa is not None and len(numa.distance_nodes) > 1:
        out.append(
            "  NUMA distances (10 = local): "
            + "; ".join(
                f"{a}: " + " ".join(str(d) for d in row)
                for a, row in zip(numa.distance_nodes, numa.distance_matrix, strict=True)
            )
        )

    out += ["", "GPUs:"]
    if not host.gpus:
        out.append("  none (CPU-only host)")
    else:
        out.append(f"  {'GPU':<6}{'NUMA':<6}{'CPU affinity':<22}NUMA node from")
        for g in host.gpus:
            node = "?" if g.numa_node is None else str(g.numa_node)
            out.append(
                f"  {g.name:<6}{node:<6}{format_cpu_list(g.cpus) or 'N/A':<22}{g.numa_source}"
            )
    topo = host.topo
    if topo is not None and topo.gpu_count > 1:
        links = topo.links
        out += ["", "GPU pairs by link (nvidia-smi topo -m legend):"]
        for title, labels in (
            ("NVLink (NV#)", ["NV#"]),
            ("PCIe switch, no CPU (PIX/PXB)", ["PIX", "PXB"]),
            ("through the CPU root complex within a node (PHB/NODE)", ["PHB", "NODE"]),
            ("across the SMP interconnect between NUMA nodes (SYS)", sorted(SMP_LABELS)),
        ):
            out.append(f"  {title}: {_pairs_line(topo.pairs_with(labels), links)}")
        out.append(f"  on different NUMA nodes: {_pairs_line(topo.cross_numa_pairs, links)}")
    if host.p2p is not None:
        mode = f" -p2p {host.p2p.mode}" if host.p2p.mode else " -p2p"
        problems = host.p2p.non_ok_pairs
        if not host.p2p.status:
            text = "one GPU, no pairs"
        elif not problems:
            text = "all pairs OK"
        else:
            text = ", ".join(f"{p} {s} ({P2P_LEGEND.get(s, s)})" for p, s in problems.items())
        out += ["", f"Peer-to-peer (nvidia-smi topo{mode}): {text}"]

    out += ["", _plan_title(plan)]
    out += _cores_lines(host, plan)
    for s in plan.servers:
        node = "unknown node" if s.numa_node is None else f"NUMA node {s.numa_node}"
        prefix = shlex.join(s.numactl_prefix) if s.numactl_prefix else "no numactl binding"
        env = " ".join(f"{k}={v}" for k, v in s.env.items())
        out.append(
            f"  server on {node}: {prefix}"
            + (f", {env}" if env else "")
            + f"; CPUs {format_cpu_list(s.cpus) or 'any'}"
        )
        for index in s.instances:
            inst = plan.instances[index]
            where = (
                "CPU only"
                if inst.gpu is None
                else (
                    f"GPU {inst.gpu}"
                    if len(inst.gpus) == 1
                    else f"GPUs {','.join(map(str, inst.gpus))} (tp group {inst.tp_group})"
                )
            )
            out.append(
                f"    instance {inst.index}: {where}, "
                f"CPUs {format_cpu_list(inst.cpus) or 'not pinned'}"
            )
    if not plan.instances:
        out.append("  no instances placed")
    for g in plan.tp_groups:
        out.append(
            f"  tensor-parallel group {g.index}: GPUs {', '.join(map(str, g.gpus))} on NUMA node "
            f"{g.numa_node}, slowest link {g.worst_link or 'unknown'}"
        )
    for u in plan.ungrouped_gpus:
        out.append(f"  GPU {u.gpu} not groupable: {u.reason}")

    warnings = [*host.warnings, *plan.warnings]
    out += ["", "Warnings:" if warnings else "Warnings: none"]
    out += [f"  - {w}" for w in warnings]
    return "\n".join(out) + "\n"


def _cores_lines(host: HostTopology, plan: PlacementPlan) -> list[str]:
    """How the plan's CPU slices relate to physical cores (nothing when nothing is pinned)."""
    nodes = sorted({i.numa_node for i in plan.instances if i.numa_node is not None and i.cpus})
    if not nodes:
        return []
    known = [n for n in nodes if host.siblings_known(n)]
    unknown = [n for n in nodes if not host.siblings_known(n)]
    out = []
    if known:
        smt = any(len(core) > 1 for n in known for core in host.core_groups(n))
        what = "SMT siblings kept together" if smt else "one thread per core"
        where = "" if not unknown else f" on NUMA node(s) {', '.join(map(str, known))}"
        out.append(
            f"  CPU slices are whole physical cores ({what}){where}; cores from {host.smt_source}"
        )
    if unknown:
        out.append(
            f"  CPU slices follow CPU numbers on NUMA node(s) {', '.join(map(str, unknown))}: "
            "SMT siblings unknown"
        )
    return out


def _plan_title(plan: PlacementPlan) -> str:
    if plan.kind == "cpu":
        return f"Placement plan (CPU-only host, {plan.cpu_instances} instance(s)):"
    tp = f", tensor-parallel size {plan.tp_size}" if plan.tp_size > 1 else ""
    per = "group" if plan.tp_size > 1 else "GPU"
    return f"Placement plan ({plan.instances_per_gpu} instance(s) per {per}{tp}):"


# --- command -----------------------------------------------------------------------------


def run_doctor(args: argparse.Namespace) -> dict[str, Any]:
    """``triton-embed doctor``: prints the report (or JSON) and returns the JSON payload.

    The payload is ``{"host": HostTopology.to_dict(), "plan": PlacementPlan.to_dict(),
    "warnings": [...]}`` (host and plan warnings together); ``--plan-out`` gets the plan.

    Raises:
        TopologyParseError: unparseable input (see :func:`gather_host`).
        ValueError: a count below 1.
    """
    host = gather_host(from_dir=args.from_dir)
    plan = plan_placement(
        host,
        instances_per_gpu=args.instances_per_gpu,
        cpu_instances=args.cpu_instances,
        tp_size=args.tp_size,
    )
    payload = {
        "host": host.to_dict(),
        "plan": plan.to_dict(),
        "warnings": [*host.warnings, *plan.warnings],
    }
    if args.plan_out is not None:
        args.plan_out.parent.mkdir(parents=True, exist_ok=True)
        args.plan_out.write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print(render_report(host, plan), end="")
    return payload
