"""NUMA placement of embedder instances: the decision (off / auto / a plan file) against fake
and real sysfs, and its application (CPU affinity, memory binding) in child processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from triton_embed_server.config import EmbedderConfig
from triton_embed_server.engine import cpu_slice, engine_environment
from triton_embed_server.placement import (
    InstancePlacement,
    PlacementError,
    nodes_of,
    plan_entry,
    resolve,
    visible_gpu,
)


def test_auto_on_two_nodes_spreads_instances_and_slices_each_node(tmp_path, node_sysfs):
    root = node_sysfs(tmp_path, {0: "0-3", 1: "4-7"})
    got = [resolve("auto", "CPU", i, 4, 0, range(8), range(8), root) for i in range(4)]
    assert [(p.numa_nodes, p.cpus) for p in got] == [
        ((0,), (0, 1)),
        ((0,), (2, 3)),
        ((1,), (4, 5)),
        ((1,), (6, 7)),
    ]
    assert got[0].labels() == {"numa_node": "0", "cpus": "0-1", "gpu": "none"}


def test_auto_respects_the_process_cpus(tmp_path, node_sysfs):
    # a server started with numactl --cpunodebind=1 sees node 1's CPUs only
    root = node_sysfs(tmp_path, {0: "0-3", 1: "4-7"})
    got = [resolve("auto", "CPU", i, 2, 0, [4, 5, 6, 7], [4, 5, 6, 7], root) for i in range(2)]
    assert [(p.numa_nodes, p.cpus) for p in got] == [((1,), (4, 5)), ((1,), (6, 7))]


def test_auto_cpu_keeps_sysfs_smt_siblings_together(tmp_path, monkeypatch, node_sysfs):
    # one node of 8 CPUs where CPU c and c+4 are threads of one core (sysfs cpu topology)
    from triton_embed import topology

    monkeypatch.setattr(
        topology,
        "read_sysfs_cpu_siblings",
        lambda root=None: {c: (c % 4, c % 4 + 4) for c in range(8)},
    )
    root = node_sysfs(tmp_path, {0: "0-7"})
    got = [resolve("auto", "CPU", i, 2, 0, range(8), range(8), root) for i in range(2)]
    assert [p.cpus for p in got] == [(0, 1, 4, 5), (2, 3, 6, 7)]


def test_auto_on_this_machine_equals_the_spread_slices():
    allowed = sorted(os.sched_getaffinity(0))
    for i in range(2):
        placed = resolve("auto", "CPU", i, 2, 0, allowed, allowed)
        assert list(placed.cpus) == cpu_slice(allowed, i, 2)


def test_off_keeps_the_spread_slice_and_reports_its_nodes(tmp_path, node_sysfs):
    root = node_sysfs(tmp_path, {0: "0-3", 1: "4-7"})
    placed = resolve("off", "CPU", 1, 2, 0, range(8), [3, 4], root)
    assert placed == InstancePlacement((0, 1), (3, 4), None, "off")
    assert placed.labels()["numa_node"] == "0,1"


def write_plan(tmp_path, instances):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"plan": {"kind": "gpu", "instances": instances}}))
    return str(path)


def test_plan_file_for_gpu_instances_maps_visible_devices(tmp_path, monkeypatch, node_sysfs):
    plan = write_plan(
        tmp_path,
        [
            {"index": 0, "numa_node": 1, "cpus": [4, 5], "gpu": 2},
            {"index": 1, "numa_node": 1, "cpus": [6, 7], "gpu": 2},
            {"index": 2, "numa_node": 0, "cpus": [0, 1], "gpu": 0},
        ],
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # a per-node server: device 0 is GPU 2
    placed = resolve(
        plan, "GPU", 1, 2, 0, range(8), range(8), node_sysfs(tmp_path / "s", {0: "0-3", 1: "4-7"})
    )
    assert (placed.numa_nodes, placed.cpus, placed.gpu, placed.source) == ((1,), (6, 7), 2, plan)
    with pytest.raises(PlacementError, match=r"no instance on GPU 3"):
        resolve(plan, "GPU", 0, 2, 1, range(8), range(8), tmp_path / "s")


def test_plan_file_errors_are_clear(tmp_path):
    plan = write_plan(tmp_path, [{"index": 0, "numa_node": 0, "cpus": [0], "gpu": None}])
    with pytest.raises(PlacementError, match=r"has 1 CPU instance\(s\); instance 1 has no entry"):
        resolve(plan, "CPU", 1, 2, 0, [0, 1], [0, 1])
    with pytest.raises(PlacementError, match=r"CPUs 0 outside this process's CPUs 5"):
        resolve(plan, "CPU", 0, 1, 0, [5], [5])
    with pytest.raises(PlacementError, match=r"numa_placement plan .*missing.json"):
        resolve(str(tmp_path / "missing.json"), "CPU", 0, 1, 0, [0], [0])


def test_visible_gpu():
    assert visible_gpu(1, None) == 1
    assert visible_gpu(1, "4,6") == 6
    with pytest.raises(PlacementError, match="GPU numbers"):
        visible_gpu(0, "GPU-8f3a")
    assert plan_entry({"instances": [{"gpu": 1, "cpus": []}]}, "GPU", 5, 1) == {
        "gpu": 1,
        "cpus": [],
    }


def test_nodes_of():
    assert nodes_of([3, 4], {0: (0, 1, 2, 3), 1: (4, 5)}) == (0, 1)
    assert nodes_of([3], {}) == ()


def test_engine_environment_takes_planned_cpus_and_visible_devices():
    config = EmbedderConfig(model_path=Path("/x"), max_length=8, instances_per_device=2)
    assert engine_environment(config, 1, "CPU", 0, [0, 1, 2, 3], planned_cpus=[6, 5]) == {
        "VLLM_CPU_OMP_THREADS_BIND": "5,6",
        "OMP_NUM_THREADS": "2",
    }
    assert engine_environment(config, 0, "GPU", 1, [], cuda_visible_devices="2,3") == {
        "CUDA_VISIBLE_DEVICES": "3"
    }


def run_child(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/sys/devices/system/node/node0").exists(), reason="no NUMA sysfs")
def test_apply_pins_cpus_and_binds_memory_in_a_child_process():
    cpu = sorted(os.sched_getaffinity(0))[-1]
    got = run_child(
        "import json, os, mmap\n"
        "from triton_embed_server.placement import InstancePlacement, apply\n"
        f"p = apply(InstancePlacement((0,), ({cpu},), None, 'auto'))\n"
        "m = mmap.mmap(-1, 1 << 20); m.write(b'x' * (1 << 20))  # a new mapping after binding\n"
        "maps = open('/proc/self/numa_maps').read()\n"
        "print(json.dumps({'bound': p.bound_memory, 'affinity': sorted(os.sched_getaffinity(0)),"
        " 'bind_lines': maps.count('bind:0')}))\n"
    )
    assert got["affinity"] == [cpu]
    assert got["bound"] is True
    assert got["bind_lines"] >= 1  # the kernel reports the MPOL_BIND policy on node 0


def test_apply_off_does_not_bind_memory():
    got = run_child(
        "import json\n"
        "from triton_embed_server.placement import InstancePlacement, apply\n"
        "p = apply(InstancePlacement((0,), (), None, 'off'))\n"
        "print(json.dumps({'bound': p.bound_memory}))\n"
    )
    assert got == {"bound": False}


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
    assert (cfg.numa_placement, cfg.hourly_price_usd, cfg.cost_window_s) == ("off", 0.0, 60.0)
    assert (
        EmbedderConfig.from_model_config(make_config({"numa_placement": "auto"})).numa_placement
        == "auto"
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


def test_plan_file_that_is_not_an_object_or_for_gpus_is_named(tmp_path):
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2]")
    with pytest.raises(PlacementError, match=r"list\.json: not a JSON object"):
        resolve(str(bad), "CPU", 0, 1, 0, [0], [0])
    gpu_plan = write_plan(tmp_path, [{"index": 0, "numa_node": 0, "cpus": [0], "gpu": 0}])
    with pytest.raises(PlacementError, match="plan is for a GPU host"):
        resolve(gpu_plan, "CPU", 0, 1, 0, [0, 1], [0, 1])
