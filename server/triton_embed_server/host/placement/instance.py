"""Where one ``embedder`` instance runs, decided once, before vLLM and torch start.

:func:`decide_placement` turns the embedder's ``numa_placement`` parameter, the instance's
kind, index and device, and this process's CPUs into one frozen :class:`InstancePlacement`:
its NUMA node, CPUs, GPU and the environment its engine needs.
:func:`~triton_embed_server.host.placement.apply.apply_placement` then applies it.

``numa_placement`` modes:

* ``off``: no NUMA awareness. A CPU instance with ``threads_bind=spread`` gets its
  :func:`~triton_embed_server.host.placement.slicing.cpu_slice` of the process's CPUs; otherwise
  the instance keeps every CPU of the process.
* ``auto``: the instance takes its entry of this host's placement plan, the plan
  ``triton-embed doctor`` prints (computed by the ``auto_plan`` callable, normally
  :func:`triton_embed_server.host.doctor.host_plan`).
* a plan file's path (``triton-embed doctor --plan-out``; :func:`read_plan`): the placement
  declared explicitly.

A plan is the JSON form of the doctor's ``PlacementPlan``; this module reads only its
``instances`` list, each entry ``{"numa_node": int | None, "cpus": [int], "gpu": int | None}``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triton_embed_server.host.placement.slicing import cpu_slice
from triton_embed_server.host.topology import SYSFS_NODE_ROOT, format_cpu_list

if TYPE_CHECKING:
    from triton_embed_server.steps.engine_config import EngineConfig

#: Computes this host's plan: ``(kind, instances per device, allowed CPUs) -> plan dict``.
AutoPlan = Callable[[str, int, Sequence[int]], Mapping[str, Any]]


class PlacementError(ValueError):
    """The configured placement cannot be applied (names the plan and what is missing)."""


@dataclass(frozen=True)
class InstancePlacement:
    """One instance's placement.

    Attributes:
        numa_nodes: the node(s) its CPUs belong to (one when placed; several or none when
            ``off`` and the CPUs span nodes or sysfs has no NUMA information).
        cpus: the CPUs it runs on, sorted; empty means not pinned.
        gpu: nvidia-smi GPU number; None for a CPU instance.
        source: ``off``, ``auto`` or the plan file's path.
        env: environment variables its engine needs, set before vLLM is imported:
            ``CUDA_VISIBLE_DEVICES`` (a GPU instance) or ``VLLM_CPU_OMP_THREADS_BIND`` and
            ``OMP_NUM_THREADS`` (a CPU instance with CPUs of its own).
        bound_memory: True once its memory is bound to its node (set by ``apply_placement``).
    """

    numa_nodes: tuple[int, ...]
    cpus: tuple[int, ...]
    gpu: int | None
    source: str
    env: dict[str, str] = field(default_factory=dict)
    bound_memory: bool = False

    @property
    def memory_node(self) -> int | None:
        """The node to bind memory to: the single node of a placed (not ``off``) instance."""
        if self.source != "off" and len(self.numa_nodes) == 1:
            return self.numa_nodes[0]
        return None

    def labels(self) -> dict[str, str]:
        """``numa_node``, ``cpus``, ``gpu`` labels of the placement metric."""
        return {
            "numa_node": ",".join(map(str, self.numa_nodes)) or "unknown",
            "cpus": format_cpu_list(self.cpus),
            "gpu": "none" if self.gpu is None else str(self.gpu),
        }

    def describe(self) -> str:
        """One log line."""
        labels = self.labels()
        mem = f", memory bound to node {self.numa_nodes[0]}" if self.bound_memory else ""
        gpu = "" if self.gpu is None else f", GPU {self.gpu}"
        return (
            f"placement ({self.source}): NUMA node {labels['numa_node']}, "
            f"CPUs {labels['cpus']}{gpu}{mem}"
        )


def instance_index(instance_name: str) -> int:
    """The replica index Triton gives an instance (``embedder_0_1`` -> 1; no suffix -> 0)."""
    match = re.search(r"_(\d+)$", instance_name)
    return int(match.group(1)) if match else 0


def visible_gpu(device_id: int, cuda_visible_devices: str | None) -> int:
    """The nvidia-smi number of Triton's ``device_id``, an index into ``CUDA_VISIBLE_DEVICES``.

    The only reader of ``CUDA_VISIBLE_DEVICES`` (a comma-separated list; CUDA's
    documentation, "CUDA Environment Variables"). Unset or empty, every GPU is visible and
    ``device_id`` is the GPU number.

    Raises:
        PlacementError: the list holds something other than GPU numbers (UUIDs, MIG
            instances), or has no entry ``device_id``.
    """
    visible = [v.strip() for v in (cuda_visible_devices or "").split(",") if v.strip()]
    if not visible:
        return device_id
    if device_id >= len(visible) or not visible[device_id].isdigit():
        raise PlacementError(
            f"device {device_id} is not a GPU number in "
            f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}; set it to GPU numbers "
            "(not UUIDs), one per visible device"
        )
    return int(visible[device_id])


def node_cpus(numa_root: Path = SYSFS_NODE_ROOT) -> dict[int, tuple[int, ...]]:
    """CPUs per NUMA node from sysfs; empty when the kernel exposes no nodes."""
    from triton_embed_server.host.topology import TopologyParseError, read_sysfs_nodes

    try:
        return {n: tuple(node.cpus) for n, node in read_sysfs_nodes(numa_root).nodes.items()}
    except TopologyParseError:
        return {}


def nodes_of(cpus: Iterable[int], nodes: Mapping[int, Sequence[int]]) -> tuple[int, ...]:
    """The nodes that hold any of ``cpus``."""
    mine = set(cpus)
    return tuple(n for n in sorted(nodes) if mine & set(nodes[n]))


def read_plan(path: str | Path) -> Mapping[str, Any]:
    """A plan file: ``triton-embed doctor --plan-out`` output, or ``--json`` output.

    Raises:
        PlacementError: unreadable, not JSON, or not a JSON object.
    """
    try:
        plan = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PlacementError(f"numa_placement plan {path}: {exc}") from None
    if not isinstance(plan, dict):
        raise PlacementError(
            f"numa_placement plan {path}: not a JSON object (write one with "
            "triton-embed doctor --plan-out)"
        )
    return plan.get("plan", plan)


def plan_entry(
    plan: Mapping[str, Any], kind: str, index: int, gpu: int | None
) -> Mapping[str, Any]:
    """The plan's instance for replica ``index`` (of GPU ``gpu``, for the GPU kind).

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


