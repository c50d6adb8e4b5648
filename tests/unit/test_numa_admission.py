"""NUMA admission simulation: the doctor's chart values on the 18 real host captures.

For each capture of ``tests/data/topology`` (read with the captures of the same machine, as
its README pairs them) and the H200 capture, ``triton-embed doctor --chart-values`` gives the
pods of that host; a model of the kubelet then admits ``numa.podsPerNode`` such pods. The
model follows the kubelet with ``cpuManagerPolicy: static`` (``reservedSystemCPUs``),
``memoryManagerPolicy: Static`` (``reservedMemory``), the NVIDIA device plugin (each GPU on its
NUMA node), ``topologyManagerPolicy: single-numa-node`` and ``topologyManagerScope: pod``
(Kubernetes documentation, "Control Topology Management Policies on a node"): a Guaranteed pod
is admitted only when its CPUs, memory and GPUs can all come from one NUMA node; the narrowest
hint wins and, among single nodes, the lowest-numbered, so pods go greedily node by node.
Otherwise the pod fails with reason ``TopologyAffinityError``. The scheduler's check of the
whole node's allocatable resources comes first and is modelled too.

Every pod of the doctor's size must be admitted, aligned (the in-pod check's verdict on the
CPUs, memory node and GPUs it got), disjoint from the other pods and from the kubelet's
reserved CPUs, with CPUs left over for pods outside the chart. A deliberately oversized pod
(one CPU more than a node has, the GPUs of two nodes, more memory than a node has) is refused
with ``TopologyAffinityError``. Captures without node memory sizes (no ``numactl --hardware``)
are checked for CPUs and GPUs only; the two ``nvidia-smi topo -p2p`` captures name no CPU, and
the doctor refuses to size pods from them.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from triton_embed_server.host.doctor import (
    CAPTURE_FILES,
    ChartValues,
    HostTopology,
    chart_values,
    gather_host,
    judge_alignment,
    plan_placement,
    render_chart_values,
)
from triton_embed_server.host.topology import TopologyParseError, parse_cpu_list

DATA = Path(__file__).resolve().parents[1] / "data"
CHART = DATA.parents[1] / "deploy" / "helm" / "triton-embed"
HELM = Path(sys.prefix) / "bin" / "helm"  # scripts/setup.sh installs it
CAPTURES = DATA / "topology"
KINDS = {"topo": "topo_m", "p2p": "p2p", "lscpu": "lscpu", "numactl": "numactl"}
# tests/data/topology/README.md, "Host pairs across command types"
SAME_MACHINE = [
    {"topo_m": "topo_m_06.txt", "numactl": "numactl_01.txt", "lscpu": "lscpu_01.txt"},
    {"topo_m": "topo_m_05.txt", "lscpu": "lscpu_04.txt"},
]
CASES = sorted(p.stem for p in CAPTURES.glob("*.txt")) + ["topology_h200"]

# capture -> (podsPerNode, cpu, memory, gpusPerPod, instancesPerGpu); None: the doctor refuses
EXPECTED: dict[str, tuple[int, int, str, int, int] | None] = {
    "lscpu_01": (2, 31, "178Gi", 2, 4),  # ASUS: 2 x 32 cores, 2 x 2 GPUs, numactl memory
    "lscpu_02": (8, 10, "40Gi", 0, 2),  # 8 nodes x 6 cores x 2 threads, CPU only
    "lscpu_03": (2, 46, "184Gi", 0, 2),  # 2 x 24 cores x 2 threads, CPU only
    "lscpu_04": (2, 46, "184Gi", 2, 4),  # RunPod: 2 x 24 cores x 2 threads, 2 x 2 A40
    "lscpu_05": (2, 17, "68Gi", 0, 2),  # 2 x 18 cores, CPU only
    "numactl_01": (2, 31, "178Gi", 2, 4),  # ASUS
    "numactl_02": (2, 62, "477Gi", 0, 2),  # 2 x 32 cores x 2 threads, ~503 GiB per node
    "numactl_03": (8, 30, "58Gi", 0, 2),  # NPS4: 8 nodes x 16 cores x 2 threads, ~62 GiB each
    "numactl_04": (2, 17, "120Gi", 0, 2),  # 2 x 18 cores, 128 GiB per node
    "p2p_r_01": None,  # GPU pairs only: no CPU, no NUMA node
    "p2p_r_02": None,
    "topo_m_01": (4, 10, "40Gi", 2, 4),  # 6 + 2 GPUs: pods of 2, 3 on node 0 and 1 on node 1
    "topo_m_02": (2, 15, "60Gi", 4, 4),  # 2 x 16 CPUs, 2 x 4 GPUs
    "topo_m_03": (2, 126, "504Gi", 4, 4),  # 8 x H200: 2 x 64 cores x 2 threads, 2 x 4 GPUs
    "topo_m_04": (2, 23, "92Gi", 4, 4),  # 8 x A100: 2 x 24 CPUs, 2 x 4 GPUs
    "topo_m_05": (2, 46, "184Gi", 2, 4),  # RunPod
    "topo_m_06": (2, 31, "178Gi", 2, 4),  # ASUS
    "topo_m_07": (1, 30, "120Gi", 4, 4),  # 4 x L40S on one node of 32 CPUs
    "topology_h200": (1, 14, "1Gi", 1, 4),  # 1 x H200, one node of 16 CPUs and 5.7 GiB
}


class TopologyAffinityError(Exception):
    """The kubelet's refusal: no single NUMA node holds the pod (pod Failed, this reason)."""


