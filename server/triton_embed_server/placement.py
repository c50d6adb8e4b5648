"""Where an ``embedder`` instance runs: its NUMA node, CPUs and GPU, decided in ``initialize``.

Triton's ``--host-policy`` NUMA settings do not reach Python-backend stub processes, so each
instance places itself, before vLLM and torch start their threads. The embedder parameter
``numa_placement`` chooses how:

* ``off``: no NUMA awareness. CPU instances bind to :func:`~triton_embed_server.engine.cpu_slice`
  slices of the process's CPUs (``threads_bind``), GPU instances are not pinned.
* ``auto``: the instance computes the placement plan of ``triton-embed doctor`` for this host
  (:func:`triton_embed_server.doctor.plan_placement`: instances spread over NUMA nodes, each on a
  disjoint slice of its node's physical cores, SMT siblings from sysfs kept together; a GPU's
  instances on the GPU's node) and takes its entry.
* a path to a plan JSON written by ``triton-embed doctor --plan-out`` (absolute or relative
  to the model repository): the placement declared explicitly, as the second source study
  recommends (shared/seeds/numa-aware-vllm-cluster-case-study.ru.txt).

A placed instance pins itself to its CPUs (``sched_setaffinity``) and binds its memory to its
node (``set_mempolicy(MPOL_BIND)``, what ``numactl --membind`` does), then reports both in the
log and in the ``triton_embed_instance_placement`` metric.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_embed_server.config import EmbedderConfig
from triton_embed_server.topology import SYSFS_NODE_ROOT, format_cpu_list

# set_mempolicy(2) system call numbers (Linux uapi unistd tables) and MPOL_BIND (mempolicy.h).
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
_MPOL_BIND = 2


class PlacementError(ValueError):
    """The configured placement cannot be applied (names the plan and what is missing)."""


@dataclass(frozen=True)
class InstancePlacement:
    """One instance's placement.

    Attributes:
        numa_nodes: the node(s) its CPUs belong to (one when placed; several or none when
            ``off`` and the CPUs span nodes or sysfs has no NUMA information).
        cpus: the CPUs it may run on, sorted.
        gpu: nvidia-smi GPU number; None for a CPU instance.
        source: ``off``, ``auto`` or the plan file's path.
        bound_memory: True when memory is bound to the node.
    """

    numa_nodes: tuple[int, ...]
    cpus: tuple[int, ...]
    gpu: int | None
    source: str
    bound_memory: bool = False

    def labels(self) -> dict[str, str]:
        """``numa_node``, ``cpus``, ``gpu`` labels of the placement metric."""
        return {
            "numa_node": ",".join(map(str, self.numa_nodes)) or "unknown",
            "cpus": format_cpu_list(self.cpus),
            "gpu": "none" if self.gpu is None else str(self.gpu),
        }

    def describe(self) -> str:
        """One log line."""
        mem = f", memory bound to node {self.numa_nodes[0]}" if self.bound_memory else ""
        gpu = "" if self.gpu is None else f", GPU {self.gpu}"
        return (
            f"placement ({self.source}): NUMA node {self.labels()['numa_node']}, "
            f"CPUs {self.labels()['cpus']}{gpu}{mem}"
        )


def node_cpus(numa_root: Path = SYSFS_NODE_ROOT) -> dict[int, tuple[int, ...]]:
    """CPUs per NUMA node from sysfs; empty when the kernel exposes no nodes."""
    from triton_embed_server.topology import TopologyParseError, read_sysfs_nodes

    try:
        return {n: tuple(node.cpus) for n, node in read_sysfs_nodes(numa_root).nodes.items()}
    except TopologyParseError:
        return {}


def nodes_of(cpus: Sequence[int], nodes: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    """The nodes that hold any of ``cpus``."""
    mine = set(cpus)
    return tuple(n for n in sorted(nodes) if mine & set(nodes[n]))


def visible_gpu(device_id: int, cuda_visible_devices: str | None) -> int:
    """nvidia-smi number of Triton's ``device_id`` (an index into ``CUDA_VISIBLE_DEVICES``)."""
    if not cuda_visible_devices:
        return device_id
    visible = [v.strip() for v in cuda_visible_devices.split(",") if v.strip()]
    if device_id >= len(visible) or not visible[device_id].isdigit():
        raise PlacementError(
            f"device {device_id} is not a GPU number in CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}; "
            "use GPU numbers (not UUIDs) with numa_placement"
        )
    return int(visible[device_id])


def host_plan(
    kind: str, count: int, allowed_cpus: Sequence[int], numa_root: Path = SYSFS_NODE_ROOT
) -> dict[str, Any]:
    """``triton-embed doctor``'s plan for this host: ``count`` instances per GPU (GPU kind,
    GPUs from ``nvidia-smi topo -m``) or in all (CPU kind), within ``allowed_cpus``.
    """
    from triton_embed_server import doctor
    from triton_embed_server.topology import (
        TopologyParseError,
        read_sysfs_cpu_siblings,
        read_sysfs_nodes,
    )

    if kind == "GPU":
        host = doctor.gather_host(sysfs_root=numa_root, process_cpus=lambda: allowed_cpus)
    else:
        try:
            numa = read_sysfs_nodes(numa_root)
        except TopologyParseError:
            numa = None
        host = doctor.build_host(
            numa=numa, allowed_cpus=allowed_cpus, siblings=read_sysfs_cpu_siblings()
        )
    return doctor.plan_placement(host, instances_per_gpu=count, cpu_instances=count).to_dict()


