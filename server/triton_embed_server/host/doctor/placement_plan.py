"""The doctor's placement plan: which instances, CPUs and GPUs go on which NUMA node.

:func:`plan_placement` turns a :class:`~triton_embed_server.host.doctor.host.HostTopology` into a
:class:`PlacementPlan`: each GPU's instances on that GPU's NUMA node (on a CPU-only host, the
instances spread over the nodes), each instance on whole physical cores of its node
(:func:`~triton_embed_server.host.placement.slicing.core_slice`, SMT siblings kept together),
disjoint from the other instances' cores, and one server per NUMA node
(``numactl --cpunodebind=N --membind=N``, ``CUDA_VISIBLE_DEVICES``). :func:`host_plan` is
the plan an ``embedder`` instance takes with ``numa_placement=auto``.

GPU numbers are nvidia-smi's (PCI bus order); a server's environment therefore sets
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA numbers the GPUs the same way (CUDA's
documentation, "CUDA Environment Variables").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_embed_server.host.doctor.gather import gather_host
from triton_embed_server.host.doctor.host import HostTopology, build_host
from triton_embed_server.host.placement.slicing import core_slice
from triton_embed_server.host.topology import (
    LSCPU_CMD,
    SYSFS_CPU_ROOT,
    SYSFS_NODE_ROOT,
    TopologyParseError,
    format_cpu_list,
    read_sysfs_cpu_siblings,
    read_sysfs_nodes,
)


@dataclass(frozen=True)
class PlannedInstance:
    """One embedder instance: where it runs.

    Attributes:
        index: instance number, 0-based, in GPU order (``instances_per_gpu`` per GPU) or
            NUMA-node order on a CPU-only host.
        numa_node: the node it is bound to; None when its GPU's node is unknown.
        cpus: its CPUs, sorted: a ``core_slice`` of the node's physical cores (whole cores,
            disjoint from the other instances on the node unless there are more instances
            than cores); empty when not pinned.
        gpu: nvidia-smi GPU number; None on a CPU-only host.
    """

    index: int
    numa_node: int | None
    cpus: tuple[int, ...]
    gpu: int | None

    def to_dict(self) -> dict[str, Any]:
        """``{"index", "numa_node", "cpus", "gpu"}``."""
        return {
            "index": self.index,
            "numa_node": self.numa_node,
            "cpus": list(self.cpus),
            "gpu": self.gpu,
        }


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
        instances_per_gpu: instances per GPU; None on a CPU-only host.
        cpu_instances: instances on a CPU-only host; None on a GPU host.
        instances: the instances.
        servers: the tritonserver processes.
        warnings: what a person should look at.
    """

    kind: str
    instances_per_gpu: int | None
    cpu_instances: int | None
    instances: tuple[PlannedInstance, ...]
    servers: tuple[ServerPlan, ...]
    warnings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "kind": self.kind,
            "instances_per_gpu": self.instances_per_gpu,
            "cpu_instances": self.cpu_instances,
            "instances": [i.to_dict() for i in self.instances],
            "servers": [s.to_dict() for s in self.servers],
            "warnings": list(self.warnings),
        }


