"""doctor.pod and ``triton-embed doctor --in-pod``: a container's CPUs, memory and GPUs."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from doctor_hosts import capture, fake_runner
from triton_embed.cli import main
from triton_embed_server.host.doctor import (
    COMMANDS,
    CommandOutput,
    HostGpu,
    check_pod,
    judge_alignment,
    render_pod_check,
)
from triton_embed_server.host.doctor import command as doctor_command
from triton_embed_server.host.doctor.pod import (
    GUARANTEED_FIX,
    KUBELET_FIX,
    MEMORY_FIX,
    read_container_cpus,
    read_memory_nodes,
)
from triton_embed_server.host.topology import TopologyParseError

# The ASUS host of topo_m_06: node 0 = CPUs 0-31 with GPU0, GPU1; node 1 = 32-63, GPU2, GPU3
ASUS_NODES = {0: "0-31", 1: "32-63"}
NO_SMI = {COMMANDS["topo_m"]: CommandOutput(None, "not available: nvidia-smi not found on PATH")}


def fake_pod(
    root: Path,
    node_sysfs,
    *,
    cpuset: str | None = None,
    mems: str | None = "0",
    cgroup: str = "0::/kubepods/pod1/ctr\n",
    cpuset_file: str = "cgroup/kubepods/pod1/ctr/cpuset.cpus.effective",
    nodes: dict[int, str] = ASUS_NODES,
) -> dict:
    """Fake /proc, /sys/fs/cgroup and /sys/devices/system/node; the ``check_pod`` roots."""
    proc = root / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    status = "Name:\tpython\nCpus_allowed_list:\t0-63\n"
    if mems is not None:
        status += f"Mems_allowed:\t00000003\nMems_allowed_list:\t{mems}\n"
    (proc / "self" / "status").write_text(status)
    if cpuset is not None:
        path = root / cpuset_file
        path.parent.mkdir(parents=True)
        path.write_text(cpuset + "\n")
    return {
        "proc_root": proc,
        "cgroup_root": root / "cgroup",
        "node_root": node_sysfs(root / "node", nodes),
        "pci_root": root / "pci",
    }


def smi(name: str = "topo_m_06.txt"):
    return fake_runner({COMMANDS["topo_m"]: CommandOutput(capture(name), "ok")}, [])


def test_aligned_gpu_pod_on_node_0(tmp_path, node_sysfs):
    roots = fake_pod(tmp_path, node_sysfs, cpuset="2-17", mems="0")
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    check = check_pod(**roots, env=env, run=smi(), affinity=lambda: range(64))
    assert check.aligned and check.verdict == "ALIGNED" and check.numa_node == 0
    assert check.cpus == tuple(range(2, 18))
    assert check.cpus_source.endswith("kubepods/pod1/ctr/cpuset.cpus.effective")
    assert check.memory_nodes == (0,)
    assert [(g.name, g.numa_node) for g in check.gpus] == [("GPU0", 0), ("GPU1", 0)]
    assert check.problems == () and check.fixes == () and check.notes == ()
    text = render_pod_check(check)
    assert text.startswith("triton-embed doctor --in-pod: ALIGNED on NUMA node 0\n")
    assert "  GPUs             GPU0 on node 0, GPU1 on node 0 from nvidia-smi topo -m" in text


def test_gpu_on_the_other_node_is_not_aligned(tmp_path, node_sysfs):
    # nvidia-smi shows all four GPUs (no CUDA_VISIBLE_DEVICES): GPU2 and GPU3 are on node 1
    roots = fake_pod(tmp_path, node_sysfs, cpuset="0-15", mems="0")
    check = check_pod(**roots, env={}, run=smi(), affinity=lambda: range(64))
    assert not check.aligned and check.verdict == "NOT ALIGNED"
    assert check.problems == (
        "GPU2 is on NUMA node 1, the CPUs on node 0",
        "GPU3 is on NUMA node 1, the CPUs on node 0",
        "GPUs straddle NUMA nodes: node 0 (GPU0, GPU1), node 1 (GPU2, GPU3)",
    )
    assert KUBELET_FIX in check.fixes
    text = render_pod_check(check)
    assert text.startswith("triton-embed doctor --in-pod: NOT ALIGNED\n")
    assert "Straddles:\n  - GPU2 is on NUMA node 1, the CPUs on node 0" in text
    assert "\nFix:\n" in text


def test_cpus_straddling_nodes_and_the_whole_host(tmp_path, node_sysfs):
    roots = fake_pod(tmp_path / "a", node_sysfs, cpuset="28-35", mems="0-1")
    check = check_pod(**roots, env={}, run=fake_runner(NO_SMI, []), affinity=lambda: [])
    assert not check.aligned
    assert check.problems == ("CPUs straddle NUMA nodes: node 0 (CPUs 28-31), node 1 (CPUs 32-35)",)
    assert check.cpus_by_node == {0: (28, 29, 30, 31), 1: (32, 33, 34, 35)}
    # every CPU of the host: the shared pool, no exclusive CPUs
    roots = fake_pod(tmp_path / "b", node_sysfs, cpuset="0-63", mems="0-1")
    check = check_pod(**roots, env={}, run=fake_runner(NO_SMI, []), affinity=lambda: [])
    assert "no exclusive CPUs" in check.problems[1]
    assert check.fixes == (KUBELET_FIX, GUARANTEED_FIX)


def test_memory_nodes(tmp_path, node_sysfs):
    cpus = list(range(32, 40))
    wrong = judge_alignment({0: range(32), 1: range(32, 64)}, cpus, [0], [])
    assert not wrong.aligned
    assert wrong.problems == ("memory may come only from node(s) 0, the CPUs are on node 1",)
    assert wrong.fixes == (MEMORY_FIX,)
    loose = judge_alignment({0: range(32), 1: range(32, 64)}, cpus, [0, 1], [])
    assert loose.aligned and loose.numa_node == 1
    assert "memory may come from nodes 0-1: the kubelet does not bind it" in loose.notes[0]
    unknown = fake_pod(tmp_path, node_sysfs, cpuset="0-3", mems=None)
    check = check_pod(**unknown, env={}, run=fake_runner(NO_SMI, []), affinity=lambda: [])
    assert check.aligned and check.memory_nodes is None
    assert any("memory nodes unknown" in n for n in check.notes)


def test_cgroup_v1_and_affinity_fallback(tmp_path, node_sysfs):
    v1 = fake_pod(
        tmp_path / "v1",
        node_sysfs,
        cpuset="40-47",
        mems="1",
        cgroup="4:memory:/kubepods/x\n3:cpuset:/kubepods/x\n",
        cpuset_file="cgroup/cpuset/kubepods/x/cpuset.effective_cpus",
    )
    cpus, source = read_container_cpus(v1["proc_root"], v1["cgroup_root"], lambda: [0])
    assert cpus == tuple(range(40, 48)) and source.endswith(
        "cpuset/kubepods/x/cpuset.effective_cpus"
    )
    check = check_pod(**v1, env={}, run=fake_runner(NO_SMI, []), affinity=lambda: [0])
    assert check.aligned and check.numa_node == 1
    # a container with its own cgroup namespace: its cgroup at the root
    ns = fake_pod(
        tmp_path / "ns", node_sysfs, cpuset="4-7", cpuset_file="cgroup/cpuset.cpus.effective"
    )
    assert read_container_cpus(ns["proc_root"], ns["cgroup_root"], lambda: [0])[0] == (4, 5, 6, 7)
    bare = fake_pod(tmp_path / "bare", node_sysfs)
    cpus, source = read_container_cpus(bare["proc_root"], bare["cgroup_root"], lambda: {9, 8})
    assert (cpus, source) == ((8, 9), "sched_getaffinity (no cgroup cpuset file)")
    assert read_memory_nodes(bare["proc_root"])[0] == (0,)


def test_gpus_from_the_driver_and_sysfs_without_nvidia_smi(tmp_path, node_sysfs):
    roots = fake_pod(tmp_path, node_sysfs, cpuset="0-7", mems="0")
    for address, node in (("0000:C1:00.0", "1"), ("0000:41:00.0", "0"), ("0000:81:00.0", "-1")):
        (roots["proc_root"] / "driver" / "nvidia" / "gpus" / address).mkdir(parents=True)
        (roots["pci_root"] / address.lower()).mkdir(parents=True)
        (roots["pci_root"] / address.lower() / "numa_node").write_text(node + "\n")
    check = check_pod(**roots, env={}, run=fake_runner(NO_SMI, []), affinity=lambda: [])
    # PCI bus order: 41 -> GPU0 (node 0), 81 -> GPU1 (unknown), c1 -> GPU2 (node 1)
    assert [(g.name, g.numa_node) for g in check.gpus] == [
        ("GPU0", 0),
        ("GPU1", None),
        ("GPU2", 1),
    ]
    assert check.problems[0] == "GPU1: NUMA node unknown (unknown), cannot be checked"
    assert check.problems[1] == "GPU2 is on NUMA node 1, the CPUs on node 0"
    only0 = check_pod(
        **roots, env={"CUDA_VISIBLE_DEVICES": "0"}, run=fake_runner(NO_SMI, []), affinity=list
    )
    assert only0.aligned and [g.name for g in only0.gpus] == ["GPU0"]


def test_cuda_visible_devices_forms(tmp_path, node_sysfs):
    roots = fake_pod(tmp_path, node_sysfs, cpuset="0-7", mems="0")

    def check(value: str):
        return check_pod(**roots, env={"CUDA_VISIBLE_DEVICES": value}, run=smi(), affinity=list)

    assert check("").gpus == () and check("").aligned
    assert "hides every GPU" in check("-1").notes[0]
    uuid = check("GPU-8e6b4f6a-0000-0000-0000-000000000000")
    assert len(uuid.gpus) == 4 and "names GPUs by UUID or MIG" in uuid.notes[0]
    order = check("1,0")
    assert [g.name for g in order.gpus] == ["GPU1", "GPU0"] and order.aligned
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in order.notes[0]
    assert "no GPU 7 here" in check("0,7").notes[0]


def test_one_numa_node_is_always_aligned(tmp_path, node_sysfs):
    roots = fake_pod(tmp_path, node_sysfs, cpuset="0-3", mems="0", nodes={0: "0-15"})
    # the single-GPU H200 capture: GPU0 on node 0
    check = check_pod(**roots, env={}, run=smi("../topology_h200/topo_m.txt"), affinity=list)
    assert check.aligned and check.numa_node == 0
    assert check.notes[-1] == "the host has one NUMA node: nothing can straddle nodes"
    lost = judge_alignment({0: range(16)}, range(4), [0], [HostGpu(0, "GPU0", None, "unknown", ())])
    assert lost.aligned


def test_missing_numa_sysfs_is_an_error(tmp_path):
    with pytest.raises(TopologyParseError, match="needs the host's NUMA nodes"):
        check_pod(node_root=tmp_path / "none", proc_root=tmp_path, cgroup_root=tmp_path)


def test_cli_in_pod_exit_codes_and_json(tmp_path, node_sysfs, monkeypatch, capsys):
    good = fake_pod(tmp_path / "good", node_sysfs, cpuset="32-47", mems="1")
    bad = fake_pod(tmp_path / "bad", node_sysfs, cpuset="24-39", mems="0-1")
    for roots, rc, verdict in ((good, 0, "ALIGNED"), (bad, 1, "NOT ALIGNED")):
        fake = functools.partial(
            check_pod, **roots, env={}, run=fake_runner(NO_SMI, []), affinity=list
        )
        monkeypatch.setattr(doctor_command, "check_pod", fake)
        assert main(["doctor", "--in-pod"]) == rc
        assert capsys.readouterr().out.startswith(f"triton-embed doctor --in-pod: {verdict}")
        assert main(["doctor", "--check-pod", "--json"]) == rc
        payload = json.loads(capsys.readouterr().out)
        assert payload["verdict"] == verdict and payload["aligned"] is (rc == 0)
    assert payload["cpus"]["by_numa_node"] == {"0": "24-31", "1": "32-39"}
    assert payload["fixes"][0].startswith("kubelet: cpuManagerPolicy: static")


def test_cli_in_pod_excludes_host_flags(tmp_path, capsys):
    assert main(["doctor", "--in-pod", "--from-dir", str(tmp_path)]) == 1
    assert "--from-dir and --chart-values do not apply" in capsys.readouterr().err


def test_cli_in_pod_on_this_machine(capsys):
    rc = main(["doctor", "--in-pod", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert rc == (0 if payload["aligned"] else 1)
    assert payload["cpus"]["count"] >= 1
