"""Inside a pod: are the container's CPUs, memory and GPUs on one NUMA node?

:func:`check_pod` reads what the kubelet gave this container and :func:`judge_alignment`
gives the verdict, ALIGNED or NOT ALIGNED, with what straddles which node and what to fix:

* CPUs: the cgroup's cpuset (v2 ``cpuset.cpus.effective``; v1 ``cpuset.effective_cpus`` or
  ``cpuset.cpus``), else this process's affinity (``os.sched_getaffinity``);
* memory nodes: ``Mems_allowed_list`` of ``/proc/self/status`` (the cpuset's ``mems``, which
  the kubelet's static memory manager sets);
* GPUs: ``nvidia-smi topo -m`` (the GPUs the container runtime exposes, each with its NUMA
  node; parsed by :mod:`triton_embed_server.host.topology`), cut to ``CUDA_VISIBLE_DEVICES`` when
  it lists indices; without nvidia-smi, the driver's ``/proc/driver/nvidia/gpus/<PCI address>``
  and ``/sys/bus/pci/devices/<PCI address>/numa_node``;
* the host's NUMA nodes: ``/sys/devices/system/node`` (sysfs is the host's, also in a pod).

Memory allowed on several nodes is not a failure when it includes the CPUs' node: each
embedder instance binds its own memory to its node (``numa_placement: auto``); the verdict
notes that the kubelet does not enforce it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_embed_server.host.doctor.gather import (
    COMMAND_TIMEOUT_S,
    COMMANDS,
    CommandOutput,
    run_command,
)
from triton_embed_server.host.doctor.host import HostGpu, build_host
from triton_embed_server.host.topology import (
    SYSFS_NODE_ROOT,
    TOPO_CMD,
    NumaTopology,
    TopologyParseError,
    format_cpu_list,
    parse_cpu_list,
    parse_topo_matrix,
    read_sysfs_nodes,
)

PROC_ROOT = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PCI_ROOT = Path("/sys/bus/pci/devices")
#: Relative to :data:`PROC_ROOT`: one folder per GPU the container may use, named by PCI address.
NVIDIA_GPUS = Path("driver/nvidia/gpus")
ALIGNED = "ALIGNED"
NOT_ALIGNED = "NOT ALIGNED"
KUBELET_FIX = (
    "kubelet: cpuManagerPolicy: static with reservedSystemCPUs, topologyManagerPolicy: "
    "single-numa-node, topologyManagerScope: pod (docs/kubernetes.md)"
)
GUARANTEED_FIX = (
    "pod: Guaranteed QoS (requests equal limits in every container) with a whole number of "
    "CPUs; only such containers get exclusive CPUs from the static CPU manager"
)
SIZE_FIX = (
    "size: a pod's CPUs, memory and GPUs must fit one NUMA node; take the values of "
    "`triton-embed doctor --chart-values` run on the host"
)
MEMORY_FIX = (
    "kubelet: memoryManagerPolicy: Static with reservedMemory per NUMA node "
    "(docs/kubernetes.md), so the pod's memory is on its CPUs' node"
)
DEVICE_FIX = (
    "GPUs: the NVIDIA device plugin reports each GPU's NUMA node; with topologyManagerPolicy "
    "single-numa-node the kubelet admits the pod only with GPUs on its CPUs' node"
)


@dataclass(frozen=True)
class PodCheck:
    """The container's CPUs, memory nodes and GPUs against the host's NUMA nodes.

    Attributes:
        aligned: CPUs, memory and GPUs on one NUMA node (or a host with one node).
        numa_node: the node they are on; when not aligned, the node holding most CPUs.
        cpus: the container's CPUs, sorted.
        cpus_source: where they came from (a cpuset file, or the process affinity).
        cpus_by_node: per NUMA node, the container's CPUs on it.
        memory_nodes: the nodes memory may come from; None when unknown.
        memory_source: where they came from.
        gpus: the GPUs the container sees, with their NUMA nodes.
        gpus_source: where they came from.
        host_nodes: the host's NUMA nodes and their CPUs.
        problems: what straddles which node (empty when aligned).
        fixes: what to change (empty when aligned).
        notes: facts worth knowing that do not fail the check.
    """

    aligned: bool
    numa_node: int | None
    cpus: tuple[int, ...]
    cpus_source: str
    cpus_by_node: dict[int, tuple[int, ...]]
    memory_nodes: tuple[int, ...] | None
    memory_source: str
    gpus: tuple[HostGpu, ...]
    gpus_source: str
    host_nodes: dict[int, tuple[int, ...]]
    problems: tuple[str, ...]
    fixes: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def verdict(self) -> str:
        """``"ALIGNED"`` or ``"NOT ALIGNED"``."""
        return ALIGNED if self.aligned else NOT_ALIGNED

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; ``verdict`` and ``aligned`` first."""
        return {
            "verdict": self.verdict,
            "aligned": self.aligned,
            "numa_node": self.numa_node,
            "cpus": {
                "cpu_list": format_cpu_list(self.cpus),
                "count": len(self.cpus),
                "source": self.cpus_source,
                "by_numa_node": {str(n): format_cpu_list(c) for n, c in self.cpus_by_node.items()},
            },
            "memory": {
                "numa_nodes": None if self.memory_nodes is None else list(self.memory_nodes),
                "source": self.memory_source,
            },
            "gpus": [g.to_dict() for g in self.gpus],
            "gpus_source": self.gpus_source,
            "host_numa_nodes": {str(n): format_cpu_list(c) for n, c in self.host_nodes.items()},
            "problems": list(self.problems),
            "fixes": list(self.fixes),
            "notes": list(self.notes),
        }


