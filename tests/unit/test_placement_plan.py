"""placement.plan: one instance's placement (off / auto / a plan file) decided against fake
and real sysfs, with the environment its engine gets."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
from triton_embed_server.host.doctor import host_plan
from triton_embed_server.host.placement.instance import (
    InstancePlacement,
    PlacementError,
    decide_placement,
    instance_index,
    nodes_of,
    plan_entry,
    visible_gpu,
)
from triton_embed_server.host.placement.slicing import cpu_slice
from triton_embed_server.steps.config import EmbedderConfig


def embedder(
    count: int = 1, threads_bind: str = "spread", numa_placement: str = "off"
) -> EmbedderConfig:
    return EmbedderConfig(
        model_path=Path("/nonexistent"),
        max_length=256,
        instances_per_device=count,
        threads_bind=threads_bind,
        numa_placement=numa_placement,
    )


def fake_host_plan(tmp_path: Path, node_sysfs, nodes: dict[int, str], siblings=None):
    """``host_plan`` reading a fake sysfs: NUMA nodes ``nodes``, SMT ``siblings`` (or none)."""
    cpu_root = tmp_path / "cpu"
    for cpu, sib in (siblings or {}).items():
        (cpu_root / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (cpu_root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(
            ",".join(map(str, sib)) + "\n"
        )
    root = node_sysfs(tmp_path / "node", nodes)
    return root, functools.partial(host_plan, numa_root=root, cpu_sysfs_root=cpu_root)


@pytest.mark.parametrize(
    "name, index",
    [
        ("embedder_0_1", 1),
        ("embedder_0_0", 0),
        ("embedder_0_12", 12),
        ("embedder", 0),
        ("my_embedder_gpu_3", 3),
        ("embedder_x", 0),
    ],
)
def test_instance_index(name, index):
    assert instance_index(name) == index


# --- off -----------------------------------------------------------------------------------


def test_off_gpu_instance_sees_its_own_gpu():
    got = decide_placement(embedder(2), "GPU", 1, 3, allowed_cpus=[0, 1, 2, 3], environ={})
    assert (got.gpu, got.cpus, got.env) == (3, (0, 1, 2, 3), {"CUDA_VISIBLE_DEVICES": "3"})
    lower = decide_placement(embedder(1, "auto"), "gpu", 0, 0, allowed_cpus=[0], environ={})
    assert lower.env == {"CUDA_VISIBLE_DEVICES": "0"}


def test_off_gpu_instance_of_a_per_node_server_maps_visible_devices():
    got = decide_placement(
        embedder(), "GPU", 0, 1, allowed_cpus=[0], environ={"CUDA_VISIBLE_DEVICES": "2,3"}
    )
    assert (got.gpu, got.env) == (3, {"CUDA_VISIBLE_DEVICES": "3"})


@pytest.mark.parametrize(
    "allowed, index, env",
    [
        ([0, 1], 0, {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}),
        ([0, 1], 1, {"VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_NUM_THREADS": "1"}),
        ([0, 1, 2, 3], 0, {"VLLM_CPU_OMP_THREADS_BIND": "0,1", "OMP_NUM_THREADS": "2"}),
        ([0, 1, 2, 3, 4], 1, {"VLLM_CPU_OMP_THREADS_BIND": "3,4", "OMP_NUM_THREADS": "2"}),
    ],
)
def test_off_cpu_spread_gives_each_replica_its_slice(allowed, index, env):
    got = decide_placement(embedder(2), "CPU", index, allowed_cpus=allowed, environ={})
    assert got.env == env
    assert got.cpus == tuple(cpu_slice(allowed, index, 2))


def test_off_cpu_single_instance_takes_all():
    got = decide_placement(embedder(1), "CPU", 0, allowed_cpus={5, 6, 7}, environ={})
    assert got.env == {"VLLM_CPU_OMP_THREADS_BIND": "5,6,7", "OMP_NUM_THREADS": "3"}


def test_off_cpu_threads_bind_auto_leaves_vllm_defaults():
    got = decide_placement(embedder(2, "auto"), "CPU", 1, allowed_cpus=[0, 1, 2, 3], environ={})
    assert (got.env, got.cpus) == ({}, (0, 1, 2, 3))


def test_off_reports_the_nodes_of_its_cpus(tmp_path, node_sysfs):
    root = node_sysfs(tmp_path, {0: "0-3", 1: "4-7"})
    got = decide_placement(
        embedder(1), "CPU", 0, allowed_cpus=[2, 3, 4, 5], environ={}, numa_root=root
    )
    assert (got.numa_nodes, got.cpus, got.source, got.memory_node) == (
        (0, 1),
        (2, 3, 4, 5),
        "off",
        None,
    )
    assert got.labels() == {"numa_node": "0,1", "cpus": "2-5", "gpu": "none"}


# --- auto ----------------------------------------------------------------------------------


def test_auto_on_two_nodes_spreads_instances_and_slices_each_node(tmp_path, node_sysfs):
    root, plan = fake_host_plan(tmp_path, node_sysfs, {0: "0-3", 1: "4-7"})
    config = embedder(4, numa_placement="auto")
    got = [
        decide_placement(
            config, "CPU", i, allowed_cpus=range(8), environ={}, auto_plan=plan, numa_root=root
        )
        for i in range(4)
    ]
    assert [(p.numa_nodes, p.cpus) for p in got] == [
        ((0,), (0, 1)),
        ((0,), (2, 3)),
        ((1,), (4, 5)),
        ((1,), (6, 7)),
    ]
    assert got[3].env == {"VLLM_CPU_OMP_THREADS_BIND": "6,7", "OMP_NUM_THREADS": "2"}
    assert got[3].memory_node == 1


def test_auto_respects_the_process_cpus(tmp_path, node_sysfs):
    # a server started with numactl --cpunodebind=1 sees node 1's CPUs only
    root, plan = fake_host_plan(tmp_path, node_sysfs, {0: "0-3", 1: "4-7"})
    config = embedder(2, numa_placement="auto")
    got = [
        decide_placement(
            config, "CPU", i, allowed_cpus=[4, 5, 6, 7], environ={}, auto_plan=plan, numa_root=root
        )
        for i in range(2)
    ]
    assert [(p.numa_nodes, p.cpus) for p in got] == [((1,), (4, 5)), ((1,), (6, 7))]


def test_auto_cpu_keeps_sysfs_smt_siblings_together(tmp_path, node_sysfs):
    # one node of 8 CPUs where CPU c and c+4 are threads of one core
    siblings = {c: (c % 4, c % 4 + 4) for c in range(8)}
    root, plan = fake_host_plan(tmp_path, node_sysfs, {0: "0-7"}, siblings)
    config = embedder(2, "auto", numa_placement="auto")
    got = [
        decide_placement(
            config, "CPU", i, allowed_cpus=range(8), environ={}, auto_plan=plan, numa_root=root
        )
        for i in range(2)
    ]
    assert [p.cpus for p in got] == [(0, 1, 4, 5), (2, 3, 6, 7)]
    # placed CPUs become the engine's binding even with threads_bind=auto
    assert got[1].env == {"VLLM_CPU_OMP_THREADS_BIND": "2,3,6,7", "OMP_NUM_THREADS": "4"}


def test_auto_on_this_machine_equals_the_spread_slices():
    allowed = sorted(os.sched_getaffinity(0))
    config = embedder(2, numa_placement="auto")
    for i in range(2):
        placed = decide_placement(config, "CPU", i, environ={}, auto_plan=host_plan)
        assert list(placed.cpus) == cpu_slice(allowed, i, 2)


def test_auto_needs_the_host_plan():
    with pytest.raises(PlacementError, match="numa_placement=auto needs the host's plan"):
        decide_placement(embedder(numa_placement="auto"), "CPU", 0, allowed_cpus=[0], environ={})


# --- plan files ----------------------------------------------------------------------------


def write_plan(tmp_path, instances):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"plan": {"kind": "gpu", "instances": instances}}))
    return str(path)


def test_plan_file_for_gpu_instances_maps_visible_devices(tmp_path, node_sysfs):
    plan = write_plan(
        tmp_path,
        [
            {"index": 0, "numa_node": 1, "cpus": [4, 5], "gpu": 2},
            {"index": 1, "numa_node": 1, "cpus": [6, 7], "gpu": 2},
            {"index": 2, "numa_node": 0, "cpus": [0, 1], "gpu": 0},
        ],
    )
    root = node_sysfs(tmp_path / "s", {0: "0-3", 1: "4-7"})
    per_node = {"CUDA_VISIBLE_DEVICES": "2,3"}  # a per-node server: device 0 is GPU 2
    placed = decide_placement(
        embedder(2, numa_placement=plan),
        "GPU",
        1,
        0,
        allowed_cpus=range(8),
        environ=per_node,
        numa_root=root,
    )
    assert (placed.numa_nodes, placed.cpus, placed.gpu, placed.source) == ((1,), (6, 7), 2, plan)
    assert placed.env == {"CUDA_VISIBLE_DEVICES": "2"}
    with pytest.raises(PlacementError, match=r"no instance on GPU 3"):
        decide_placement(
            embedder(2, numa_placement=plan), "GPU", 0, 1, allowed_cpus=range(8), environ=per_node
        )


def test_plan_file_errors_are_clear(tmp_path):
    plan = write_plan(tmp_path, [{"index": 0, "numa_node": 0, "cpus": [0], "gpu": None}])
    with pytest.raises(PlacementError, match=r"has 1 CPU instance\(s\); instance 1 has no entry"):
        decide_placement(embedder(2, numa_placement=plan), "CPU", 1, allowed_cpus=[0, 1])
    with pytest.raises(PlacementError, match=r"CPUs 0 outside this process's CPUs 5"):
        decide_placement(embedder(1, numa_placement=plan), "CPU", 0, allowed_cpus=[5])
    missing = str(tmp_path / "missing.json")
    with pytest.raises(PlacementError, match=r"numa_placement plan .*missing.json"):
        decide_placement(embedder(1, numa_placement=missing), "CPU", 0, allowed_cpus=[0])


def test_plan_file_that_is_not_an_object_or_for_gpus_is_named(tmp_path):
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2]")
    with pytest.raises(PlacementError, match=r"list\.json: not a JSON object"):
        decide_placement(embedder(numa_placement=str(bad)), "CPU", 0, allowed_cpus=[0])
    gpu_plan = write_plan(tmp_path, [{"index": 0, "numa_node": 0, "cpus": [0], "gpu": 0}])
    with pytest.raises(PlacementError, match="plan is for a GPU host"):
        decide_placement(embedder(numa_placement=gpu_plan), "CPU", 0, allowed_cpus=[0, 1])


def test_plan_entry_of_a_gpu_wraps_around_its_instances():
    plan = {"instances": [{"gpu": 1, "cpus": [0]}, {"gpu": 1, "cpus": [1]}, {"gpu": 0}]}
    assert plan_entry(plan, "GPU", 3, 1) == {"gpu": 1, "cpus": [1]}


# --- CUDA_VISIBLE_DEVICES, nodes, the log line ----------------------------------------------


def test_visible_gpu():
    assert visible_gpu(1, None) == 1
    assert visible_gpu(1, "") == 1
    assert visible_gpu(1, "4,6") == 6
    assert visible_gpu(0, " 4 , 6 ") == 4
    for value, device in (("GPU-8f3a", 0), ("4,6", 2), ("MIG-1,2", 0)):
        with pytest.raises(PlacementError) as info:
            visible_gpu(device, value)
        assert str(info.value) == (
            f"device {device} is not a GPU number in CUDA_VISIBLE_DEVICES={value!r}; set it "
            "to GPU numbers (not UUIDs), one per visible device"
        )


def test_nodes_of():
    assert nodes_of([3, 4], {0: (0, 1, 2, 3), 1: (4, 5)}) == (0, 1)
    assert nodes_of([3], {}) == ()


def test_describe_is_the_log_line():
    placed = InstancePlacement((0,), (0, 1, 2, 5), None, "auto", bound_memory=True)
    assert placed.describe() == "placement (auto): NUMA node 0, CPUs 0-2,5, memory bound to node 0"
    gpu = InstancePlacement((0,), (0, 1), 2, "off")
    assert gpu.describe() == "placement (off): NUMA node 0, CPUs 0-1, GPU 2"


def test_config_parses_placement_price_and_window(make_config, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    cfg = EmbedderConfig.from_model_config(
        make_config(
            {"numa_placement": "plan.json", "hourly_price_usd": "1.25", "cost_window_s": "30"}
        ),
        tmp_path,
    )
    assert (cfg.numa_placement, cfg.hourly_price_usd, cfg.cost_window_s) == (
        str(plan.resolve()),
        1.25,
        30.0,
    )
    cfg = EmbedderConfig.from_model_config(make_config({}))
    # The default is the shipped config's: auto.
    assert (cfg.numa_placement, cfg.hourly_price_usd, cfg.cost_window_s) == ("auto", 0.0, 60.0)
    assert (
        EmbedderConfig.from_model_config(make_config({"numa_placement": "off"})).numa_placement
        == "off"
    )
    for params, message in (
        (
            {"numa_placement": "nowhere.json"},
            "numa_placement='nowhere.json' is not off, auto or a plan file",
        ),
        ({"hourly_price_usd": "-1"}, "hourly_price_usd=-1.0 must be >= 0"),
        ({"hourly_price_usd": "cheap"}, "hourly_price_usd='cheap' is not a number"),
        ({"hourly_price_usd": "inf"}, "hourly_price_usd='inf' must be a finite number"),
        ({"hourly_price_usd": "nan"}, "hourly_price_usd='nan' must be a finite number"),
        ({"cost_window_s": "0"}, "cost_window_s=0.0 must be in"),
    ):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            EmbedderConfig.from_model_config(make_config(params), tmp_path)