class Unschedulable(Exception):
    """The scheduler's refusal: the node's allocatable resources are short (pod Pending)."""


@dataclass(frozen=True)
class Pod:
    """A Guaranteed pod's requests (== limits)."""

    cpus: int
    memory_mib: int
    gpus: int


@dataclass
class NumaNodeState:
    """What the kubelet can still give out on one NUMA node."""

    cores: list[tuple[int, ...]]
    free_cpus: set[int]
    free_memory_mib: int | None
    free_gpus: list[int]


@dataclass
class Admitted:
    """A pod the kubelet admitted, and what it got."""

    numa_node: int
    cpus: tuple[int, ...]
    gpus: tuple[int, ...]
    memory_mib: int


@dataclass
class Kubelet:
    """The kubelet's admission with the doctor's ``kubelet`` settings (see the module doc)."""

    host: HostTopology
    reserved_cpus: set[int]
    reserved_memory_mib: dict[int, int]
    nodes: dict[int, NumaNodeState] = field(default_factory=dict)
    allocatable_cpus: int = 0
    allocatable_memory_mib: int | None = None

    @classmethod
    def configured(cls, host: HostTopology, values: ChartValues) -> Kubelet:
        config = values.kubelet()
        assert config["cpuManagerPolicy"] == "static"
        assert config["topologyManagerPolicy"] == "single-numa-node"
        assert config["topologyManagerScope"] == "pod"
        reserved = set(parse_cpu_list(config["reservedSystemCPUs"]))
        memory = {
            r["numaNode"]: int(r["limits"]["memory"].removesuffix("Gi")) * 1024
            for r in config.get("reservedMemory", [])
        }
        sizes = {n: v.size_mb for n, v in host.numa.nodes.items()} if host.numa else {}
        kubelet = cls(host, reserved, memory)
        for node, cpus in host.numa_nodes.items():
            size = sizes.get(node)
            kubelet.nodes[node] = NumaNodeState(
                cores=host.core_groups(node),
                free_cpus=set(cpus) - reserved,
                free_memory_mib=None if size is None else size - memory.get(node, 0),
                free_gpus=[g.index for g in host.gpus if g.numa_node == node],
            )
        kubelet.allocatable_cpus = sum(len(n.free_cpus) for n in kubelet.nodes.values())
        if all(n.free_memory_mib is not None for n in kubelet.nodes.values()):
            kubelet.allocatable_memory_mib = sum(n.free_memory_mib for n in kubelet.nodes.values())
            # the static memory manager's rule: reservedMemory sums to kube + system + eviction
            total = sum(
                int(config[key][name].removesuffix("Mi"))
                for key, name in (
                    ("kubeReserved", "memory"),
                    ("systemReserved", "memory"),
                    ("evictionHard", "memory.available"),
                )
            )
            assert total == sum(memory.values())
        return kubelet

    def schedule(self, pod: Pod) -> None:
        """The scheduler's filter: requests within what the whole node has left."""
        free_cpus = sum(len(n.free_cpus) for n in self.nodes.values())
        free_gpus = sum(len(n.free_gpus) for n in self.nodes.values())
        short = []
        if pod.cpus > free_cpus:
            short.append("cpu")
        if pod.gpus > free_gpus:
            short.append("nvidia.com/gpu")
        if self.allocatable_memory_mib is not None:
            if pod.memory_mib > sum(n.free_memory_mib for n in self.nodes.values()):
                short.append("memory")
        if short:
            raise Unschedulable(", ".join(f"Insufficient {s}" for s in short))

    def admit(self, pod: Pod) -> Admitted:
        """The topology manager: the lowest NUMA node that holds all of the pod, or refuse."""
        for number, node in sorted(self.nodes.items()):
            if len(node.free_cpus) < pod.cpus or len(node.free_gpus) < pod.gpus:
                continue
            if node.free_memory_mib is not None and node.free_memory_mib < pod.memory_mib:
                continue
            cpus = self._take_cpus(node, pod.cpus)
            gpus = tuple(node.free_gpus[: pod.gpus])
            node.free_gpus = node.free_gpus[pod.gpus :]
            if node.free_memory_mib is not None:
                node.free_memory_mib -= pod.memory_mib
            return Admitted(number, cpus, gpus, pod.memory_mib)
        raise TopologyAffinityError(
            "Resources cannot be allocated with Topology locality "
            f"({pod.cpus} CPUs, {pod.memory_mib} MiB, {pod.gpus} GPUs on one NUMA node)"
        )

    @staticmethod
    def _take_cpus(node: NumaNodeState, count: int) -> tuple[int, ...]:
        """Whole free physical cores first (the static policy's preference), then threads."""
        taken: list[int] = []
        for core in node.cores:
            if len(taken) + len(core) <= count and all(c in node.free_cpus for c in core):
                taken += core
        for cpu in sorted(node.free_cpus - set(taken)):
            if len(taken) == count:
                break
            taken.append(cpu)
        node.free_cpus -= set(taken)
        return tuple(sorted(taken))