def plan_entry(plan: dict[str, Any], kind: str, index: int, gpu: int | None) -> dict[str, Any]:
    """The plan's instance for replica ``index`` (of a GPU, for the GPU kind).

    Raises:
        PlacementError: the plan is for the other kind, or has no such instance.
    """
    instances = plan.get("instances") or []
    if kind == "GPU":
        mine = [i for i in instances if i.get("gpu") == gpu]
        if not mine:
            raise PlacementError(
                f"the plan places no instance on GPU {gpu}; plan GPUs: "
                f"{sorted({i.get('gpu') for i in instances}, key=str)}"
            )
        return mine[index % len(mine)]
    cpu_only = [i for i in instances if i.get("gpu") is None]
    if instances and not cpu_only:
        raise PlacementError(
            "the plan is for a GPU host (its instances have GPUs) but this instance "
            "runs on the CPU; write a plan on this host with triton-embed doctor --plan-out"
        )
    if index >= len(cpu_only):
        raise PlacementError(
            f"the plan has {len(cpu_only)} CPU instance(s); instance {index} has "
            "no entry (re-run triton-embed doctor --cpu-instances <count>)"
        )
    return cpu_only[index]


def resolve(
    mode: str,
    kind: str,
    index: int,
    count: int,
    device_id: int,
    allowed_cpus: Sequence[int],
    spread_cpus: Sequence[int],
    numa_root: Path = SYSFS_NODE_ROOT,
) -> InstancePlacement:
    """Decide one instance's placement.

    Args:
        mode: ``off``, ``auto`` or a plan file path (already resolved).
        kind: ``CPU`` or ``GPU`` (``args["model_instance_kind"]``).
        index: the replica's index on its device.
        count: replicas per device (``instance_group`` count).
        device_id: Triton's device id (GPU kind).
        allowed_cpus: the CPUs the process may use now.
        spread_cpus: the CPUs ``off`` uses (the ``threads_bind`` slice, or all).
        numa_root: sysfs NUMA folder.

    Raises:
        PlacementError: the plan file is unreadable or has no entry for this instance, or
            its CPUs are outside ``allowed_cpus``.
    """
    kind = kind.upper()
    gpu = visible_gpu(device_id, os.environ.get("CUDA_VISIBLE_DEVICES")) if kind == "GPU" else None
    nodes = node_cpus(numa_root)
    if mode == "off":
        cpus = tuple(sorted(spread_cpus))
        return InstancePlacement(nodes_of(cpus, nodes), cpus, gpu, "off")
    if mode == "auto":
        plan = host_plan(kind, count, allowed_cpus, numa_root)
    else:
        try:
            plan = json.loads(Path(mode).read_text())
        except (OSError, ValueError) as exc:
            raise PlacementError(f"numa_placement plan {mode}: {exc}") from None
        if not isinstance(plan, dict):
            raise PlacementError(
                f"numa_placement plan {mode}: not a JSON object (write one with "
                "triton-embed doctor --plan-out)"
            )
        plan = plan.get("plan", plan)  # `doctor --json` output or `--plan-out` file
    entry = plan_entry(plan, kind, index, gpu)
    cpus = tuple(sorted(entry.get("cpus") or allowed_cpus))
    outside = set(cpus) - set(allowed_cpus)
    if outside:
        raise PlacementError(
            f"the plan gives instance {index} CPUs {format_cpu_list(outside)} outside "
            f"this process's CPUs {format_cpu_list(allowed_cpus)}"
        )
    node = entry.get("numa_node")
    return InstancePlacement(
        (node,) if node is not None else nodes_of(cpus, nodes), cpus, gpu, mode
    )


def place_instance(
    config: EmbedderConfig, kind: str, index: int, device_id: int, numa_root: Path = SYSFS_NODE_ROOT
) -> tuple[InstancePlacement, dict[str, str]]:
    """Decide and apply an embedder replica's placement; call first in ``initialize``.

    Returns:
        The applied placement and the engine environment it set
        (:func:`~triton_embed_server.engine.engine_environment`).

    Raises:
        PlacementError: see :func:`resolve`.
    """
    from triton_embed_server import engine

    kind = kind.upper()
    allowed = sorted(os.sched_getaffinity(0))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    env = engine.engine_environment(config, index, kind, device_id, allowed, None, visible)
    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "")
    placement = resolve(
        config.numa_placement,
        kind,
        index,
        config.instances_per_device,
        device_id,
        allowed,
        [int(c) for c in bind.split(",")] if bind else allowed,
        numa_root,
    )
    if config.numa_placement != "off":
        env = engine.engine_environment(
            config, index, kind, device_id, allowed, placement.cpus, visible
        )
    engine.apply_placement(env)
    return apply(placement), env


def bind_memory(node: int) -> bool:
    """Bind this thread's future allocations (and its future threads') to NUMA ``node``,
    like ``numactl --membind``. Returns False where the system call is unavailable or refused
    (no NUMA in the kernel, a seccomp filter): placement then covers CPUs only.
    """
    number = _SET_MEMPOLICY.get(platform.machine())
    if number is None or node < 0:
        return False
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(number, _MPOL_BIND, mask, ctypes.c_ulong(words * 64 + 1)) == 0


def apply(placement: InstancePlacement) -> InstancePlacement:
    """Pin this process to the placement's CPUs and, when placed (not ``off``) on one node,
    bind its memory to that node. Call before vLLM/torch start threads; they inherit both.

    Returns:
        The placement with ``bound_memory`` set.
    """
    if placement.cpus:
        os.sched_setaffinity(0, set(placement.cpus))
    bound = False
    if placement.source != "off" and len(placement.numa_nodes) == 1:
        bound = bind_memory(placement.numa_nodes[0])
    return InstancePlacement(
        placement.numa_nodes, placement.cpus, placement.gpu, placement.source, bound
    )
