"""doctor.host: combining parsed sources into one host (NUMA nodes, GPUs, physical cores)."""

from __future__ import annotations

import json
import re

import pytest
from doctor_hosts import asus_host, capture, h200_host, instances, numactl_text, runpod_host, span
from triton_embed_server.host.doctor import SYSFS_SIBLINGS, build_host, plan_placement
from triton_embed_server.host.topology import (
    TopologyParseError,
    parse_lscpu,
    parse_numactl,
    parse_p2p,
    parse_topo_matrix,
)


def test_asus_host():
    host = asus_host()
    assert host.numa_source == "numactl --hardware"
    assert host.numa_nodes == {0: tuple(span(0, 31)), 1: tuple(span(32, 63))}
    assert [(g.index, g.numa_node, g.numa_source) for g in host.gpus] == [
        (0, 0, "NUMA Affinity"),
        (1, 0, "NUMA Affinity"),
        (2, 1, "NUMA Affinity"),
        (3, 1, "NUMA Affinity"),
    ]
    assert host.warnings == ()
    assert host.topo.link("GPU0", "GPU2") == "SYS" and host.topo.link("GPU3", "GPU2") == "NODE"
    d = host.to_dict()
    assert d["cross_numa_pairs"] == ["GPU0-GPU2", "GPU0-GPU3", "GPU1-GPU2", "GPU1-GPU3"]
    assert d["sys_pairs"] == d["cross_numa_pairs"]
    assert d["cpu_path_pairs"] == [
        "GPU0-GPU1",
        "GPU0-GPU2",
        "GPU0-GPU3",
        "GPU1-GPU2",
        "GPU1-GPU3",
        "GPU2-GPU3",
    ]
    assert d["numa_nodes"]["1"]["cpu_list"] == "32-63"
    assert d["gpus"][2] == {
        "index": 2,
        "name": "GPU2",
        "numa_node": 1,
        "numa_source": "NUMA Affinity",
        "cpu_affinity": "32-63",
    }
    json.dumps(d)


def test_runpod_host_numa_from_lscpu():
    host = runpod_host()
    assert host.numa_source == "lscpu"
    assert host.numa_nodes[0] == tuple(span(0, 23) + span(48, 71))
    assert host.numa_nodes[1] == tuple(span(24, 47) + span(72, 95))
    assert [g.numa_node for g in host.gpus] == [0, 0, 1, 1]


def test_h200_host_numa_from_gpu_affinity_with_warning():
    host = h200_host()
    assert host.numa_source == "nvidia-smi topo -m (GPU CPU affinity)"
    assert host.numa_nodes == {
        0: tuple(span(0, 63) + span(128, 191)),
        1: tuple(span(64, 127) + span(192, 255)),
    }
    assert host.warnings == (
        "no lscpu or numactl output: each NUMA node's CPUs are taken from the "
        "CPU affinity of its GPUs, which may leave out CPUs",
    )


def topo_04_without_numa_column() -> str:
    text = capture("topo_m_04.txt").replace("  NUMA Affinity", "")
    return re.sub(r"(\d+-\d+)\s+\d+$", r"\1", text, flags=re.M)


def test_gpu_numa_node_from_cpu_affinity_overlap():
    topo = parse_topo_matrix(topo_04_without_numa_column())
    assert topo.has_numa_affinity is False
    assert topo.gpu_affinity["GPU5"].numa_node is None
    host = build_host(
        topo=topo, numa=parse_numactl(numactl_text({0: range(0, 24), 1: range(24, 48)}))
    )
    assert [(g.numa_node, g.numa_source) for g in host.gpus] == (
        [(0, "CPU affinity overlap")] * 4 + [(1, "CPU affinity overlap")] * 4
    )
    assert host.warnings == ()


SPANNING = (
    "        GPU0    GPU1    CPU Affinity\n"
    "GPU0     X      SYS     0-23\n"
    "GPU1    SYS      X      0-47\n"
)


