"""doctor.command through ``triton-embed doctor``: report, JSON, plan file, errors."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from doctor_hosts import H200_CAPTURES, asus_host, runpod_host, write_capture
from triton_embed.cli import main
from triton_embed_server.host.doctor import CAPTURE_FILES, gather_host, plan_placement


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
    assert main(["doctor", "--from-dir", str(folder), "--instances-per-gpu", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("triton-embed doctor\n")
    lines = out.splitlines()
    assert "Placement plan (1 instance(s) per GPU):" in lines
    # two GPUs on each node of 24 cores: 12 whole cores each
    assert "    instance 0: GPU 0, CPUs 0-11,48-59" in lines
    assert "    instance 3: GPU 3, CPUs 36-47,84-95" in lines
    assert "  PCIe switch, no CPU (PIX/PXB): GPU0-GPU1 (PXB), GPU2-GPU3 (PIX)" in lines


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
    for flag in ("--instances-per-gpu", "--cpu-instances"):
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


def test_doctor_on_a_captured_h200_host(capsys):
    """Outputs captured on a host with one H200 (driver 580.159.04, 1 NUMA node, 16 CPUs):
    single-GPU matrix layout, p2p w, numactl, lscpu."""
    assert main(["doctor", "--json", "--from-dir", str(H200_CAPTURES)]) == 0
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


def test_cli_help_names_every_capture_file(capsys):
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(name in help_text for name in CAPTURE_FILES.values())
