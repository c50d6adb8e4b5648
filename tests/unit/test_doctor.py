"""doctor: combining sources into a host, the placement planner, the report and the CLI.

Hosts are built from the real outputs in ``<repo>/../shared/fixtures/topology``
(topo_m_06 + numactl_01 + lscpu_01 are one machine, topo_m_05 + lscpu_04 another) and from
this machine. Expected plans are written out by hand from the node CPU lists.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from triton_embed.cli import main
from triton_embed_server.doctor import (
    CAPTURE_FILES,
    COMMANDS,
    SYSFS_SIBLINGS,
    CommandOutput,
    HostTopology,
    build_host,
    core_slice,
    gather_host,
    link_rank,
    plan_placement,
    render_report,
    run_command,
)
from triton_embed_server.engine import cpu_slice
from triton_embed_server.topology import (
    TopologyParseError,
    parse_lscpu,
    parse_numactl,
    parse_p2p,
    parse_topo_matrix,
)

FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "topology"


def fixture_text(name: str) -> str:
    if not FIXTURES.is_dir():
        pytest.skip(f"topology fixtures not found at {FIXTURES} (shared/ is not beside the repo)")
    return (FIXTURES / name).read_text()


def numactl_text(nodes: dict[int, range]) -> str:
    lines = [f"available: {len(nodes)} nodes (0-{len(nodes) - 1})"]
    for n, cpus in nodes.items():
        lines += [
            f"node {n} cpus: {' '.join(map(str, cpus))}",
            f"node {n} size: 1000 MB",
            f"node {n} free: 900 MB",
        ]
    lines += ["node distances:", "node " + " ".join(f"  {n}" for n in nodes)]
    for a in nodes:
        lines.append(f"  {a}: " + " ".join(" 10" if a == b else " 21" for b in nodes))
    return "\n".join(lines) + "\n"


def asus_host() -> HostTopology:
    """ASUS ESC8000A-E12: 4x RTX 6000 Ada, 2x EPYC 9374F (topo_m_06 + numactl_01 + lscpu_01)."""
    return build_host(
        topo=parse_topo_matrix(fixture_text("topo_m_06.txt")),
        numa=parse_numactl(fixture_text("numactl_01.txt")),
        lscpu=parse_lscpu(fixture_text("lscpu_01.txt")),
    )


def runpod_host() -> HostTopology:
    """RunPod: 4x A40, 2x Xeon Gold 6342 with SMT (topo_m_05 + lscpu_04)."""
    return build_host(
        topo=parse_topo_matrix(fixture_text("topo_m_05.txt")),
        lscpu=parse_lscpu(fixture_text("lscpu_04.txt")),
    )


def h200_host() -> HostTopology:
    """8x H200 NVSwitch, 2 NUMA nodes (topo_m_03 alone)."""
    return build_host(topo=parse_topo_matrix(fixture_text("topo_m_03.txt")))


def span(a: int, b: int) -> list[int]:
    return list(range(a, b + 1))


def instances(plan) -> list[dict]:
    return plan.to_dict()["instances"]


# --- host ------------------------------------------------------------------------------


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
    assert host.link(0, 2) == "SYS" and host.link(3, 2) == "NODE"
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
    text = fixture_text("topo_m_04.txt").replace("  NUMA Affinity", "")
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
        {"index": 0, "numa_node": 0, "cpus": span(0, 11), "gpu": 0, "gpus": [0], "tp_group": None},
        {"index": 1, "numa_node": 0, "cpus": span(12, 23), "gpu": 0, "gpus": [0], "tp_group": None},
        {"index": 2, "numa_node": None, "cpus": [], "gpu": 1, "gpus": [1], "tp_group": None},
        {"index": 3, "numa_node": None, "cpus": [], "gpu": 1, "gpus": [1], "tp_group": None},
    ]
    servers = plan.to_dict()["servers"]
    assert [(s["numa_node"], s["gpus"], s["instances"], s["numactl_prefix"]) for s in servers] == [
        (0, [0], [0, 1], ["numactl", "--cpunodebind=0", "--membind=0"]),
        (None, [1], [2, 3], None),
    ]


def test_gpu_numa_node_missing_from_host_list():
    host = build_host(
        topo=parse_topo_matrix(fixture_text("topo_m_06.txt")),
        numa=parse_numactl(numactl_text({0: range(0, 64)})),
    )
    assert [g.numa_node for g in host.gpus] == [0, 0, None, None]
    assert host.warnings[0] == (
        "GPU2: nvidia-smi says NUMA node 1, which has no CPUs in the host's NUMA "
        "list; its instances are not pinned"
    )


def test_disagreeing_sources_and_cpuset_are_reported():
    host = build_host(
        lscpu=parse_lscpu(fixture_text("lscpu_04.txt")),
        numa=parse_numactl(fixture_text("numactl_01.txt")),
        allowed_cpus=range(0, 8),
    )
    assert host.numa_nodes == {0: tuple(range(8))}
    assert host.warnings == (
        "lscpu and numactl --hardware disagree on the NUMA nodes' CPUs; using numactl --hardware",
        "this process may run on CPUs 0-7 only (cpuset or affinity mask); the plan uses those",
    )


def test_p2p_from_another_host_is_reported():
    host = build_host(
        topo=parse_topo_matrix(fixture_text("topo_m_06.txt")),
        p2p=parse_p2p(fixture_text("p2p_r_01.txt")),
        numa=parse_numactl(fixture_text("numactl_01.txt")),
    )
    assert host.warnings == (
        "nvidia-smi topo -p2p lists GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7 but "
        "topo -m lists GPU0 GPU1 GPU2 GPU3: captured on different hosts?",
    )


def test_no_cpu_information_raises():
    with pytest.raises(TopologyParseError, match="no CPU information"):
        build_host()


# --- GPU plans -------------------------------------------------------------------------


def test_asus_plan_four_instances_per_gpu():
    plan = plan_placement(asus_host(), instances_per_gpu=4)
    expected = [
        {
            "index": i,
            "numa_node": i // 8,
            "cpus": span(4 * i, 4 * i + 3),
            "gpu": i // 4,
            "gpus": [i // 4],
            "tp_group": None,
        }
        for i in range(16)
    ]
    assert instances(plan) == expected
    assert plan.kind == "gpu" and plan.warnings == () and plan.tp_groups == ()
    assert plan.to_dict()["servers"] == [
        {
            "numa_node": 0,
            "cpus": span(0, 31),
            "gpus": [0, 1],
            "instances": list(range(8)),
            "numactl_prefix": ["numactl", "--cpunodebind=0", "--membind=0"],
            "cuda_visible_devices": "0,1",
            "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1"},
        },
        {
            "numa_node": 1,
            "cpus": span(32, 63),
            "gpus": [2, 3],
            "instances": list(range(8, 16)),
            "numactl_prefix": ["numactl", "--cpunodebind=1", "--membind=1"],
            "cuda_visible_devices": "2,3",
            "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"},
        },
    ]


def test_runpod_plan_smt_node_slices_whole_cores():
    # lscpu_04: 2 threads per core, node 0 = 0-23,48-71 (CPU c and c+48 share a core):
    # 8 instances on 24 cores get 3 whole cores (6 CPUs) each
    plan = plan_placement(runpod_host(), instances_per_gpu=4)
    node0 = [span(3 * k, 3 * k + 2) + span(48 + 3 * k, 50 + 3 * k) for k in range(8)]
    node1 = [span(24 + 3 * k, 26 + 3 * k) + span(72 + 3 * k, 74 + 3 * k) for k in range(8)]
    got = instances(plan)
    assert [i["cpus"] for i in got] == node0 + node1
    assert [i["gpu"] for i in got] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert [i["numa_node"] for i in got] == [0] * 8 + [1] * 8
    assert plan.warnings == ()


def test_h200_tp2_groups_stay_within_nodes():
    plan = plan_placement(h200_host(), instances_per_gpu=4, tp_size=2)
    assert [g.to_dict() for g in plan.tp_groups] == [
        {"index": 0, "numa_node": 0, "gpus": [0, 1], "worst_link": "NV18"},
        {"index": 1, "numa_node": 0, "gpus": [2, 3], "worst_link": "NV18"},
        {"index": 2, "numa_node": 1, "gpus": [4, 5], "worst_link": "NV18"},
        {"index": 3, "numa_node": 1, "gpus": [6, 7], "worst_link": "NV18"},
    ]
    assert plan.ungrouped_gpus == ()
    got = instances(plan)
    assert len(got) == 16
    assert [i["tp_group"] for i in got] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert [i["gpus"] for i in got[:5]] == [[0, 1]] * 4 + [[2, 3]]
    assert [i["gpu"] for i in got[::4]] == [0, 2, 4, 6]
    # 8 instances on each node of 64 cores (0-63,128-191: CPU c and c+128 share a core,
    # inferred from the numbering without lscpu): 8 whole cores (16 CPUs) each
    assert [i["cpus"] for i in got[:8]] == [
        span(8 * k, 8 * k + 7) + span(128 + 8 * k, 135 + 8 * k) for k in range(8)
    ]
    assert got[8]["cpus"] == span(64, 71) + span(192, 199)
    assert plan.warnings == ()
    assert [(s["numa_node"], s["cuda_visible_devices"]) for s in plan.to_dict()["servers"]] == [
        (0, "0,1,2,3"),
        (1, "4,5,6,7"),
    ]


def test_h200_tp4_one_group_per_node():
    plan = plan_placement(h200_host(), instances_per_gpu=4, tp_size=4)
    assert [(g.numa_node, g.gpus) for g in plan.tp_groups] == [(0, (0, 1, 2, 3)), (1, (4, 5, 6, 7))]
    assert [i["cpus"] for i in instances(plan)[:4]] == [
        span(16 * k, 16 * k + 15) + span(128 + 16 * k, 143 + 16 * k) for k in range(4)
    ]
    assert [i["gpus"] for i in instances(plan)] == [[0, 1, 2, 3]] * 4 + [[4, 5, 6, 7]] * 4
    assert plan.ungrouped_gpus == ()


def test_h200_tp8_is_not_placed_across_numa_nodes():
    plan = plan_placement(h200_host(), instances_per_gpu=4, tp_size=8)
    assert plan.instances == () and plan.tp_groups == () and plan.servers == ()
    assert [(u.gpu, u.numa_node) for u in plan.ungrouped_gpus] == [(g, g // 4) for g in range(8)]
    assert plan.ungrouped_gpus[0].reason == (
        "NUMA node 0 has 4 GPU(s); 4 left over after groups of 8, "
        "and a group may not cross NUMA nodes"
    )
    assert plan.warnings == (
        "tensor-parallel size 8 does not fit within one NUMA node "
        "(the most GPUs on one node is 4); "
        "groups may not cross NUMA nodes, so nothing is placed: use --tp-size 4 or less",
    )
    assert "  no instances placed" in render_report(h200_host(), plan)


def test_tp_groups_prefer_pcie_switch_over_root_complex():
    # topo_m_01: node 0 has GPU0-5 (PHB: 1-2, 3-4; NODE otherwise), node 1 has GPU6-7 (PHB)
    host = build_host(topo=parse_topo_matrix(fixture_text("topo_m_01.txt")))
    plan = plan_placement(host, instances_per_gpu=1, tp_size=2)
    assert [(g.numa_node, g.gpus, g.worst_link) for g in plan.tp_groups] == [
        (0, (1, 2), "PHB"),
        (0, (3, 4), "PHB"),
        (0, (0, 5), "NODE"),
        (1, (6, 7), "PHB"),
    ]
    assert plan.warnings[2] == (
        "tensor-parallel group 2 (GPUs 0, 5) talks through the CPU root complex (NODE); "
        "expect slower "
        "all-reduce than NVLink or a PCIe switch"
    )
    plan4 = plan_placement(host, instances_per_gpu=1, tp_size=4)
    assert [(g.numa_node, g.gpus, g.worst_link) for g in plan4.tp_groups] == [
        (0, (1, 2, 3, 4), "NODE")
    ]
    assert [(u.gpu, u.numa_node) for u in plan4.ungrouped_gpus] == [(0, 0), (5, 0), (6, 1), (7, 1)]
    assert plan4.ungrouped_gpus[2].reason == (
        "NUMA node 1 has 2 GPU(s); 2 left over after groups of 4, "
        "and a group may not cross NUMA nodes"
    )
    assert plan4.warnings[0] == (
        "GPU(s) 0, 5, 6, 7 are in no tensor-parallel group of 4 (a group may "
        "not cross NUMA nodes) and get no instances"
    )
    # the single instance of group 0 gets the whole of node 0
    assert instances(plan4) == [
        {
            "index": 0,
            "numa_node": 0,
            "cpus": span(0, 15) + span(32, 47),
            "gpu": 1,
            "gpus": [1, 2, 3, 4],
            "tp_group": 0,
        }
    ]


def test_tp_group_without_p2p_is_reported():
    topo = parse_topo_matrix(
        "        GPU0    GPU1    CPU Affinity    NUMA Affinity\n"
        "GPU0     X      PIX     0-7     0\nGPU1    PIX      X      0-7     0\n"
    )
    host = build_host(topo=topo, p2p=parse_p2p(fixture_text("p2p_r_02.txt")))
    plan = plan_placement(host, instances_per_gpu=1, tp_size=2)
    assert plan.warnings == ("tensor-parallel group 0: no peer-to-peer access (GPU0-GPU1 CNS)",)
    report = render_report(host, plan)
    assert "Peer-to-peer (nvidia-smi topo -p2p): GPU0-GPU1 CNS (Chipset not supported)" in report


def test_link_rank_order():
    labels = ["SYS", "NODE", "PHB", "PXB", "PIX", "NV4", "NV18", None, "SOC"]
    assert sorted(labels, key=link_rank) == [
        "NV18",
        "NV4",
        "PIX",
        "PXB",
        "PHB",
        "NODE",
        "SYS",
        "SOC",
        None,
    ]


@pytest.mark.parametrize("build", [asus_host, runpod_host, h200_host])
@pytest.mark.parametrize("per_gpu", [1, 3, 4, 7])
@pytest.mark.parametrize("tp", [1, 2])
def test_slices_are_disjoint_and_cover_each_node(build, per_gpu, tp):
    host = build()
    plan = plan_placement(host, instances_per_gpu=per_gpu, tp_size=tp)
    for node, cpus in host.numa_nodes.items():
        slices = [set(i.cpus) for i in plan.instances if i.numa_node == node]
        union = set().union(*slices)
        assert sum(len(s) for s in slices) == len(union)  # pairwise disjoint
        assert union == set(cpus)
        gpus_here = {g.index for g in host.gpus if g.numa_node == node}
        assert all(set(i.gpus) <= gpus_here for i in plan.instances if i.numa_node == node)


# --- CPU-only plans --------------------------------------------------------------------


def test_cpu_plan_spreads_over_eight_nodes():
    host = build_host(lscpu=parse_lscpu(fixture_text("lscpu_02.txt")))
    plan = plan_placement(host, cpu_instances=10)
    got = instances(plan)
    assert [(i["numa_node"], i["cpus"]) for i in got] == [
        (0, span(0, 2) + span(48, 50)),
        (0, span(3, 5) + span(51, 53)),
        (1, span(6, 8) + span(54, 56)),
        (1, span(9, 11) + span(57, 59)),
        (2, span(12, 17) + span(60, 65)),
        (3, span(18, 23) + span(66, 71)),
        (4, span(24, 29) + span(72, 77)),
        (5, span(30, 35) + span(78, 83)),
        (6, span(36, 41) + span(84, 89)),
        (7, span(42, 47) + span(90, 95)),
    ]
    assert all(i["gpu"] is None and i["gpus"] == [] for i in got)
    servers = plan.to_dict()["servers"]
    assert [
        (s["numa_node"], s["instances"], s["numactl_prefix"][1], s["cuda_visible_devices"])
        for s in servers
    ][:3] == [
        (0, [0, 1], "--cpunodebind=0", None),
        (1, [2, 3], "--cpunodebind=1", None),
        (2, [4], "--cpunodebind=2", None),
    ]
    assert len(servers) == 8
    assert plan.kind == "cpu" and plan.cpu_instances == 10 and plan.instances_per_gpu is None
    assert plan.warnings == ()  # nodes 0 and 1 split by whole cores, siblings kept together


def test_cpu_plan_default_one_per_node_and_tp_ignored():
    host = build_host(numa=parse_numactl(fixture_text("numactl_03.txt")))
    plan = plan_placement(host, cpu_instances=None, tp_size=2)
    assert [(i.numa_node, len(i.cpus)) for i in plan.instances] == [(n, 32) for n in range(8)]
    assert plan.warnings == ("--tp-size 2 applies to GPUs; ignored on this CPU-only host",)


def test_more_instances_than_cpus_is_reported():
    host = build_host(numa=parse_numactl(numactl_text({0: range(0, 2)})))
    plan = plan_placement(host, cpu_instances=3)
    assert [i.cpus for i in plan.instances] == [(0,), (1,), (0,)]
    assert plan.warnings == (
        "NUMA node 0: 3 instances but 2 CPUs; instances share CPUs (cpu_slice gives "
        "instance i the CPU i mod the CPU count)",
    )
    assert plan.servers[0].numactl_prefix is None  # one node: nothing to bind


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"instances_per_gpu": 0}, "instances_per_gpu must be >= 1, got 0"),
        ({"tp_size": 0}, "tp_size must be >= 1, got 0"),
        ({"cpu_instances": -1}, "cpu_instances must be >= 1, got -1"),
    ],
)
def test_plan_rejects_bad_counts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_placement(asus_host(), **kwargs)


def no_gpu_runner(argv, timeout_s):
    if argv[0] == "nvidia-smi":
        return CommandOutput(None, "not available: nvidia-smi not found on PATH")
    return run_command(argv, timeout_s)


def test_cpu_plan_on_this_machine_equals_cpu_slice():
    host = gather_host(run=no_gpu_runner)
    assert host.gpus == ()
    allowed = sorted(os.sched_getaffinity(0))
    assert sorted(c for cpus in host.numa_nodes.values() for c in cpus) == allowed
    plan = plan_placement(host, cpu_instances=2)
    nodes = sorted(host.numa_nodes)
    counts = {n: 2 // len(nodes) + (1 if k < 2 % len(nodes) else 0) for k, n in enumerate(nodes)}
    want = [
        (n, tuple(cpu_slice(host.numa_nodes[n], i, counts[n])))
        for n in nodes
        for i in range(counts[n])
    ]
    assert [(i.numa_node, i.cpus) for i in plan.instances] == want
    if len(nodes) == 1:
        assert [i.cpus for i in plan.instances] == [
            tuple(cpu_slice(allowed, k, 2)) for k in range(2)
        ]
        assert len(plan.servers) == 1 and plan.servers[0].cpus == tuple(allowed)


# --- gathering -------------------------------------------------------------------------


def fake_runner(outputs: dict[tuple[str, ...], CommandOutput], calls: list):
    def run(argv, timeout_s):
        calls.append((tuple(argv), timeout_s))
        return outputs.get(tuple(argv), CommandOutput(None, "not available: not in this test"))

    return run


def test_gather_without_nvidia_smi_or_numactl_falls_back_to_sysfs(tmp_path, node_sysfs):
    calls: list = []
    run = fake_runner(
        {
            COMMANDS["topo_m"]: CommandOutput(None, "not available: nvidia-smi not found on PATH"),
            COMMANDS["lscpu"]: CommandOutput(fixture_text("lscpu_01.txt"), "ok"),
            COMMANDS["numactl"]: CommandOutput(None, "not available: numactl not found on PATH"),
        },
        calls,
    )
    sysfs = node_sysfs(tmp_path / "node", {0: "0-31", 1: "32-63"})
    host = gather_host(run=run, timeout_s=3.0, sysfs_root=sysfs, process_cpus=lambda: range(64))
    assert [c[0] for c in calls] == [COMMANDS["topo_m"], COMMANDS["lscpu"], COMMANDS["numactl"]]
    assert all(c[1] == 3.0 for c in calls)
    assert host.sources == {
        "nvidia-smi topo -m": "not available: nvidia-smi not found on PATH",
        "nvidia-smi topo -p2p": "not available: no GPU matrix (nvidia-smi topo -m)",
        "lscpu": "ok",
        "numactl --hardware": "not available: numactl not found on PATH",
        "sysfs": "ok",
    }
    assert host.numa_source == "sysfs"
    assert host.numa_nodes == {0: tuple(span(0, 31)), 1: tuple(span(32, 63))}
    assert host.warnings == ()


def test_gather_live_gpu_host_runs_p2p_write(tmp_path):
    p2p4 = "        GPU0    GPU1    GPU2    GPU3\n" + "".join(
        f" GPU{i}   " + "  ".join("X " if i == j else "OK" for j in range(4)) + "\n"
        for i in range(4)
    )
    calls: list = []
    run = fake_runner(
        {
            COMMANDS["topo_m"]: CommandOutput(fixture_text("topo_m_06.txt"), "ok"),
            COMMANDS["p2p"]: CommandOutput(p2p4, "ok"),
            COMMANDS["lscpu"]: CommandOutput(fixture_text("lscpu_01.txt"), "ok"),
            COMMANDS["numactl"]: CommandOutput(fixture_text("numactl_01.txt"), "ok"),
        },
        calls,
    )
    host = gather_host(run=run, sysfs_root=tmp_path / "absent", process_cpus=lambda: range(64))
    assert COMMANDS["p2p"] == ("nvidia-smi", "topo", "-p2p", "w")
    assert [c[0] for c in calls] == [
        COMMANDS["topo_m"],
        COMMANDS["p2p"],
        COMMANDS["lscpu"],
        COMMANDS["numactl"],
    ]
    assert host.p2p.mode == "w" and host.p2p.all_ok
    assert "sysfs" not in host.sources
    assert plan_placement(host).to_dict() == plan_placement(asus_host()).to_dict()


def test_gather_live_sysfs_missing_too(tmp_path):
    run = fake_runner(
        {
            COMMANDS["topo_m"]: CommandOutput(None, "not available: nvidia-smi not found on PATH"),
            COMMANDS["lscpu"]: CommandOutput(fixture_text("lscpu_05.txt"), "ok"),
            COMMANDS["numactl"]: CommandOutput(
                None, "not available: numactl --hardware exited with status 1"
            ),
        },
        [],
    )
    host = gather_host(run=run, sysfs_root=tmp_path / "absent", process_cpus=lambda: range(36))
    assert host.sources["sysfs"].startswith("not available: sysfs: ")
    assert host.numa_source == "lscpu"
    assert host.numa_nodes == {0: tuple(range(18)), 1: tuple(range(18, 36))}


def test_gather_live_garbled_output_raises():
    run = fake_runner(
        {
            COMMANDS["topo_m"]: CommandOutput("NVIDIA-SMI has failed in an odd way\n", "ok"),
        },
        [],
    )
    with pytest.raises(
        TopologyParseError, match="^nvidia-smi topo -m: no header line starting with 'GPU0'"
    ):
        gather_host(run=run)


def test_run_command_reports_instead_of_raising():
    assert run_command(["no-such-command-triton-embed"]) == CommandOutput(
        None, "not available: no-such-command-triton-embed not found on PATH"
    )
    if shutil.which("sh") is None:
        pytest.skip("no sh")
    failed = run_command(["sh", "-c", "echo boom >&2; exit 3"])
    assert failed == CommandOutput(
        None, "not available: sh -c echo boom >&2; exit 3 exited with status 3: boom"
    )
    assert run_command(["sh", "-c", "echo hi"]) == CommandOutput("hi\n", "ok")
    slow = run_command(["sh", "-c", "sleep 5"], timeout_s=0.2)
    assert slow == CommandOutput(None, "not available: sh -c sleep 5 timed out after 0.2 s")


def write_capture(folder: Path, **names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for key, fixture in names.items():
        (folder / CAPTURE_FILES[key]).write_text(fixture_text(fixture))
    return folder


def test_gather_from_dir(tmp_path):
    folder = write_capture(
        tmp_path / "asus", topo_m="topo_m_06.txt", numactl="numactl_01.txt", lscpu="lscpu_01.txt"
    )
    host = gather_host(folder)
    assert host.sources == {
        "nvidia-smi topo -m": "ok",
        "nvidia-smi topo -p2p": f"not available: no {folder / 'p2p.txt'}",
        "lscpu": "ok",
        "numactl --hardware": "ok",
    }
    assert host.to_dict() == asus_host().to_dict() | {"sources": host.sources}


def test_gather_from_dir_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="--from-dir .*absent: no such folder"):
        gather_host(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        TopologyParseError, match="holds none of topo_m.txt, p2p.txt, lscpu.txt, numactl.txt"
    ):
        gather_host(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "lscpu.txt").write_text("")
    with pytest.raises(TopologyParseError, match=r"^lscpu: empty output; .* \(.*bad/lscpu.txt\)$"):
        gather_host(bad)


# --- physical cores (SMT siblings) -----------------------------------------------------


def assert_no_shared_core(plan, core_of) -> None:
    """No two instances hold CPUs of the same physical core (``core_of``: CPU -> core id)."""
    owner: dict = {}
    for inst in plan.instances:
        for cpu in inst.cpus:
            assert owner.setdefault(core_of(cpu), inst.index) == inst.index, (cpu, inst.index)


def test_runpod_cores_from_lscpu_and_cpu_numbering():
    host = runpod_host()  # lscpu_04: 2 threads per core, node 0 = 0-23,48-71
    assert host.smt_source == "lscpu (2 threads per core) and the CPU numbering"
    assert host.core_groups(0) == [(c, c + 48) for c in range(24)]
    assert host.core_groups(1) == [(c, c + 48) for c in range(24, 48)]
    assert host.siblings_known(0) and host.siblings_known(1)
    assert host.to_dict()["physical_cores"]["1"][0] == [24, 72]


def test_runpod_two_instances_per_gpu_get_whole_disjoint_cores():
    plan = plan_placement(runpod_host(), instances_per_gpu=2)
    # 4 instances per node of 24 cores: 6 whole cores (12 CPUs) each
    assert [i.cpus for i in plan.instances] == [
        tuple(span(6 * k, 6 * k + 5) + span(48 + 6 * k, 53 + 6 * k)) for k in range(4)
    ] + [tuple(span(24 + 6 * k, 29 + 6 * k) + span(72 + 6 * k, 77 + 6 * k)) for k in range(4)]
    assert [i.gpu for i in plan.instances] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert_no_shared_core(plan, lambda cpu: cpu % 48)  # CPU c and c+48 share a core
    assert plan.warnings == ()


def test_runpod_tp2_instances_get_whole_disjoint_cores():
    plan = plan_placement(runpod_host(), instances_per_gpu=2, tp_size=2)
    assert [(g.numa_node, g.gpus) for g in plan.tp_groups] == [(0, (0, 1)), (1, (2, 3))]
    assert [(i.tp_group, i.gpus, i.cpus) for i in plan.instances] == [
        (0, (0, 1), tuple(span(0, 11) + span(48, 59))),
        (0, (0, 1), tuple(span(12, 23) + span(60, 71))),
        (1, (2, 3), tuple(span(24, 35) + span(72, 83))),
        (1, (2, 3), tuple(span(36, 47) + span(84, 95))),
    ]
    assert_no_shared_core(plan, lambda cpu: cpu % 48)
    assert plan.warnings == ()


@pytest.mark.parametrize("per_gpu", [1, 3, 4, 7, 12])
def test_runpod_no_two_instances_share_a_core(per_gpu):
    plan = plan_placement(runpod_host(), instances_per_gpu=per_gpu)
    assert_no_shared_core(plan, lambda cpu: cpu % 48)
    for inst in plan.instances:  # whole cores: both threads or neither
        assert set(inst.cpus) == {c % 48 for c in inst.cpus} | {c % 48 + 48 for c in inst.cpus}


def test_numactl_02_interleaved_smt_lists_cpu_plan():
    # numactl_02 alone (no lscpu): node 0 = 0-31,64-95 of 128 CPUs, siblings c and c+64
    host = build_host(numa=parse_numactl(fixture_text("numactl_02.txt")))
    assert host.smt_source.startswith("the CPU numbering (no lscpu: each node is two equal")
    assert host.core_groups(1)[:2] == [(32, 96), (33, 97)]
    plan = plan_placement(host, cpu_instances=4)
    assert [(i.numa_node, i.cpus) for i in plan.instances] == [
        (0, tuple(span(0, 15) + span(64, 79))),
        (0, tuple(span(16, 31) + span(80, 95))),
        (1, tuple(span(32, 47) + span(96, 111))),
        (1, tuple(span(48, 63) + span(112, 127))),
    ]
    assert_no_shared_core(plan, lambda cpu: cpu % 64)
    assert plan.warnings == ()


def test_gather_from_dir_runpod_cores_and_report(tmp_path, capsys):
    folder = write_capture(tmp_path / "runpod", topo_m="topo_m_05.txt", lscpu="lscpu_04.txt")
    host = gather_host(folder)
    assert host.cores == runpod_host().cores
    assert main(["doctor", "--from-dir", str(folder), "--instances-per-gpu", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        "  CPU slices are whole physical cores (SMT siblings kept together); "
        "cores from lscpu (2 threads per core) and the CPU numbering"
    ) in lines
    assert "    instance 1: GPU 0, CPUs 6-11,54-59" in lines
    assert "Warnings: none" in lines


def make_cpu_sysfs(root: Path, siblings: dict[int, tuple[int, ...]]) -> Path:
    for cpu, sib in siblings.items():
        (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(
            ",".join(map(str, sib)) + "\n"
        )
    return root


def runpod_live(tmp_path: Path, siblings: dict[int, tuple[int, ...]], node_sysfs) -> HostTopology:
    run = fake_runner(
        {
            COMMANDS["topo_m"]: CommandOutput(fixture_text("topo_m_05.txt"), "ok"),
            COMMANDS["lscpu"]: CommandOutput(fixture_text("lscpu_04.txt"), "ok"),
            COMMANDS["numactl"]: CommandOutput(None, "not available: numactl not found on PATH"),
        },
        [],
    )
    return gather_host(
        run=run,
        sysfs_root=node_sysfs(tmp_path / "node", {0: "0-23,48-71", 1: "24-47,72-95"}),
        process_cpus=lambda: range(96),
        cpu_sysfs_root=make_cpu_sysfs(tmp_path / "cpu", siblings),
    )


def test_gather_live_reads_siblings_from_sysfs(tmp_path, node_sysfs):
    host = runpod_live(tmp_path, {c: (c % 48, c % 48 + 48) for c in range(96)}, node_sysfs)
    assert host.smt_source == SYSFS_SIBLINGS
    assert host.cores == runpod_host().cores
    assert instances(plan_placement(host, instances_per_gpu=2)) == instances(
        plan_placement(runpod_host(), instances_per_gpu=2)
    )


def test_sysfs_siblings_override_the_numbering_guess(tmp_path, node_sysfs):
    # a kernel that numbers threads of a core adjacently: sysfs says so, lscpu cannot
    host = runpod_live(tmp_path, {c: (c - c % 2, c - c % 2 + 1) for c in range(96)}, node_sysfs)
    assert host.smt_source == SYSFS_SIBLINGS
    assert host.core_groups(0)[:2] == [(0, 1), (2, 3)]
    plan = plan_placement(host, instances_per_gpu=2)
    assert [i.cpus for i in plan.instances[:4]] == [
        tuple(span(0, 11)),
        tuple(span(12, 23)),
        tuple(span(48, 59)),
        tuple(span(60, 71)),
    ]
    assert_no_shared_core(plan, lambda cpu: cpu // 2)


def test_build_host_siblings_argument_and_cpuset_cut():
    # a cpuset holding both threads of cores 0 and 1 but one thread of core 2
    host = build_host(
        lscpu=parse_lscpu(fixture_text("lscpu_04.txt")), allowed_cpus=[0, 1, 2, 48, 49]
    )
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


def test_more_instances_than_cores_keeps_cpus_disjoint():
    host = build_host(lscpu=parse_lscpu(fixture_text("lscpu_04.txt")), allowed_cpus=[0, 1, 48, 49])
    plan = plan_placement(host, cpu_instances=3)
    assert [i.cpus for i in plan.instances] == [(0, 48), (1,), (49,)]
    assert plan.warnings == (
        "NUMA node 0: 3 instances but 2 physical cores (4 CPUs); CPUs stay disjoint, but some "
        "instances get single SMT threads of a core another instance also runs on",
    )
    plan5 = plan_placement(host, cpu_instances=5)
    assert [i.cpus for i in plan5.instances] == [(0,), (1,), (48,), (49,), (0,)]
    assert plan5.warnings[0].startswith("NUMA node 0: 5 instances but 4 CPUs; instances share")


def test_unknown_siblings_are_reported():
    # lscpu says 2 threads per core, but each node is one run: either numbering fits
    host = build_host(
        lscpu=parse_lscpu(fixture_text("lscpu_04.txt")),
        numa=parse_numactl(numactl_text({0: range(48), 1: range(48, 96)})),
    )
    assert host.cores == {} and host.smt_source == "unknown"
    plan = plan_placement(host, cpu_instances=4)
    assert [i.cpus for i in plan.instances] == [
        tuple(cpu_slice(range(48), 0, 2)),
        tuple(cpu_slice(range(48), 1, 2)),
        tuple(cpu_slice(range(48, 96), 0, 2)),
        tuple(cpu_slice(range(48, 96), 1, 2)),
    ]
    assert plan.warnings[0] == (
        "NUMA node 0 (0-47): SMT siblings unknown (lscpu says 2 threads per core, but the CPU "
        "numbers do not show which CPUs share a core); CPU slices follow CPU numbers, so one "
        "instance's slice may hold the SMT siblings of another's cores"
    )
    assert len(plan.warnings) == 2
    report = render_report(host, plan)
    assert "  CPU slices follow CPU numbers on NUMA node(s) 0, 1: SMT siblings unknown" in report
    # numactl alone with contiguous nodes: SMT unknown too
    numa_only = build_host(numa=parse_numactl(fixture_text("numactl_01.txt")))
    warnings = plan_placement(numa_only, cpu_instances=4).warnings
    assert warnings[1] == (
        "NUMA node 1 (32-63): SMT siblings unknown (no sysfs thread_siblings_list and no lscpu "
        "'Thread(s) per core'); CPU slices follow CPU numbers, so one instance's slice may hold "
        "the SMT siblings of another's cores"
    )
    # one instance per node: nothing to split, nothing to report
    assert plan_placement(numa_only).warnings == ()


def test_report_without_smt_says_one_thread_per_core():
    host = asus_host()
    report = render_report(host, plan_placement(host, instances_per_gpu=2))
    assert (
        "  CPU slices are whole physical cores (one thread per core); "
        "cores from lscpu (1 thread per core)"
    ) in report.splitlines()


@pytest.mark.parametrize("count", range(1, 15))
def test_core_slice_with_one_cpu_per_core_is_cpu_slice(count):
    cpus = [2, 3, 5, 8, 9, 10, 11, 20, 21, 30]
    for i in range(count + 2):
        assert core_slice([(c,) for c in cpus], i, count) == tuple(cpu_slice(cpus, i, count))


def test_core_slice_rules_and_errors():
    cores = [(0, 4), (1, 5), (2, 6)]
    assert [core_slice(cores, i, 2) for i in range(2)] == [(0, 1, 4, 5), (2, 6)]
    assert [core_slice(cores, i, 3) for i in range(3)] == [(0, 4), (1, 5), (2, 6)]
    assert [core_slice(cores, i, 4) for i in range(4)] == [(0, 4), (1, 5), (2,), (6,)]
    assert [core_slice(cores, i, 7) for i in range(7)] == [(0,), (1,), (2,), (4,), (5,), (6,), (0,)]
    with pytest.raises(ValueError, match="cannot split 0 CPUs among 2 instances"):
        core_slice([], 0, 2)
    with pytest.raises(ValueError, match="among 0 instances"):
        core_slice(cores, 0, 0)


def test_this_machines_cores_come_from_sysfs():
    if not Path("/sys/devices/system/cpu/cpu0/topology").is_dir():
        pytest.skip("this kernel exposes no /sys/devices/system/cpu/cpu0/topology")
    host = gather_host(run=no_gpu_runner)
    assert host.smt_source == SYSFS_SIBLINGS
    assert all(host.siblings_known(n) for n in host.numa_nodes)
    for node, cpus in host.numa_nodes.items():
        assert sorted(c for core in host.core_groups(node) for c in core) == list(cpus)
    if host.lscpu is not None and host.lscpu.threads_per_core == 1:
        # this 2-CPU machine: every CPU is its own core, so the plan is cpu_slice's
        assert all(len(core) == 1 for n in host.numa_nodes for core in host.core_groups(n))
        report = render_report(host, plan_placement(host, cpu_instances=2))
        assert "  CPU slices are whole physical cores (one thread per core); cores from sysfs" in (
            report
        )


# --- report ----------------------------------------------------------------------------


def test_report_of_asus_host():
    host = asus_host()
    report = render_report(host, plan_placement(host, instances_per_gpu=2))
    for line in [
        "  AMD EPYC 9374F 32-Core Processor (AuthenticAMD): 64 logical CPUs, online 0-63; "
        "2 socket(s) x 32 cores x 1 thread(s) per core",
        "  NUMA nodes (from numactl --hardware):",
        "    node 0: CPUs 0-31 (32 CPUs), 193129 MB memory (186031 MB free)",
        "    node 1: CPUs 32-63 (32 CPUs), 193477 MB memory (186364 MB free)",
        "  NUMA distances (10 = local): 0: 10 32; 1: 32 10",
        "  GPU2  1     32-63                 NUMA Affinity",
        "  through the CPU root complex within a node (PHB/NODE): "
        "GPU0-GPU1 (NODE), GPU2-GPU3 (NODE)",
        "  across the SMP interconnect between NUMA nodes (SYS): GPU0-GPU2 (SYS), GPU0-GPU3 (SYS), "
        "GPU1-GPU2 (SYS), GPU1-GPU3 (SYS)",
        "  on different NUMA nodes: "
        "GPU0-GPU2 (SYS), GPU0-GPU3 (SYS), GPU1-GPU2 (SYS), GPU1-GPU3 (SYS)",
        "  server on NUMA node 1: numactl --cpunodebind=1 --membind=1, "
        "CUDA_DEVICE_ORDER=PCI_BUS_ID "
        "CUDA_VISIBLE_DEVICES=2,3; CPUs 32-63",
        "    instance 5: GPU 2, CPUs 40-47",
        "Warnings: none",
    ]:
        assert line in report.splitlines(), line


def test_report_of_nvswitch_host_summarises_all_pairs():
    host = h200_host()
    report = render_report(host, plan_placement(host, tp_size=4))
    assert "  NVLink (NV#): all 28 pairs (NV18)" in report
    assert "  across the SMP interconnect between NUMA nodes (SYS): none" in report
    assert "    instance 0: GPUs 0,1,2,3 (tp group 0), CPUs 0-15,128-143" in report
    assert "  tensor-parallel group 1: GPUs 4, 5, 6, 7 on NUMA node 1, slowest link NV18" in report


# --- CLI -------------------------------------------------------------------------------


def test_cli_doctor_json_and_plan_out(tmp_path, capsys):
    folder = write_capture(
        tmp_path / "asus", topo_m="topo_m_06.txt", numactl="numactl_01.txt", lscpu="lscpu_01.txt"
    )
    plan_file = tmp_path / "out" / "plan.json"
    rc = main(["doctor", "--json", "--from-dir", str(folder), "--plan-out", str(plan_file)])
    assert rc == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"host", "plan", "warnings"}
    assert payload["plan"] == plan_placement(asus_host(), instances_per_gpu=4).to_dict()
    assert payload["warnings"] == []
    assert json.loads(plan_file.read_text()) == payload["plan"]
    assert payload["host"]["numa_source"] == "numactl --hardware"
    assert payload["host"]["topo_matrix"]["links"]["GPU0-GPU2"] == "SYS"


def test_cli_doctor_text_with_options(tmp_path, capsys):
    folder = write_capture(tmp_path / "runpod", topo_m="topo_m_05.txt", lscpu="lscpu_04.txt")
    assert (
        main(["doctor", "--from-dir", str(folder), "--instances-per-gpu", "1", "--tp-size", "2"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("triton-embed doctor\n")
    assert "Placement plan (1 instance(s) per group, tensor-parallel size 2):" in out
    assert "    instance 0: GPUs 0,1 (tp group 0), CPUs 0-23,48-71" in out
    assert "  tensor-parallel group 1: GPUs 2, 3 on NUMA node 1, slowest link PIX" in out
    assert "  PCIe switch, no CPU (PIX/PXB): GPU0-GPU1 (PXB), GPU2-GPU3 (PIX)" in out


def test_cli_doctor_tp8_on_two_nodes(tmp_path, capsys):
    folder = write_capture(tmp_path / "h200", topo_m="topo_m_03.txt", p2p="p2p_r_01.txt")
    assert main(["doctor", "--json", "--from-dir", str(folder), "--tp-size", "8"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["plan"]["instances"] == [] and payload["plan"]["servers"] == []
    assert len(payload["plan"]["ungrouped_gpus"]) == 8
    assert any("does not fit within one NUMA node" in w for w in payload["warnings"])
    assert payload["host"]["p2p"]["all_ok"] is True


def test_cli_doctor_absurd_cpu_range_exits_1(tmp_path, capsys):
    folder = write_capture(tmp_path / "asus", lscpu="lscpu_01.txt")
    text = (folder / "lscpu.txt").read_text()
    on_line = next(line for line in text.splitlines() if "On-line CPU(s) list:" in line)
    (folder / "lscpu.txt").write_text(text.replace(on_line, "On-line CPU(s) list: 0-9999999"))
    assert main(["doctor", "--from-dir", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "CPU 9999999" in err and "beyond the kernel's limit of 8192 CPUs" in err


def test_cli_doctor_garbage_input_exits_1(tmp_path, capsys):
    (tmp_path / "topo_m.txt").write_text("this is not nvidia-smi output\n")
    assert main(["doctor", "--from-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "triton-embed doctor: error: nvidia-smi topo -m: "
        "no header line starting with 'GPU0'; expected"
    )
    assert str(tmp_path / "topo_m.txt") in captured.err


def test_cli_doctor_bad_count_and_missing_dir_exit_1(tmp_path, capsys):
    folder = write_capture(tmp_path / "asus", lscpu="lscpu_01.txt")
    # counts are checked by argparse, which names the flag and exits 2 (usage error)
    for flag in ("--instances-per-gpu", "--cpu-instances", "--tp-size"):
        with pytest.raises(SystemExit) as stop:
            main(["doctor", "--from-dir", str(folder), flag, "0"])
        assert stop.value.code == 2
        assert f"argument {flag}: must be >= 1, got 0" in capsys.readouterr().err
    assert main(["doctor", "--from-dir", str(tmp_path / "nope")]) == 1
    assert "no such folder" in capsys.readouterr().err


def test_cli_doctor_on_this_machine(capsys):
    assert main(["doctor", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    if shutil.which("lscpu"):
        assert payload["host"]["sources"]["lscpu"] == "ok"
    if shutil.which("nvidia-smi") is None:
        plan = payload["plan"]
        assert plan["kind"] == "cpu" and len(plan["instances"]) == 2
        cpus = [c for i in plan["instances"] for c in i["cpus"]]
        assert set(cpus) <= os.sched_getaffinity(0)
        if len(os.sched_getaffinity(0)) >= 2:
            assert len(cpus) == len(set(cpus))  # disjoint


def test_single_gpu_single_node_host():
    # the layout of a real 1x H200 lease machine (driver 580): one GPU, one node of 16 CPUs
    topo = parse_topo_matrix(
        "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \t0-15\t0\t\tN/A\n"
    )
    p2p = parse_p2p(" \t\x1b[4mGPU0\t\x1b[0m\n GPU0\tX\t\n", mode="w")
    host = build_host(topo=topo, p2p=p2p, numa=parse_numactl(numactl_text({0: range(16)})))
    plan = plan_placement(host, instances_per_gpu=4)
    assert [i.cpus for i in plan.instances] == [tuple(span(4 * k, 4 * k + 3)) for k in range(4)]
    assert [s.to_dict() for s in plan.servers] == [
        {
            "numa_node": 0,
            "cpus": span(0, 15),
            "gpus": [0],
            "instances": [0, 1, 2, 3],
            "numactl_prefix": None,
            "cuda_visible_devices": "0",
            "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"},
        }
    ]
    report = render_report(host, plan)
    assert "Peer-to-peer (nvidia-smi topo -p2p w): one GPU, no pairs" in report
    assert "GPU pairs by link" not in report


def test_doctor_on_a_captured_h200_host(capsys):
    """Outputs captured on the lent H200 machine (driver 580.159.04, 1 GPU, 1 NUMA node, 16
    CPUs) with this project's device tool: single-GPU matrix layout, p2p w, numactl, lscpu."""
    from triton_embed.cli import main

    folder = Path(__file__).resolve().parents[1] / "data" / "topology_h200"
    assert main(["doctor", "--json", "--from-dir", str(folder)]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["host"]["gpus"] == [
        {
            "index": 0,
            "name": "GPU0",
            "numa_node": 0,
            "numa_source": "NUMA Affinity",
            "cpu_affinity": "0-15",
        }
    ]
    assert payload["host"]["numa_nodes"] == {
        "0": {"cpus": list(range(16)), "cpu_list": "0-15", "cpu_count": 16}
    }
    assert payload["host"]["p2p_problems"] == {}
    plan = payload["plan"]
    assert [(i["gpu"], i["numa_node"], i["cpus"]) for i in plan["instances"]] == [
        (0, 0, [0, 1, 2, 3]),
        (0, 0, [4, 5, 6, 7]),
        (0, 0, [8, 9, 10, 11]),
        (0, 0, [12, 13, 14, 15]),
    ]
    assert [(s["numactl_prefix"], s["cuda_visible_devices"]) for s in plan["servers"]] == [
        (None, "0")
    ]
    assert payload["warnings"] == []