def capture_folder(case: str, root: Path) -> Path:
    """A ``--from-dir`` folder for a capture, with the captures of the same machine."""
    if case == "topology_h200":
        return DATA / "topology_h200"
    name = f"{case}.txt"
    files = next(
        (group for group in SAME_MACHINE if name in group.values()),
        {KINDS[case.split("_")[0]]: name},
    )
    folder = root / case
    folder.mkdir()
    for kind, fname in files.items():
        (folder / CAPTURE_FILES[kind]).write_text((CAPTURES / fname).read_text())
    return folder


def doctor_values(case: str, root: Path) -> tuple[HostTopology, ChartValues]:
    """What ``triton-embed doctor --from-dir <capture> --chart-values`` computes."""
    host = gather_host(capture_folder(case, root))
    per_node = None if host.gpus else 2 * len(host.numa_nodes)
    return host, chart_values(host, plan_placement(host, cpu_instances=per_node))


def chart_pod(values: ChartValues) -> Pod:
    triton = values.values()["triton"]
    memory = triton["resources"]["memory"]
    assert memory.endswith("Gi")
    return Pod(triton["resources"]["cpu"], int(memory[:-2]) * 1024, triton["gpusPerPod"])


def test_every_capture_has_an_expected_outcome():
    # A capture added to tests/data/topology without an entry in EXPECTED fails here.
    assert set(CASES) == set(EXPECTED)


@pytest.mark.parametrize("case", CASES)
def test_doctor_values_admitted_on_one_numa_node_each(case, tmp_path):
    expected = EXPECTED[case]
    if expected is None:
        with pytest.raises(TopologyParseError, match="no CPU information"):
            doctor_values(case, tmp_path)
        return
    host, values = doctor_values(case, tmp_path)
    v = values.values()
    got = (
        v["numa"]["podsPerNode"],
        v["triton"]["resources"]["cpu"],
        v["triton"]["resources"]["memory"],
        v["triton"]["gpusPerPod"],
        v["triton"]["instancesPerGpu"],
    )
    assert got == expected
    assert v["triton"]["replicas"] == v["numa"]["podsPerNode"]
    assert v["numa"]["singleNumaNode"] is True

    kubelet = Kubelet.configured(host, values)
    pod = chart_pod(values)
    admitted = []
    for _ in range(v["numa"]["podsPerNode"]):
        kubelet.schedule(pod)
        admitted.append(kubelet.admit(pod))
    memory_known = kubelet.allocatable_memory_mib is not None
    used: set[int] = set()
    for a in admitted:
        assert set(a.cpus) <= set(host.numa_nodes[a.numa_node])
        assert not set(a.cpus) & kubelet.reserved_cpus
        assert not set(a.cpus) & used
        used |= set(a.cpus)
        gpus = [g for g in host.gpus if g.index in a.gpus]
        assert len(gpus) == pod.gpus and {g.numa_node for g in gpus} <= {a.numa_node}
        # what `triton-embed doctor --in-pod` would say inside that pod
        mems = [a.numa_node] if memory_known else list(host.numa_nodes)
        verdict = judge_alignment(host.numa_nodes, a.cpus, mems, gpus)
        assert verdict.aligned and verdict.numa_node == a.numa_node, verdict.problems
    # the pods of a node with GPUs hold all of them; the pods leave CPUs to other pods
    assert sum(len(a.gpus) for a in admitted) == sum(
        1 for g in host.gpus if g.numa_node is not None
    )
    shared = sum(len(n.free_cpus) for n in kubelet.nodes.values())
    assert shared >= 1
    if memory_known:
        assert all(n.free_memory_mib >= 0 for n in kubelet.nodes.values())
    # one pod more than the doctor's count does not fit this host
    with pytest.raises((Unschedulable, TopologyAffinityError)):
        kubelet.schedule(pod)
        kubelet.admit(pod)