def plan_placement(
    host: HostTopology, instances_per_gpu: int = 4, cpu_instances: int | None = None
) -> PlacementPlan:
    """Plan instances, cores, GPUs and servers for a host.

    GPU host: each GPU's instances go on that GPU's NUMA node; the node's physical cores are
    split among all instances on the node with ``core_slice``, so slices are whole cores
    (SMT siblings kept together) and disjoint. A node whose SMT siblings are unknown counts
    each CPU as a core (a warning says so). CPU-only host: ``cpu_instances`` spread evenly
    over the nodes (the first nodes take the remainder), each with a disjoint slice of its
    node. One server per NUMA node on a multi-node host, else one.

    Args:
        host: from :func:`~triton_embed_server.host.doctor.gather.gather_host` or
            :func:`~triton_embed_server.host.doctor.host.build_host`.
        instances_per_gpu: instances per GPU.
        cpu_instances: instances on a CPU-only host; None = one per NUMA node. Ignored on a
            GPU host.

    Raises:
        ValueError: a count below 1.
    """
    for name, value in (("instances_per_gpu", instances_per_gpu), ("cpu_instances", cpu_instances)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    warnings: list[str] = []
    instances: list[PlannedInstance] = []
    per_node: dict[int | None, int] = {}
    if host.gpus:
        for g in host.gpus:
            per_node[g.numa_node] = per_node.get(g.numa_node, 0) + instances_per_gpu
        slot: dict[int | None, int] = {}
        for g in host.gpus:
            node = g.numa_node
            for _ in range(instances_per_gpu):
                i = slot[node] = slot.get(node, -1) + 1
                cpus = (
                    core_slice(host.core_groups(node), i, per_node[node])
                    if node is not None
                    else ()
                )
                instances.append(PlannedInstance(len(instances), node, cpus, g.index))
        kind, cpu_count = "gpu", None
    else:
        nodes = sorted(host.numa_nodes)
        cpu_count = cpu_instances if cpu_instances is not None else len(nodes)
        base, extra = divmod(cpu_count, len(nodes))
        per_node = {n: base + (1 if k < extra else 0) for k, n in enumerate(nodes)}
        for node in nodes:
            for i in range(per_node[node]):
                cpus = core_slice(host.core_groups(node), i, per_node[node])
                instances.append(PlannedInstance(len(instances), node, cpus, None))
        kind = "cpu"
    _warn_cpus(host, per_node, warnings)
    return PlacementPlan(
        kind=kind,
        instances_per_gpu=instances_per_gpu if kind == "gpu" else None,
        cpu_instances=cpu_count,
        instances=tuple(instances),
        servers=_servers(host, instances),
        warnings=tuple(warnings),
    )


def host_plan(
    kind: str,
    count: int,
    allowed_cpus: Sequence[int],
    numa_root: Path = SYSFS_NODE_ROOT,
    cpu_sysfs_root: Path = SYSFS_CPU_ROOT,
) -> dict[str, Any]:
    """This host's plan for an ``embedder`` instance with ``numa_placement=auto``.

    ``count`` instances per GPU (GPU kind: the GPUs from ``nvidia-smi topo -m``), or in all
    (CPU kind: NUMA nodes and SMT siblings from sysfs, no command run), within
    ``allowed_cpus``.

    Args:
        kind: ``CPU`` or ``GPU``.
        count: instances per device (the ``instance_group`` count).
        allowed_cpus: the CPUs the instance's process may use.
        numa_root: the sysfs NUMA folder.
        cpu_sysfs_root: the sysfs ``cpu`` folder (SMT siblings).

    Returns:
        ``PlacementPlan.to_dict()``.
    """
    if kind.upper() == "GPU":
        host = gather_host(
            sysfs_root=numa_root,
            process_cpus=lambda: allowed_cpus,
            cpu_sysfs_root=cpu_sysfs_root,
        )
    else:
        try:
            numa = read_sysfs_nodes(numa_root)
        except TopologyParseError:
            numa = None
        host = build_host(
            numa=numa, allowed_cpus=allowed_cpus, siblings=read_sysfs_cpu_siblings(cpu_sysfs_root)
        )
    return plan_placement(host, instances_per_gpu=count, cpu_instances=count).to_dict()


def _warn_cpus(host: HostTopology, per_node: dict[int | None, int], warnings: list[str]) -> None:
    """Warn where a node's instances must share CPUs, cores, or cannot tell SMT siblings."""
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


def _servers(host: HostTopology, instances: list[PlannedInstance]) -> tuple[ServerPlan, ...]:
    """One server per NUMA node that has instances (plus one for unknown nodes), else one."""
    multi_node = len(host.numa_nodes) > 1

    def server(node: int | None, members: list[PlannedInstance], cpus: Iterable[int]) -> ServerPlan:
        gpus = sorted({i.gpu for i in members if i.gpu is not None})
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