def read_container_cpus(
    proc_root: Path = PROC_ROOT,
    cgroup_root: Path = CGROUP_ROOT,
    affinity: Callable[[], Iterable[int]] = lambda: os.sched_getaffinity(0),
) -> tuple[tuple[int, ...], str]:
    """The container's CPUs and the file (or call) they came from.

    The cgroup of this process (``/proc/self/cgroup``) is looked up under ``cgroup_root``:
    v2 ``cpuset.cpus.effective``, v1 ``cpuset/<path>/cpuset.effective_cpus`` then
    ``cpuset.cpus``, each also at the root (a container with its own cgroup namespace sees
    its cgroup there). None readable: ``affinity()``.

    Raises:
        TopologyParseError: a cpuset file holds something that is not a CPU list.
    """
    v2_path, v1_path = _cgroup_paths(proc_root / "self" / "cgroup")
    candidates: list[Path] = []
    if v2_path is not None:
        candidates.append(cgroup_root / v2_path.lstrip("/") / "cpuset.cpus.effective")
    candidates.append(cgroup_root / "cpuset.cpus.effective")
    v1_root = cgroup_root / "cpuset"
    for folder in ([v1_root / v1_path.lstrip("/")] if v1_path is not None else []) + [v1_root]:
        candidates += [folder / "cpuset.effective_cpus", folder / "cpuset.cpus"]
    for path in candidates:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text:
            return tuple(sorted(parse_cpu_list(text, f"cgroup: {path}"))), str(path)
    return tuple(sorted(affinity())), "sched_getaffinity (no cgroup cpuset file)"


