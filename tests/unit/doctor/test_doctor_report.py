"""doctor.report: the text report of a host and its plan."""

from __future__ import annotations

from doctor_hosts import asus_host, capture, h200_host
from triton_embed_server.host.doctor import build_host, plan_placement, render_report
from triton_embed_server.host.topology import parse_p2p, parse_topo_matrix


def missing_lines(report: str, *lines: str) -> list[str]:
    """Those of ``lines`` that are not whole lines of ``report``."""
    have = set(report.splitlines())
    return [line for line in lines if line not in have]


def test_report_without_smt_says_one_thread_per_core():
    host = asus_host()
    report = render_report(host, plan_placement(host, instances_per_gpu=2))
    assert (
        "  CPU slices are whole physical cores (one thread per core); "
        "cores from lscpu (1 thread per core)"
    ) in report.splitlines()


def test_report_of_asus_host():
    host = asus_host()
    report = render_report(host, plan_placement(host, instances_per_gpu=2))
    assert not missing_lines(
        report,
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
    )


def test_report_of_nvswitch_host_summarises_all_pairs():
    host = h200_host()
    report = render_report(host, plan_placement(host))
    assert not missing_lines(
        report,
        "  NVLink (NV#): all 28 pairs (NV18)",
        "  across the SMP interconnect between NUMA nodes (SYS): none",
        "Placement plan (4 instance(s) per GPU):",
        "    instance 0: GPU 0, CPUs 0-3,128-131",
        "    instance 31: GPU 7, CPUs 124-127,252-255",
    )


def test_report_names_p2p_problems():
    topo = parse_topo_matrix(
        "        GPU0    GPU1    CPU Affinity    NUMA Affinity\n"
        "GPU0     X      PIX     0-7     0\nGPU1    PIX      X      0-7     0\n"
    )
    host = build_host(topo=topo, p2p=parse_p2p(capture("p2p_r_02.txt")))
    report = render_report(host, plan_placement(host, instances_per_gpu=1))
    assert "Peer-to-peer (nvidia-smi topo -p2p): GPU0-GPU1 CNS (Chipset not supported)" in report