def decide_placement(
    config: EngineConfig,
    kind: str,
    index: int,
    device_id: int = 0,
    *,
    allowed_cpus: Iterable[int] | None = None,
    environ: Mapping[str, str] | None = None,
    auto_plan: AutoPlan | None = None,
    numa_root: Path = SYSFS_NODE_ROOT,
) -> InstancePlacement:
    """Decide one embedder instance's placement; changes nothing in the process.

    Args:
        config: the embedder's configuration (``numa_placement``, ``threads_bind``,
            ``instances_per_device``).
        kind: ``CPU`` or ``GPU`` (``args["model_instance_kind"]``).
        index: the replica's index on its device (:func:`instance_index`).
        device_id: Triton's device id (``args["model_instance_device_id"]``; GPU kind).
        allowed_cpus: the CPUs the process may use; None reads this process's affinity.
        environ: where ``CUDA_VISIBLE_DEVICES`` is read; None reads ``os.environ``.
        auto_plan: computes this host's plan for ``numa_placement=auto``.
        numa_root: the sysfs NUMA folder (the CPUs' nodes).

    Returns:
        The placement, with the environment of its engine.

    Raises:
        PlacementError: see :func:`visible_gpu`, :func:`read_plan` and :func:`plan_entry`;
            the plan's CPUs are outside ``allowed_cpus``; ``auto`` without ``auto_plan``.
    """
    kind = kind.upper()
    mode = config.numa_placement
    allowed = sorted(os.sched_getaffinity(0) if allowed_cpus is None else allowed_cpus)
    environ = os.environ if environ is None else environ
    gpu = visible_gpu(device_id, environ.get("CUDA_VISIBLE_DEVICES")) if kind == "GPU" else None
    nodes = node_cpus(numa_root)
    if mode == "off":
        spread = kind == "CPU" and config.threads_bind == "spread"
        cpus = tuple(cpu_slice(allowed, index, config.instances_per_device) if spread else allowed)
        env = _engine_env(kind, gpu, cpus, bind_cpus=spread)
        return InstancePlacement(nodes_of(cpus, nodes), cpus, gpu, mode, env)
    if mode == "auto":
        if auto_plan is None:
            raise PlacementError("numa_placement=auto needs the host's plan (auto_plan)")
        plan = auto_plan(kind, config.instances_per_device, allowed)
    else:
        plan = read_plan(mode)
    entry = plan_entry(plan, kind, index, gpu)
    cpus = tuple(sorted(entry.get("cpus") or allowed))
    outside = set(cpus) - set(allowed)
    if outside:
        raise PlacementError(
            f"the plan gives instance {index} CPUs {format_cpu_list(outside)} outside "
            f"this process's CPUs {format_cpu_list(allowed)}"
        )
    node = entry.get("numa_node")
    numa_nodes = (node,) if node is not None else nodes_of(cpus, nodes)
    env = _engine_env(kind, gpu, cpus, bind_cpus=True)
    return InstancePlacement(numa_nodes, cpus, gpu, mode, env)


def _engine_env(kind: str, gpu: int | None, cpus: Sequence[int], bind_cpus: bool) -> dict[str, str]:
    """The environment an instance's engine needs.

    A GPU instance sees only its own GPU. A CPU instance with CPUs of its own gets them as
    vLLM's OpenMP thread binding (``VLLM_CPU_OMP_THREADS_BIND``, vLLM's CPU backend) and one
    OpenMP thread per CPU; otherwise vLLM's defaults apply.
    """
    if kind == "GPU":
        return {"CUDA_VISIBLE_DEVICES": str(gpu)}
    if bind_cpus:
        return {
            "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)),
            "OMP_NUM_THREADS": str(len(cpus)),
        }
    return {}