@pytest.mark.parametrize("case", [c for c in CASES if EXPECTED[c] is not None])
def test_an_oversized_pod_is_refused_with_topology_affinity_error(case, tmp_path):
    host, values = doctor_values(case, tmp_path)
    pod = chart_pod(values)
    biggest = max(len(cpus) for cpus in host.numa_nodes.values())
    too_many_cpus = Pod(biggest + 1, pod.memory_mib, 0)
    fresh = Kubelet.configured(host, values)
    if len(host.numa_nodes) > 1:
        fresh.schedule(too_many_cpus)  # the node has the CPUs in all: scheduled, then refused
    else:
        with pytest.raises(Unschedulable, match="Insufficient cpu"):
            fresh.schedule(too_many_cpus)  # one node: the scheduler already says no
    with pytest.raises(TopologyAffinityError, match="cannot be allocated with Topology locality"):
        fresh.admit(too_many_cpus)
    gpu_nodes = {g.numa_node for g in host.gpus if g.numa_node is not None}
    if len(gpu_nodes) > 1:
        most = max(sum(1 for g in host.gpus if g.numa_node == n) for n in gpu_nodes)
        two_nodes = Pod(pod.cpus, pod.memory_mib, most + 1)
        fresh.schedule(two_nodes)
        with pytest.raises(TopologyAffinityError):
            fresh.admit(two_nodes)
    if fresh.allocatable_memory_mib is not None:
        largest = max(n.free_memory_mib for n in fresh.nodes.values())
        big_memory = Pod(pod.cpus, largest + 1024, pod.gpus)
        if len(host.numa_nodes) > 1:
            fresh.schedule(big_memory)
        with pytest.raises(TopologyAffinityError):
            fresh.admit(big_memory)
    # nothing was taken by the refused pods: the doctor's pods still all fit
    for _ in range(values.pods_per_host):
        fresh.admit(pod)


@pytest.mark.skipif(
    not (HELM.exists() and (CHART / "Chart.yaml").exists()), reason="needs helm and the chart"
)
@pytest.mark.parametrize("case", [c for c in CASES if EXPECTED[c] is not None])
def test_doctor_values_render_as_the_simulated_pod(case, tmp_path):
    """The chart takes the doctor's YAML as it is, and renders the pod the simulation admits."""
    _, values = doctor_values(case, tmp_path)
    values_file = tmp_path / "values.yaml"
    values_file.write_text(render_chart_values(values))
    done = subprocess.run(
        [str(HELM), "template", "emb", str(CHART), "-f", str(values_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    deployment = next(
        d
        for d in yaml.safe_load_all(done.stdout)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-triton")
    )
    pod = chart_pod(values)
    assert deployment["spec"]["replicas"] == values.pods_per_host
    (triton,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]]
    resources = triton["resources"]
    assert resources["requests"] == resources["limits"]  # Guaranteed
    assert resources["limits"]["cpu"] == str(pod.cpus)
    assert resources["limits"]["memory"] == values.values()["triton"]["resources"]["memory"]
    assert resources["limits"].get("nvidia.com/gpu", "0") == str(pod.gpus)
    init = deployment["spec"]["template"]["spec"].get("initContainers", [])
    # the pod's NUMA request is max(app containers' sum, each init container): the app's
    assert all(int(c["resources"]["limits"]["cpu"]) <= pod.cpus for c in init)
