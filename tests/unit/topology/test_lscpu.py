"""lscpu: old flat and newer sectioned captures, wrapped values and damaged outputs."""

from __future__ import annotations

import pytest
from triton_embed_server.host.topology.errors import TopologyParseError
from triton_embed_server.host.topology.lscpu import parse_lscpu


def test_lscpu_fields_one_by_one(lscpu_name, capture, expected):
    want = expected(lscpu_name)
    info = parse_lscpu(capture(lscpu_name))
    assert info.cpus == want["cpus"]
    assert info.online_cpus == want["online_cpus"]
    assert info.vendor_id == want["vendor_id"]
    assert info.model_name == want["model_name"]
    assert info.threads_per_core == want["threads_per_core"]
    assert info.cores_per_socket == want["cores_per_socket"]
    assert info.sockets == want["sockets"]
    assert info.numa_node_count == want["numa_node_count"]
    assert info.physical_cores_total == want["physical_cores_total"]
    for node, spec in want["numa_nodes"].items():
        assert info.numa_nodes[int(node)] == spec["cpu_list"]
        assert len(info.node_cpus(int(node))) == spec["cpu_count"]
    assert len(info.numa_nodes) == len(want["numa_nodes"])


def test_lscpu_01_wrapped_flags_do_not_become_keys(capture):
    info = parse_lscpu(capture("lscpu_01.txt"))
    # 'md_lbr_v2 ...' continuation lines hold no ':' and must not shadow any field
    assert info.model_name == "AMD EPYC 9374F 32-Core Processor"
    assert info.numa_nodes == {0: "0-31", 1: "32-63"}


def test_h200_host(h200_capture):
    info = parse_lscpu(h200_capture("lscpu.txt"))
    assert (info.cpus, info.online_cpus, info.vendor_id) == (16, "0-15", "GenuineIntel")
    assert (info.threads_per_core, info.cores_per_socket, info.sockets) == (1, 16, 1)
    assert info.numa_node_count == 1
    assert info.node_cpus(0) == tuple(range(16))


def test_lscpu_garbled():
    with pytest.raises(TopologyParseError, match=r"no 'CPU\(s\):' line; .* LC_ALL=C"):
        parse_lscpu("Architecture: x86_64\nProzessoren: 4\n")
    with pytest.raises(TopologyParseError, match=r"'CPU\(s\): many': expected a whole number"):
        parse_lscpu("CPU(s): many\n")
    with pytest.raises(
        TopologyParseError, match=r"lscpu: NUMA node0 CPU\(s\): cannot read CPU list"
    ):
        parse_lscpu("CPU(s): 4\nNUMA node0 CPU(s): 0-x\n")