def _cgroup_paths(cgroup_file: Path) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and cgroup v1 cpuset path (``/proc/self/cgroup``)."""
    try:
        lines = cgroup_file.read_text().splitlines()
    except OSError:
        return None, None
    v2 = v1 = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            v2 = path
        elif "cpuset" in controllers.split(","):
            v1 = path
    return v2, v1


def read_memory_nodes(proc_root: Path = PROC_ROOT) -> tuple[tuple[int, ...] | None, str]:
    """The NUMA nodes this process may take memory from (``Mems_allowed_list``).

    Returns:
        ``(nodes, source)``; nodes None when ``/proc/self/status`` has no such line.
    """
    status = proc_root / "self" / "status"
    try:
        text = status.read_text()
    except OSError as exc:
        return None, f"not available: {exc}"
    match = re.search(r"^Mems_allowed_list:\s*(\S+)", text, re.M)
    if not match:
        return None, f"not available: no Mems_allowed_list in {status}"
    nodes = parse_cpu_list(match.group(1), f"{status} Mems_allowed_list")
    return tuple(sorted(nodes)), f"Mems_allowed_list of {status}"


def read_visible_gpus(
    numa: NumaTopology,
    env: Mapping[str, str],
    run: Callable[[Sequence[str], float], CommandOutput] = run_command,
    proc_root: Path = PROC_ROOT,
    pci_root: Path = PCI_ROOT,
) -> tuple[tuple[HostGpu, ...], str, list[str]]:
    """The GPUs this container may use, with their NUMA nodes.

    From ``nvidia-smi topo -m`` (a GPU's ``NUMA Affinity``, else the one node its CPU affinity
    lies in), else from the driver's per-GPU folders and sysfs. ``CUDA_VISIBLE_DEVICES`` of
    indices keeps those GPUs (nvidia-smi's numbers, PCI bus order); empty or ``-1``: none.

    Args:
        numa: the host's NUMA nodes (:func:`~triton_embed_server.host.topology.read_sysfs_nodes`).
        env: the environment (``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``).
        run: runs ``nvidia-smi topo -m`` (tests pass a fake).
        proc_root: the ``/proc`` folder.
        pci_root: the sysfs PCI devices folder.

    Returns:
        ``(gpus, source, notes)``.

    Raises:
        TopologyParseError: nvidia-smi answered with a matrix that cannot be parsed.
    """
    notes: list[str] = []
    out = run(COMMANDS["topo_m"], COMMAND_TIMEOUT_S)
    if out.text is not None:
        gpus = build_host(topo=parse_topo_matrix(out.text), numa=numa).gpus
        source = TOPO_CMD
    else:
        gpus, source = _sysfs_gpus(proc_root / NVIDIA_GPUS, pci_root)
        if not gpus:
            notes.append(
                f"no GPUs visible ({TOPO_CMD}: {out.status}; no {proc_root / NVIDIA_GPUS})"
            )
            return (), source, notes
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus, source, notes
    items = [v.strip() for v in visible.split(",") if v.strip()]
    if not items or items[0] == "-1":
        notes.append(f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from CUDA")
        return (), source, notes
    if not all(i.isdigit() for i in items):
        notes.append(
            f"CUDA_VISIBLE_DEVICES={visible} names GPUs by UUID or MIG: every GPU "
            f"{source} shows is checked"
        )
        return gpus, source, notes
    by_index = {g.index: g for g in gpus}
    missing = [i for i in items if int(i) not in by_index]
    if missing:
        notes.append(f"CUDA_VISIBLE_DEVICES={visible}: no GPU {', '.join(missing)} here")
    if len(items) > 1 and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        notes.append(
            "CUDA_VISIBLE_DEVICES indices are taken as nvidia-smi's (PCI bus order); set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA numbers them the same way"
        )
    return tuple(by_index[int(i)] for i in items if int(i) in by_index), source, notes


def _sysfs_gpus(driver_root: Path, pci_root: Path) -> tuple[tuple[HostGpu, ...], str]:
    """GPUs from ``/proc/driver/nvidia/gpus/<address>`` and their sysfs ``numa_node``."""
    try:
        addresses = sorted(p.name.lower() for p in driver_root.iterdir())
    except OSError:
        return (), "none"
    gpus = []
    for index, address in enumerate(addresses):
        path = pci_root / address / "numa_node"
        try:
            node = int(path.read_text().strip())
        except (OSError, ValueError):
            node = -1
        source = f"sysfs ({path})"
        gpus.append(
            HostGpu(
                index,
                f"GPU{index}",
                node if node >= 0 else None,
                source if node >= 0 else "unknown",
                (),
            )
        )
    return tuple(gpus), f"{driver_root} and {pci_root}/<address>/numa_node"


def judge_alignment(
    host_nodes: Mapping[int, Sequence[int]],
    cpus: Iterable[int],
    memory_nodes: Iterable[int] | None,
    gpus: Sequence[HostGpu],
    *,
    cpus_source: str = "",
    memory_source: str = "",
    gpus_source: str = "",
    notes: Sequence[str] = (),
) -> PodCheck:
    """The verdict for a container's CPUs, memory nodes and GPUs on a host's NUMA nodes.

    ALIGNED when the CPUs lie on one node, every GPU is on that node, and memory may come from
    that node (several allowed nodes only give a note), or when the host has one node.

    Args:
        host_nodes: per NUMA node, its CPUs.
        cpus: the container's CPUs.
        memory_nodes: the nodes its memory may come from; None when unknown.
        gpus: the GPUs it sees, each with its node (None = unknown).
        cpus_source: where the CPUs came from, for the report.
        memory_source: where the memory nodes came from.
        gpus_source: where the GPUs came from.
        notes: notes gathered while reading.
    """
    cpus = tuple(sorted(set(cpus)))
    node_of = {c: n for n, node_cpus in host_nodes.items() for c in node_cpus}
    by_node: dict[int, tuple[int, ...]] = {}
    for c in cpus:
        if c in node_of:
            by_node[node_of[c]] = (*by_node.get(node_of[c], ()), c)
    by_node = dict(sorted(by_node.items()))
    mems = None if memory_nodes is None else tuple(sorted(set(memory_nodes)))
    problems: list[str] = []
    fixes: list[str] = []
    out_notes = list(notes)
    gpu_nodes = sorted({g.numa_node for g in gpus if g.numa_node is not None})
    if by_node:
        target = max(by_node, key=lambda n: (len(by_node[n]), -n))
    else:
        target = gpu_nodes[0] if gpu_nodes else None
    if len(host_nodes) <= 1:
        out_notes.append("the host has one NUMA node: nothing can straddle nodes")
        target = next(iter(host_nodes), None)
    else:
        all_host = {c for node_cpus in host_nodes.values() for c in node_cpus}
        if len(by_node) > 1:
            where = ", ".join(f"node {n} (CPUs {format_cpu_list(c)})" for n, c in by_node.items())
            problems.append(f"CPUs straddle NUMA nodes: {where}")
            if set(cpus) >= all_host:
                problems.append(
                    "the container may run on every CPU of the host: it has no exclusive CPUs "
                    "(the kubelet's cpuManagerPolicy is none, or the pod is not Guaranteed with "
                    "whole CPUs)"
                )
                fixes += [KUBELET_FIX, GUARANTEED_FIX]
            else:
                fixes += [KUBELET_FIX, SIZE_FIX]
        for g in gpus:
            if g.numa_node is None:
                problems.append(f"{g.name}: NUMA node unknown ({g.numa_source}), cannot be checked")
            elif target is not None and g.numa_node != target:
                cpus_on = "the CPUs" if len(by_node) == 1 else "most CPUs"
                problems.append(
                    f"{g.name} is on NUMA node {g.numa_node}, {cpus_on} on node {target}"
                )
                fixes += [DEVICE_FIX, KUBELET_FIX]
        if len(gpu_nodes) > 1:
            where = ", ".join(
                f"node {n} ({', '.join(g.name for g in gpus if g.numa_node == n)})"
                for n in gpu_nodes
            )
            problems.append(f"GPUs straddle NUMA nodes: {where}")
            fixes.append(SIZE_FIX)
        if mems is None:
            out_notes.append(f"memory nodes unknown ({memory_source}); not checked")
        elif target is not None and target not in mems:
            problems.append(
                f"memory may come only from node(s) {format_cpu_list(mems)}, the CPUs are on "
                f"node {target}"
            )
            fixes.append(MEMORY_FIX)
        elif target is not None and len(mems) > 1:
            out_notes.append(
                f"memory may come from nodes {format_cpu_list(mems)}: the kubelet does not bind "
                f"it to node {target} (memoryManagerPolicy: Static would); each embedder instance "
                "binds its own memory to its node (numa_placement: auto)"
            )
    return PodCheck(
        aligned=not problems,
        numa_node=target,
        cpus=cpus,
        cpus_source=cpus_source,
        cpus_by_node=by_node,
        memory_nodes=mems,
        memory_source=memory_source,
        gpus=tuple(gpus),
        gpus_source=gpus_source,
        host_nodes=dict(host_nodes),
        problems=tuple(problems),
        fixes=tuple(dict.fromkeys(fixes)),
        notes=tuple(out_notes),
    )


def check_pod(
    *,
    proc_root: Path = PROC_ROOT,
    cgroup_root: Path = CGROUP_ROOT,
    node_root: Path = SYSFS_NODE_ROOT,
    pci_root: Path = PCI_ROOT,
    env: Mapping[str, str] | None = None,
    run: Callable[[Sequence[str], float], CommandOutput] = run_command,
    affinity: Callable[[], Iterable[int]] = lambda: os.sched_getaffinity(0),
) -> PodCheck:
    """Read this container's CPUs, memory nodes and GPUs and judge their alignment.

    Every root and reader can be replaced (tests pass fake ``/proc`` and ``/sys`` folders).

    Raises:
        TopologyParseError: the host's NUMA nodes cannot be read from ``node_root``, or a
            cpuset, ``Mems_allowed_list`` or nvidia-smi output cannot be parsed.
    """
    env = os.environ if env is None else env
    try:
        numa = read_sysfs_nodes(node_root)
    except TopologyParseError as exc:
        raise TopologyParseError(
            f"{exc}; the in-pod check needs the host's NUMA nodes (sysfs mounted in the pod)"
        ) from exc
    host_nodes = {n: tuple(sorted(v.cpus)) for n, v in numa.nodes.items() if v.cpus}
    cpus, cpus_source = read_container_cpus(proc_root, cgroup_root, affinity)
    mems, mems_source = read_memory_nodes(proc_root)
    gpus, gpus_source, notes = read_visible_gpus(numa, env, run, proc_root, pci_root)
    return judge_alignment(
        host_nodes,
        cpus,
        mems,
        gpus,
        cpus_source=cpus_source,
        memory_source=mems_source,
        gpus_source=gpus_source,
        notes=notes,
    )


def render_pod_check(check: PodCheck) -> str:
    """The verdict first, then what was read, what straddles, what to fix, and notes."""
    head = f"triton-embed doctor --in-pod: {check.verdict}"
    if check.aligned and check.numa_node is not None:
        head += f" on NUMA node {check.numa_node}"
    by_node = ", ".join(f"node {n}: {format_cpu_list(c)}" for n, c in check.cpus_by_node.items())
    mems = "unknown" if check.memory_nodes is None else format_cpu_list(check.memory_nodes)
    gpus = (
        ", ".join(
            f"{g.name} on node {'?' if g.numa_node is None else g.numa_node}" for g in check.gpus
        )
        or "none"
    )
    hosts = "; ".join(f"{n}: {format_cpu_list(c)}" for n, c in check.host_nodes.items())
    out = [
        head,
        "",
        f"  host NUMA nodes  {hosts}",
        f"  CPUs             {format_cpu_list(check.cpus)} ({len(check.cpus)}; {by_node}) "
        f"from {check.cpus_source}",
        f"  memory nodes     {mems} from {check.memory_source}",
        f"  GPUs             {gpus}" + (f" from {check.gpus_source}" if check.gpus else ""),
    ]
    if check.problems:
        out += ["", "Straddles:"] + [f"  - {p}" for p in check.problems]
        out += ["", "Fix:"] + [f"  - {f}" for f in check.fixes]
    if check.notes:
        out += ["", "Notes:"] + [f"  - {n}" for n in check.notes]
    return "\n".join(out) + "\n"
