"""doctor.chart and ``triton-embed doctor --chart-values``: Helm values from a host's plan."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from doctor_hosts import (
    CAPTURES,
    H200_CAPTURES,
    asus_host,
    capture,
    runpod_host,
    write_capture,
)
from triton_embed.cli import main
from triton_embed_server.host.doctor import (
    HostGpu,
    build_host,
    chart_values,
    gather_host,
    plan_placement,
    render_chart_values,
)
from triton_embed_server.host.topology import parse_topo_matrix

CHART_KEYS = {
    "triton": {"replicas", "resources", "gpusPerPod", "instancesPerGpu", "hourlyPriceUsd"},
    "numa": {"singleNumaNode", "podsPerNode"},
}


def values_of(host, **plan_args):
    return chart_values(host, plan_placement(host, **plan_args))


def test_asus_two_pods_one_per_numa_node_with_memory_from_numactl():
    # 2 x EPYC 9374F, 1 thread per core, nodes 0-31 and 32-63 (193129 / 193477 MiB), 2 GPUs each
    values = values_of(asus_host())
    assert values.values() == {
        "triton": {
            "replicas": 2,
            "resources": {"cpu": 31, "memory": "178Gi"},
            "gpusPerPod": 2,
            "instancesPerGpu": 4,
            "hourlyPriceUsd": 0,
        },
        "numa": {"singleNumaNode": True, "podsPerNode": 2},
    }
    # held back per node: its first core and max(2 GiB, 5% of 188.6 GiB) = 10 GiB;
    # (193129 MiB - 10 GiB) // 1024 = 178
    nodes = [n.to_dict() for n in values.nodes]
    assert [(n["numa_node"], n["held_back_cpus"], n["held_back_gib"]) for n in nodes] == [
        (0, "0", 10),
        (1, "32", 10),
    ]
    assert [n["gpus"] for n in nodes] == [[0, 1], [2, 3]]
    assert values.memory_source == "numactl --hardware"
    assert values.warnings == ()
    kubelet = values.kubelet()
    assert kubelet["reservedSystemCPUs"] == "0"
    assert kubelet["topologyManagerPolicy"] == "single-numa-node"
    assert kubelet["topologyManagerScope"] == "pod"
    assert kubelet["reservedMemory"] == [{"numaNode": 0, "limits": {"memory": "10Gi"}}]
    # the static memory manager's rule: reservedMemory sums to kube + system + eviction
    reserved = (
        int(kubelet["kubeReserved"]["memory"][:-2])
        + int(kubelet["systemReserved"]["memory"][:-2])
        + int(kubelet["evictionHard"]["memory.available"][:-2])
    )
    assert reserved == 10 * 1024


def test_rendered_yaml_is_exactly_the_chart_keys_with_comments():
    values = values_of(asus_host())
    text = render_chart_values(values)
    loaded = yaml.safe_load(text)
    assert loaded == values.values()
    assert {k: set(v) for k, v in loaded.items()} == CHART_KEYS
    assert set(loaded["triton"]["resources"]) == {"cpu", "memory"}
    assert isinstance(loaded["triton"]["resources"]["cpu"], int)
    lines = text.splitlines()
    assert lines[0].startswith("# Helm values for this host (chart deploy/helm/triton-embed)")
    assert '#   reservedSystemCPUs: "0"' in lines
    assert any("separate replicas" in line and "tensor-parallel" in line for line in lines)


def test_the_example_in_docs_kubernetes_md_is_the_doctors_output():
    doc = (CAPTURES.parents[2] / "docs" / "kubernetes.md").read_text()
    block = doc.split("```yaml\n# Helm values for this host", 1)[1].split("```", 1)[0]
    assert "# Helm values for this host" + block == render_chart_values(values_of(asus_host()))


def test_runpod_smt_pods_take_whole_cores_and_memory_is_assumed_with_a_warning():
    # 24 cores x 2 threads per node (0-23,48-71): 23 cores after the held-back one = 46 CPUs
    values = values_of(runpod_host(), instances_per_gpu=2)
    triton = values.values()["triton"]
    assert triton["resources"] == {"cpu": 46, "memory": "184Gi"}  # 46 x 4 GiB
    assert (triton["gpusPerPod"], triton["instancesPerGpu"]) == (2, 2)
    assert values.kubelet()["reservedSystemCPUs"] == "0,48"
    assert [n.held_back_cpus for n in values.nodes] == [(0, 48), (24, 72)]
    assert values.memory_source == "assumed: 4 GiB per CPU"
    assert "reservedMemory" not in values.kubelet()
    assert len(values.warnings) == 1 and "memory is unknown" in values.warnings[0]


def test_unequal_gpu_nodes_give_equal_pods_of_the_gcd():
    # topo_m_01: 6 GPUs on node 0 (0-15,32-47), 2 on node 1: pods of 2 GPUs, 3 + 1 of them
    host = build_host(topo=parse_topo_matrix(capture("topo_m_01.txt")))
    values = values_of(host, instances_per_gpu=2)
    assert [(n.numa_node, n.pods, n.gpus) for n in values.nodes] == [
        (0, 3, (0, 1, 2, 3, 4, 5)),
        (1, 1, (6, 7)),
    ]
    # node 0: 16 cores (c, c+32 inferred siblings), 1 held back, 15 // 3 = 5 cores = 10 CPUs
    assert [n.cpus_per_pod for n in values.nodes] == [10, 30]
    v = values.values()
    assert (v["numa"]["podsPerNode"], v["triton"]["gpusPerPod"]) == (4, 2)
    assert v["triton"]["resources"]["cpu"] == 10
    assert any("different numbers of GPUs (node 0: 6, node 1: 2)" in w for w in values.warnings)


def test_one_numa_node_holds_back_twice_and_warns_about_small_memory():
    # the captured H200 host: 1 node, 16 CPUs (1 thread per core), 5851 MiB
    host = gather_host(H200_CAPTURES)
    values = values_of(host)
    assert values.nodes[0].held_back_cpus == (0, 1)
    assert values.nodes[0].held_back_gib == 4
    assert values.values()["triton"]["resources"] == {"cpu": 14, "memory": "1Gi"}
    assert values.values()["numa"]["podsPerNode"] == 1
    # the kubelet takes one share; the other is the headroom for other pods
    assert values.kubelet()["reservedSystemCPUs"] == "0"
    assert values.kubelet()["reservedMemory"] == [{"numaNode": 0, "limits": {"memory": "2Gi"}}]
    assert any("below 6 GiB" in w for w in values.warnings)


def test_reserved_cores_and_unknown_gpu_nodes():
    host = asus_host()
    assert values_of(host, instances_per_gpu=1).cpus_per_pod == 31
    plan = plan_placement(host, instances_per_gpu=1)
    assert chart_values(host, plan, reserved_cores=4).cpus_per_pod == 28
    with pytest.raises(ValueError, match="after the 32 held back for the system there are 0"):
        chart_values(host, plan, reserved_cores=32)
    with pytest.raises(ValueError, match="reserved_cores must be >= 1"):
        chart_values(host, plan, reserved_cores=0)
    lost = dataclasses.replace(
        host, gpus=tuple(HostGpu(g.index, g.name, None, "unknown", ()) for g in host.gpus)
    )
    with pytest.raises(ValueError, match="no GPU has a known NUMA node"):
        values_of(lost)
    half = dataclasses.replace(
        host,
        gpus=tuple(
            g if g.numa_node == 0 else HostGpu(g.index, g.name, None, "unknown", ())
            for g in host.gpus
        ),
    )
    values = values_of(half)
    assert values.pods_per_host == 1 and values.gpus_per_pod == 2
    assert any("GPU(s) 2, 3: NUMA node unknown" in w for w in values.warnings)


def test_cli_chart_values_to_stdout_for_a_cpu_only_host(tmp_path, capsys):
    # numactl_03: 8 nodes of 16 cores x 2 threads; node 0 has the least memory (63733 MiB)
    folder = write_capture(tmp_path / "nps4", numactl="numactl_03.txt")
    assert main(["doctor", "--from-dir", str(folder), "--chart-values"]) == 0
    captured = capsys.readouterr()
    values = yaml.safe_load(captured.out)
    assert values == {
        "triton": {
            "replicas": 8,
            "resources": {"cpu": 30, "memory": "58Gi"},  # (63733 MiB - 4 GiB) // 1 GiB
            "gpusPerPod": 0,
            "instancesPerGpu": 2,  # 2 per NUMA node: the shipped CPU count, per pod
            "hourlyPriceUsd": 0,
        },
        "numa": {"singleNumaNode": True, "podsPerNode": 8},
    }
    assert "planned as a CPU-only host" in captured.err  # warnings go to stderr
    assert '#   reservedSystemCPUs: "0,128"' in captured.out


def test_cli_chart_values_file_with_report_and_json(tmp_path, capsys):
    folder = write_capture(
        tmp_path / "asus", topo_m="topo_m_06.txt", numactl="numactl_01.txt", lscpu="lscpu_01.txt"
    )
    out = tmp_path / "values" / "host.yaml"
    assert main(["doctor", "--from-dir", str(folder), "--chart-values", str(out)]) == 0
    report = capsys.readouterr().out
    assert report.startswith("triton-embed doctor\n")
    assert f"Chart values ({out}): 2 pod(s) per host, each 31 CPUs, 178Gi, 2 GPU(s)" in report
    assert yaml.safe_load(out.read_text()) == values_of(asus_host()).values()
    rc = main(
        ["doctor", "--json", "--from-dir", str(folder), "--chart-values", str(out)]
        + ["--reserved-cores", "2", "--instances-per-gpu", "1"]
    )
    assert rc == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"host", "plan", "warnings", "chart_values"}
    assert payload["chart_values"]["values"]["triton"]["resources"]["cpu"] == 30
    assert payload["chart_values"]["values"]["triton"]["instancesPerGpu"] == 1
    assert payload["chart_values"]["kubelet"]["reservedSystemCPUs"] == "0-1"


def test_cli_chart_values_errors(tmp_path, capsys):
    folder = write_capture(tmp_path / "asus", numactl="numactl_01.txt")
    assert main(["doctor", "--json", "--from-dir", str(folder), "--chart-values", "-"]) == 1
    assert "both write to standard output" in capsys.readouterr().err
    assert (
        main(["doctor", "--from-dir", str(folder), "--chart-values", "--reserved-cores", "40"]) == 1
    )
    assert "NUMA node 0 has 32 physical cores" in capsys.readouterr().err
    p2p_only = write_capture(tmp_path / "p2p", p2p="p2p_r_01.txt")
    assert main(["doctor", "--from-dir", str(p2p_only), "--chart-values"]) == 1
    err = capsys.readouterr().err
    assert "no CPU information" in err and "capture lscpu.txt or numactl.txt" in err


def test_cli_chart_values_uneven_cpu_instances_warn(tmp_path, capsys):
    folder = write_capture(tmp_path / "xeon", numactl="numactl_04.txt")
    assert (
        main(["doctor", "--from-dir", str(folder), "--chart-values", "--cpu-instances", "3"]) == 0
    )
    captured = capsys.readouterr()
    assert yaml.safe_load(captured.out)["triton"]["instancesPerGpu"] == 2
    assert "unevenly (node 0: 2, node 1: 1); every pod runs 2" in captured.err


def test_report_without_chart_values_keeps_two_cpu_instances(tmp_path):
    folder = write_capture(tmp_path / "nps4", numactl="numactl_03.txt")
    payload_plan = plan_placement(gather_host(folder), cpu_instances=2).to_dict()
    assert len(payload_plan["instances"]) == 2
    assert main(["doctor", "--from-dir", str(folder), "--plan-out", str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text()) == payload_plan


def test_every_capture_with_cpus_gives_values(tmp_path):
    """Each capture of tests/data/topology read alone: values, or the doctor's clear refusal."""
    keys = {"topo": "topo_m", "p2p": "p2p", "lscpu": "lscpu", "numactl": "numactl"}
    for path in sorted(CAPTURES.glob("*.txt")):
        folder = write_capture(tmp_path / path.stem, **{keys[path.stem.split("_")[0]]: path.name})
        if path.stem.startswith("p2p"):
            assert main(["doctor", "--from-dir", str(folder), "--chart-values"]) == 1
            continue
        host = gather_host(folder)
        per_node = 2 * len(host.numa_nodes) if not host.gpus else None
        values = chart_values(host, plan_placement(host, cpu_instances=per_node))
        triton = values.values()["triton"]
        assert triton["resources"]["cpu"] >= 1, path.name
        assert all(
            triton["resources"]["cpu"] <= len(host.numa_nodes[n.numa_node]) for n in values.nodes
        ), path.name
