"""Helm chart values for one host: pods per host, and the CPUs, memory and GPUs of a pod.

:func:`chart_values` turns a host and its
:class:`~triton_embed_server.host.doctor.placement_plan.PlacementPlan`
into the values of the chart ``deploy/helm/triton-embed`` (``triton.replicas``,
``triton.resources.cpu`` / ``memory``, ``triton.gpusPerPod``, ``triton.instancesPerGpu``,
``triton.hourlyPriceUsd``, ``numa.singleNumaNode``, ``numa.podsPerNode``);
:func:`render_chart_values` prints them as YAML for ``helm install -f``. The rules, also in
``docs/kubernetes.md`` ("Sizing a pod"):

* **Pods**: one per NUMA node that has GPUs in the plan (CPU-only host: one per NUMA node that
  has instances). The pods of a Deployment are equal, so where nodes hold different numbers of
  GPUs a pod holds their greatest common divisor and a node gets several pods (6 + 2 GPUs:
  pods of 2 GPUs, 3 on one node and 1 on the other).
* **Held back** on every NUMA node: ``reserved_cores`` whole physical cores (the node's
  lowest-numbered, as the kubelet picks them) and max(2 GiB, 5% of the node's memory), rounded
  up to a GiB. The first node's share is the kubelet's reservation (``reservedSystemCPUs``,
  ``reservedMemory``); the other nodes' shares stay unrequested, for pods outside the chart
  (DaemonSets, the gateway, sidecars) in the shared CPU pool. A host with one NUMA node holds
  back twice that, so both needs are met there too.
* **CPUs per pod**: the node's remaining whole physical cores divided among its pods, as CPUs
  (both SMT threads of a core); the smallest over the nodes, since pods are equal.
* **Memory per pod**: the node's memory less its held-back share, divided among its pods,
  whole GiB; the smallest over the nodes. Without the nodes' memory sizes (a capture with no
  ``numactl --hardware``) it is :data:`ASSUMED_GIB_PER_CPU` per CPU, with a warning.
* **GPUs per pod**: as above; each GPU runs ``instancesPerGpu`` separate replicas, no tensor
  parallelism across a pod's GPUs (the product has none).
* **instancesPerGpu**: the plan's instances per GPU; for CPU pods, the plan's instances per
  NUMA node (the pod's ``instance_group`` count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from triton_embed_server.host.doctor.host import HostTopology
from triton_embed_server.host.doctor.placement_plan import PlacementPlan
from triton_embed_server.host.topology import format_cpu_list

#: Physical cores held back on every NUMA node (``--reserved-cores``).
DEFAULT_RESERVED_CORES = 1
#: Memory held back on every NUMA node: at least this many GiB ...
MIN_RESERVED_GIB = 2
#: ... or this share of the node's memory, whichever is larger.
RESERVED_MEMORY_SHARE = 0.05
#: Memory per CPU when the nodes' memory is unknown: the ratio of general-purpose cloud
#: machines (AWS m7i, Google Cloud n2-standard: 4 GiB per vCPU).
ASSUMED_GIB_PER_CPU = 4
#: A pod smaller than this gets a warning: the CPU server's RSS (tritonserver and 2 embedder
#: replicas) reached 5.3-5.5 GB in the 30-minute soak (perf/README.md, "Soak").
MIN_POD_MEMORY_GIB = 6
#: The kubelet's share of the memory reservation outside ``systemReserved`` (suggested values
#: that sum to ``reservedMemory``, as the static memory manager requires).
KUBE_RESERVED_MIB = 1024
EVICTION_HARD_MIB = 100


@dataclass(frozen=True)
class NodeShare:
    """What the pods on one NUMA node get.

    Attributes:
        numa_node: the node.
        pods: pods on it.
        cpus: the node's CPUs (as the doctor sees them).
        held_back_cpus: CPUs of its held-back cores, sorted.
        cpus_per_pod: whole CPUs each of its pods could get.
        memory_mib: the node's memory; None when unknown.
        held_back_gib: memory held back; None when the node's memory is unknown.
        memory_gib_per_pod: whole GiB each of its pods could get; None when unknown.
        gpus: nvidia-smi numbers of its GPUs (empty on a CPU-only host).
    """

    numa_node: int
    pods: int
    cpus: tuple[int, ...]
    held_back_cpus: tuple[int, ...]
    cpus_per_pod: int
    memory_mib: int | None
    held_back_gib: int | None
    memory_gib_per_pod: int | None
    gpus: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (CPU lists in the kernel's format)."""
        return {
            "numa_node": self.numa_node,
            "pods": self.pods,
            "cpus": format_cpu_list(self.cpus),
            "held_back_cpus": format_cpu_list(self.held_back_cpus),
            "cpus_per_pod": self.cpus_per_pod,
            "memory_mib": self.memory_mib,
            "held_back_gib": self.held_back_gib,
            "memory_gib_per_pod": self.memory_gib_per_pod,
            "gpus": list(self.gpus),
        }


