"""doctor.plan: instances, whole-core CPU slices, GPUs and servers per NUMA node."""

from __future__ import annotations

import os

import pytest
from doctor_hosts import (
    assert_no_shared_core,
    asus_host,
    capture,
    h200_host,
    instances,
    no_gpu_runner,
    numactl_text,
    runpod_host,
    span,
)
from triton_embed_server.host.doctor import build_host, gather_host, plan_placement, render_report
from triton_embed_server.host.placement.slicing import cpu_slice
from triton_embed_server.host.topology import (
    parse_lscpu,
    parse_numactl,
    parse_p2p,
    parse_topo_matrix,
)


def test_asus_plan_four_instances_per_gpu():
    plan = plan_placement(asus_host(), instances_per_gpu=4)
    expected = [
        {
            "index": i,
            "numa_node": i // 8,
            "cpus": span(4 * i, 4 * i + 3),
            "gpu": i // 4,
        }
        for i in range(16)
    ]
    assert instances(plan) == expected
    assert plan.kind == "gpu" and plan.warnings == ()
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


def test_h200_plan_eight_gpus_two_nodes():
    plan = plan_placement(h200_host(), instances_per_gpu=4)
    got = instances(plan)
    assert [i["gpu"] for i in got] == [g for g in range(8) for _ in range(4)]
    assert [i["numa_node"] for i in got] == [0] * 16 + [1] * 16
    # 16 instances on each node of 64 cores (0-63,128-191: CPU c and c+128 share a core,
    # inferred from the numbering without lscpu): 4 whole cores (8 CPUs) each
    assert [i["cpus"] for i in got[:16]] == [
        span(4 * k, 4 * k + 3) + span(128 + 4 * k, 131 + 4 * k) for k in range(16)
    ]
    assert got[16]["cpus"] == span(64, 67) + span(192, 195)
    assert plan.warnings == ()
    assert [(s["numa_node"], s["cuda_visible_devices"]) for s in plan.to_dict()["servers"]] == [
        (0, "0,1,2,3"),
        (1, "4,5,6,7"),
    ]


@pytest.mark.parametrize("build", [asus_host, runpod_host, h200_host])
@pytest.mark.parametrize("per_gpu", [1, 3, 4, 7])
def test_slices_are_disjoint_and_cover_each_node(build, per_gpu):
    host = build()
    plan = plan_placement(host, instances_per_gpu=per_gpu)
    for node, cpus in host.numa_nodes.items():
        slices = [set(i.cpus) for i in plan.instances if i.numa_node == node]
        union = set().union(*slices)
        assert sum(len(s) for s in slices) == len(union)  # pairwise disjoint
        assert union == set(cpus)
        gpus_here = {g.index for g in host.gpus if g.numa_node == node}
        assert all(i.gpu in gpus_here for i in plan.instances if i.numa_node == node)


def test_cpu_plan_spreads_over_eight_nodes():
    host = build_host(lscpu=parse_lscpu(capture("lscpu_02.txt")))
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
    assert all(i["gpu"] is None for i in got)
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


def test_cpu_plan_default_one_per_node():
    host = build_host(numa=parse_numactl(capture("numactl_03.txt")))
    plan = plan_placement(host, cpu_instances=None)
    assert [(i.numa_node, len(i.cpus)) for i in plan.instances] == [(n, 32) for n in range(8)]
    assert plan.warnings == ()


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
        ({"cpu_instances": -1}, "cpu_instances must be >= 1, got -1"),
    ],
)
def test_plan_rejects_bad_counts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_placement(asus_host(), **kwargs)


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


def test_runpod_two_instances_per_gpu_get_whole_disjoint_cores():
    plan = plan_placement(runpod_host(), instances_per_gpu=2)
    # 4 instances per node of 24 cores: 6 whole cores (12 CPUs) each
    assert [i.cpus for i in plan.instances] == [
        tuple(span(6 * k, 6 * k + 5) + span(48 + 6 * k, 53 + 6 * k)) for k in range(4)
    ] + [tuple(span(24 + 6 * k, 29 + 6 * k) + span(72 + 6 * k, 77 + 6 * k)) for k in range(4)]
    assert [i.gpu for i in plan.instances] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert_no_shared_core(plan, lambda cpu: cpu % 48)  # CPU c and c+48 share a core
    assert plan.warnings == ()


@pytest.mark.parametrize("per_gpu", [1, 3, 4, 7, 12])
def test_runpod_no_two_instances_share_a_core(per_gpu):
    plan = plan_placement(runpod_host(), instances_per_gpu=per_gpu)
    assert_no_shared_core(plan, lambda cpu: cpu % 48)
    for inst in plan.instances:  # whole cores: both threads or neither
        assert set(inst.cpus) == {c % 48 for c in inst.cpus} | {c % 48 + 48 for c in inst.cpus}


def test_numactl_02_interleaved_smt_lists_cpu_plan():
    # numactl_02 alone (no lscpu): node 0 = 0-31,64-95 of 128 CPUs, siblings c and c+64
    host = build_host(numa=parse_numactl(capture("numactl_02.txt")))
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


def test_more_instances_than_cores_keeps_cpus_disjoint():
    host = build_host(lscpu=parse_lscpu(capture("lscpu_04.txt")), allowed_cpus=[0, 1, 48, 49])
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
        lscpu=parse_lscpu(capture("lscpu_04.txt")),
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
    numa_only = build_host(numa=parse_numactl(capture("numactl_01.txt")))
    warnings = plan_placement(numa_only, cpu_instances=4).warnings
    assert warnings[1] == (
        "NUMA node 1 (32-63): SMT siblings unknown (no sysfs thread_siblings_list and no lscpu "
        "'Thread(s) per core'); CPU slices follow CPU numbers, so one instance's slice may hold "
        "the SMT siblings of another's cores"
    )
    # one instance per node: nothing to split, nothing to report
    assert plan_placement(numa_only).warnings == ()


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