def test_gpu_with_affinity_spanning_nodes_is_not_pinned():
    host = build_host(
        topo=parse_topo_matrix(SPANNING),
        numa=parse_numactl(numactl_text({0: range(0, 24), 1: range(24, 48)})),
    )
    assert [(g.numa_node, g.numa_source) for g in host.gpus] == [
        (0, "CPU affinity overlap"),
        (None, "unknown"),
    ]
    assert host.warnings == (
        "GPU1: NUMA node unknown (its CPU affinity 0-47 spans NUMA nodes 0, 1); "
        "its instances are not pinned",
    )
    plan = plan_placement(host, instances_per_gpu=2)
    assert instances(plan) == [
        {"index": 0, "numa_node": 0, "cpus": span(0, 11), "gpu": 0},
        {"index": 1, "numa_node": 0, "cpus": span(12, 23), "gpu": 0},
        {"index": 2, "numa_node": None, "cpus": [], "gpu": 1},
        {"index": 3, "numa_node": None, "cpus": [], "gpu": 1},
    ]
    servers = plan.to_dict()["servers"]
    assert [(s["numa_node"], s["gpus"], s["instances"], s["numactl_prefix"]) for s in servers] == [
        (0, [0], [0, 1], ["numactl", "--cpunodebind=0", "--membind=0"]),
        (None, [1], [2, 3], None),
    ]


def test_gpu_numa_node_missing_from_host_list():
    host = build_host(
        topo=parse_topo_matrix(capture("topo_m_06.txt")),
        numa=parse_numactl(numactl_text({0: range(0, 64)})),
    )
    assert [g.numa_node for g in host.gpus] == [0, 0, None, None]
    # The fake numactl describes another host than the capture: GPU0/1's affinity (0-31)
    # is not node 0's CPU list (0-63) there, and node 1 does not exist.
    assert host.warnings == tuple(
        [
            f"GPU{i}: nvidia-smi's CPU affinity 0-31 is not the CPU list of NUMA node 0 (0-63): "
            "were the outputs captured on different hosts? Capture them all on the serving host"
            for i in (0, 1)
        ]
        + [
            f"GPU{i}: nvidia-smi says NUMA node 1, which has no CPUs in the host's NUMA "
            "list; its instances are not pinned"
            for i in (2, 3)
        ]
    )


def test_disagreeing_sources_and_cpuset_are_reported():
    host = build_host(
        lscpu=parse_lscpu(capture("lscpu_04.txt")),
        numa=parse_numactl(capture("numactl_01.txt")),
        allowed_cpus=range(0, 8),
    )
    assert host.numa_nodes == {0: tuple(range(8))}
    assert host.warnings == (
        "lscpu and numactl --hardware disagree on the NUMA nodes' CPUs; using numactl --hardware",
        "this process may run on CPUs 0-7 only (cpuset or affinity mask); the plan uses those",
    )


def test_p2p_from_another_host_is_reported():
    host = build_host(
        topo=parse_topo_matrix(capture("topo_m_06.txt")),
        p2p=parse_p2p(capture("p2p_r_01.txt")),
        numa=parse_numactl(capture("numactl_01.txt")),
    )
    assert host.warnings == (
        "nvidia-smi topo -p2p lists GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7 but "
        "topo -m lists GPU0 GPU1 GPU2 GPU3: captured on different hosts?",
    )


def test_no_cpu_information_raises():
    with pytest.raises(TopologyParseError, match="no CPU information"):
        build_host()


def test_runpod_cores_from_lscpu_and_cpu_numbering():
    host = runpod_host()  # lscpu_04: 2 threads per core, node 0 = 0-23,48-71
    assert host.smt_source == "lscpu (2 threads per core) and the CPU numbering"
    assert host.core_groups(0) == [(c, c + 48) for c in range(24)]
    assert host.core_groups(1) == [(c, c + 48) for c in range(24, 48)]
    assert host.siblings_known(0) and host.siblings_known(1)
    assert host.to_dict()["physical_cores"]["1"][0] == [24, 72]


def test_build_host_siblings_argument_and_cpuset_cut():
    # a cpuset holding both threads of cores 0 and 1 but one thread of core 2
    host = build_host(lscpu=parse_lscpu(capture("lscpu_04.txt")), allowed_cpus=[0, 1, 2, 48, 49])
    assert host.numa_nodes == {0: (0, 1, 2, 48, 49)}
    assert host.core_groups(0) == [(0, 48), (1, 49), (2,)]
    plan = plan_placement(host, cpu_instances=2)
    assert [i.cpus for i in plan.instances] == [(0, 1, 48, 49), (2,)]
    # explicit siblings (sysfs of this host) win over the numbering guess
    numa = parse_numactl(numactl_text({0: range(8)}))
    pairs = {c: (c - c % 2, c - c % 2 + 1) for c in range(8)}
    host2 = build_host(numa=numa, siblings=pairs)
    assert host2.smt_source == SYSFS_SIBLINGS
    assert [i.cpus for i in plan_placement(host2, cpu_instances=3).instances] == [
        (0, 1, 2, 3),
        (4, 5),
        (6, 7),
    ]