@dataclass(frozen=True)
class ChartValues:
    """The chart values of one host, how they were reached, and the kubelet settings they need.

    Attributes:
        kind: ``"gpu"`` or ``"cpu"`` (the plan's).
        pods_per_host: pods on one such host (``numa.podsPerNode``, and ``triton.replicas``
            for one host).
        cpus_per_pod: whole CPUs per pod.
        memory_gib_per_pod: whole GiB per pod.
        gpus_per_pod: GPUs per pod (0 for CPU pods).
        instances_per_gpu: embedder instances per GPU (CPU pods: per pod).
        memory_source: where node memory came from, or the assumption used.
        nodes: per NUMA node with pods, its share.
        reserved_system_cpus: the CPUs for the kubelet's ``reservedSystemCPUs``.
        reserved_memory_gib: the kubelet's ``reservedMemory`` on the first node; None when
            the node's memory is unknown.
        first_node: the NUMA node whose held-back share the kubelet takes.
        warnings: what a person should look at.
    """

    kind: str
    pods_per_host: int
    cpus_per_pod: int
    memory_gib_per_pod: int
    gpus_per_pod: int
    instances_per_gpu: int
    memory_source: str
    nodes: tuple[NodeShare, ...]
    reserved_system_cpus: tuple[int, ...]
    reserved_memory_gib: int | None
    first_node: int
    warnings: tuple[str, ...]

    def values(self) -> dict[str, Any]:
        """The chart values, exactly the chart's keys (``triton``, ``numa``)."""
        return {
            "triton": {
                "replicas": self.pods_per_host,
                "resources": {"cpu": self.cpus_per_pod, "memory": f"{self.memory_gib_per_pod}Gi"},
                "gpusPerPod": self.gpus_per_pod,
                "instancesPerGpu": self.instances_per_gpu,
                "hourlyPriceUsd": 0,
            },
            "numa": {"singleNumaNode": True, "podsPerNode": self.pods_per_host},
        }

    def kubelet(self) -> dict[str, Any]:
        """The kubelet configuration (``KubeletConfiguration`` fields) these pods need."""
        out: dict[str, Any] = {
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": format_cpu_list(self.reserved_system_cpus),
            "topologyManagerPolicy": "single-numa-node",
            "topologyManagerScope": "pod",
        }
        if self.reserved_memory_gib is not None:
            system_mib = self.reserved_memory_gib * 1024 - KUBE_RESERVED_MIB - EVICTION_HARD_MIB
            out |= {
                "memoryManagerPolicy": "Static",
                "reservedMemory": [
                    {
                        "numaNode": self.first_node,
                        "limits": {"memory": f"{self.reserved_memory_gib}Gi"},
                    }
                ],
                "kubeReserved": {"memory": f"{KUBE_RESERVED_MIB}Mi"},
                "systemReserved": {"memory": f"{system_mib}Mi"},
                "evictionHard": {"memory.available": f"{EVICTION_HARD_MIB}Mi"},
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        """``{"values", "kubelet", "memory_source", "nodes", "warnings"}``."""
        return {
            "values": self.values(),
            "kubelet": self.kubelet(),
            "memory_source": self.memory_source,
            "nodes": [n.to_dict() for n in self.nodes],
            "warnings": list(self.warnings),
        }


def chart_values(
    host: HostTopology, plan: PlacementPlan, reserved_cores: int = DEFAULT_RESERVED_CORES
) -> ChartValues:
    """Chart values for this host from its plan (rules: the module's docstring).

    Args:
        host: from :func:`~triton_embed_server.host.doctor.gather.gather_host`.
        plan: :func:`~triton_embed_server.host.doctor.placement_plan.plan_placement` of ``host``.
        reserved_cores: physical cores held back on every NUMA node (twice that on a host
            with one node).

    Raises:
        ValueError: ``reserved_cores`` < 1; no NUMA node can hold a pod (every GPU's node is
            unknown); or a node has no core or no memory left for a pod.
    """
    if reserved_cores < 1:
        raise ValueError(f"reserved_cores must be >= 1, got {reserved_cores}")
    warnings: list[str] = []
    per_node, instances = _pods_per_node(plan, warnings)
    first = min(host.numa_nodes)
    factor = 2 if len(host.numa_nodes) == 1 else 1
    memory = _node_memory(host)
    shares = []
    for node, (pods, gpus) in per_node.items():
        cores = host.core_groups(node)
        held = cores[: reserved_cores * factor]
        usable = cores[len(held) :]
        if len(usable) < pods:
            raise ValueError(
                f"NUMA node {node} has {len(cores)} physical cores; after the {len(held)} held "
                f"back for the system there are {len(usable)} for {pods} pod(s). Use a smaller "
                "--reserved-cores or fewer pods"
            )
        threads = min(len(core) for core in usable)
        mib = memory.get(node)
        held_gib = _held_back_gib(mib, factor) if mib is not None else None
        per_pod_gib = None
        if mib is not None and held_gib is not None:
            per_pod_gib = (mib - held_gib * 1024) // pods // 1024
            if per_pod_gib < 1:
                raise ValueError(
                    f"NUMA node {node} has {mib} MiB of memory; after the {held_gib} GiB held "
                    f"back there is less than 1 GiB for each of its {pods} pod(s)"
                )
        shares.append(
            NodeShare(
                numa_node=node,
                pods=pods,
                cpus=host.numa_nodes[node],
                held_back_cpus=tuple(sorted(c for core in held for c in core)),
                cpus_per_pod=len(usable) // pods * threads,
                memory_mib=mib,
                held_back_gib=held_gib,
                memory_gib_per_pod=per_pod_gib,
                gpus=gpus,
            )
        )
    cpus_per_pod = min(s.cpus_per_pod for s in shares)
    known = [s.memory_gib_per_pod for s in shares if s.memory_gib_per_pod is not None]
    if len(known) == len(shares):
        memory_gib = min(known)
        memory_source = host.numa.source if host.numa is not None else "unknown"
    else:
        memory_gib = cpus_per_pod * ASSUMED_GIB_PER_CPU
        memory_source = f"assumed: {ASSUMED_GIB_PER_CPU} GiB per CPU"
        warnings.append(
            "the NUMA nodes' memory is unknown (no numactl --hardware output or sysfs): memory "
            f"per pod is {ASSUMED_GIB_PER_CPU} GiB per CPU ({memory_gib}Gi); check that it "
            "fits one node with `numactl --hardware` on the host, or run the doctor there"
        )
    if memory_gib < MIN_POD_MEMORY_GIB:
        warnings.append(
            f"{memory_gib}Gi per pod is below {MIN_POD_MEMORY_GIB} GiB: the server with 2 CPU "
            "replicas reached 5.3-5.5 GB RSS in the soak (perf/README.md); expect OOM kills"
        )
    gpus_per_pod = len(shares[0].gpus) // shares[0].pods if plan.kind == "gpu" else 0
    per_pod_instances = instances * max(gpus_per_pod, 1)
    threads = max(len(core) for core in host.core_groups(shares[0].numa_node))
    if per_pod_instances > cpus_per_pod // threads:
        warnings.append(
            f"{per_pod_instances} embedder instances per pod on {cpus_per_pod} CPUs: instances "
            "share physical cores; use fewer instances per GPU (--instances-per-gpu)"
        )
    first_cores = host.core_groups(first)[:reserved_cores]
    first_mib = memory.get(first)
    return ChartValues(
        kind=plan.kind,
        pods_per_host=sum(s.pods for s in shares),
        cpus_per_pod=cpus_per_pod,
        memory_gib_per_pod=memory_gib,
        gpus_per_pod=gpus_per_pod,
        instances_per_gpu=instances,
        memory_source=memory_source,
        nodes=tuple(shares),
        reserved_system_cpus=tuple(sorted(c for core in first_cores for c in core)),
        reserved_memory_gib=_held_back_gib(first_mib, 1) if first_mib is not None else None,
        first_node=first,
        warnings=tuple(warnings),
    )


def _held_back_gib(node_mib: int, factor: int) -> int:
    """max(2 GiB, 5% of the node's memory), rounded up to a GiB, ``factor`` times."""
    share = max(MIN_RESERVED_GIB * 1024, RESERVED_MEMORY_SHARE * node_mib)
    return math.ceil(share / 1024) * factor


def _node_memory(host: HostTopology) -> dict[int, int]:
    """MiB of memory per NUMA node, where numactl or sysfs gave it."""
    if host.numa is None:
        return {}
    return {n: v.size_mb for n, v in host.numa.nodes.items() if v.size_mb is not None}


def _pods_per_node(
    plan: PlacementPlan, warnings: list[str]
) -> tuple[dict[int, tuple[int, tuple[int, ...]]], int]:
    """``({node: (pods, its GPUs)}, instances per GPU or per CPU pod)`` from the plan."""
    servers = [s for s in plan.servers if s.numa_node is not None]
    if plan.kind == "gpu":
        unknown = [s for s in plan.servers if s.numa_node is None]
        for s in unknown:
            warnings.append(
                f"GPU(s) {', '.join(map(str, s.gpus))}: NUMA node unknown, so no pod holds "
                "them; capture nvidia-smi topo -m with its NUMA Affinity column"
            )
        servers = [s for s in servers if s.gpus]
        if not servers:
            raise ValueError(
                "no GPU has a known NUMA node, so no pod can be placed on one; run the doctor "
                "on the host (nvidia-smi topo -m with NUMA Affinity, numactl --hardware)"
            )
        size = math.gcd(*(len(s.gpus) for s in servers))
        if any(len(s.gpus) != size for s in servers):
            counts = ", ".join(f"node {s.numa_node}: {len(s.gpus)}" for s in servers)
            warnings.append(
                f"NUMA nodes hold different numbers of GPUs ({counts}); pods are equal, so "
                f"each holds {size} GPU(s) and a node holds several pods"
            )
        per_node = {s.numa_node: (len(s.gpus) // size, s.gpus) for s in servers}
        return per_node, plan.instances_per_gpu or 1
    counts = {s.numa_node: len(s.instances) for s in servers if s.instances}
    most = max(counts.values())
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"node {n}: {c}" for n, c in counts.items())
        warnings.append(
            f"the plan spreads its instances unevenly ({listed}); every pod runs {most}. "
            "Give --cpu-instances a multiple of the NUMA node count"
        )
    return {n: (1, ()) for n in counts}, most


def render_chart_values(values: ChartValues) -> str:
    """The values as YAML for ``helm install -f``, with comments saying how they were reached.

    ``yaml.safe_load`` of the text gives exactly :meth:`ChartValues.values`.
    """
    v = values
    nodes = "; ".join(
        f"node {s.numa_node}: {s.pods} pod(s)"
        + (f", GPU {','.join(map(str, s.gpus))}" if s.gpus else "")
        for s in v.nodes
    )
    held = "; ".join(
        f"node {s.numa_node}: CPUs {format_cpu_list(s.held_back_cpus)}"
        + (f", {s.held_back_gib} GiB" if s.held_back_gib is not None else "")
        for s in v.nodes
    )
    what = "one per NUMA node with GPUs" if v.kind == "gpu" else "one per NUMA node"
    out = [
        "# Helm values for this host (chart deploy/helm/triton-embed), from triton-embed doctor "
        "--chart-values",
        f"# {v.pods_per_host} pod(s) per host, {what} ({nodes}).",
        f"# Held back for the kubelet, the system and other pods: {held}.",
        f"# Memory per node from {v.memory_source}.",
    ]
    if v.kind == "gpu":
        out.append(
            f"# The {v.gpus_per_pod} GPU(s) of a pod are separate replicas, "
            f"{v.instances_per_gpu} instance(s) each, not one tensor-parallel model."
        )
    out += ["# Kubelet configuration for single-NUMA pods (docs/kubernetes.md):"]
    for key, value in v.kubelet().items():
        out.append(f"#   {key}: {_flow(value)}")
    if v.warnings:
        out.append("# Warnings:")
        out += [f"#   - {w}" for w in v.warnings]
    values_ = v.values()
    t, r = values_["triton"], values_["triton"]["resources"]
    body = [
        ("triton:", None),
        (f"  replicas: {t['replicas']}", "pods on one such host; times the number of hosts"),
        ("  resources:", None),
        (f"    cpu: {r['cpu']}", "whole CPUs per pod (requests == limits)"),
        (f"    memory: {r['memory']}", "per pod"),
        (f"  gpusPerPod: {t['gpusPerPod']}", "nvidia.com/gpu per pod (0 = CPU pods)"),
        (
            f"  instancesPerGpu: {t['instancesPerGpu']}",
            "embedder instances per GPU (CPU pods: per pod)",
        ),
        (
            f"  hourlyPriceUsd: {t['hourlyPriceUsd']}",
            "USD/h of one GPU (GPU pods) or of the pod (CPU pods); 0 = no cost gauges",
        ),
        ("numa:", None),
        ("  singleNumaNode: true", "each pod's CPUs, memory and GPUs fit one NUMA node"),
        (f"  podsPerNode: {values_['numa']['podsPerNode']}", "pods per Kubernetes node"),
    ]
    width = max(len(line) for line, _ in body) + 2
    out += [line if note is None else f"{line:<{width}}# {note}" for line, note in body]
    return "\n".join(out) + "\n"


def _flow(value: Any) -> str:
    """A value in YAML flow style, for the comment lines."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, str) and (value[:1].isdigit() or "," in value):
        return f'"{value}"'
    return str(value)
