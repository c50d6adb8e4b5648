"""doctor.gather: running the topology commands (faked) or reading a capture folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from doctor_hosts import (
    assert_no_shared_core,
    asus_host,
    capture,
    fake_runner,
    instances,
    no_gpu_runner,
    runpod_host,
    runpod_live,
    span,
    write_capture,
)
from triton_embed_server.host.doctor import (
    COMMANDS,
    SYSFS_SIBLINGS,
    CommandOutput,
    gather_host,
    plan_placement,
    render_report,
    run_command,
)
from triton_embed_server.host.topology import TopologyParseError


def test_gather_without_nvidia_smi_or_numactl_falls_back_to_sysfs(tmp_path, node_sysfs):
    calls: list = []
    run = fake_runner(
        {
            COMMANDS["topo_m"]: CommandOutput(None, "not available: nvidia-smi not found on PATH"),
            COMMANDS["lscpu"]: CommandOutput(capture("lscpu_01.txt"), "ok"),
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
            COMMANDS["topo_m"]: CommandOutput(capture("topo_m_06.txt"), "ok"),
            COMMANDS["p2p"]: CommandOutput(p2p4, "ok"),
            COMMANDS["lscpu"]: CommandOutput(capture("lscpu_01.txt"), "ok"),
            COMMANDS["numactl"]: CommandOutput(capture("numactl_01.txt"), "ok"),
        },
        calls,
    )
    host = gather_host(run=run, sysfs_root=tmp_path / "absent", process_cpus=lambda: range(64))
    assert [c[0] for c in calls] == [
        ("nvidia-smi", "topo", "-m"),
        ("nvidia-smi", "topo", "-p2p", "w"),
        ("lscpu",),
        ("numactl", "--hardware"),
    ]
    assert host.p2p.mode == "w" and host.p2p.all_ok
    assert "sysfs" not in host.sources
    assert plan_placement(host).to_dict() == plan_placement(asus_host()).to_dict()


def test_gather_live_sysfs_missing_too(tmp_path):
    run = fake_runner(
        {
            COMMANDS["topo_m"]: CommandOutput(None, "not available: nvidia-smi not found on PATH"),
            COMMANDS["lscpu"]: CommandOutput(capture("lscpu_05.txt"), "ok"),
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


def test_gather_from_dir_without_the_gpu_matrix_warns_it_planned_a_cpu_only_host(tmp_path):
    folder = write_capture(tmp_path / "cpu", lscpu="lscpu_01.txt")
    host = gather_host(folder)
    assert host.gpus == ()
    assert host.warnings[-1] == (
        f"no {folder / 'topo_m.txt'}: planned as a CPU-only host; if the host has GPUs, "
        "add the output of `nvidia-smi topo -m` there"
    )
    assert render_report(host, plan_placement(host, instances_per_gpu=2)).count("CPU-only") >= 1


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
