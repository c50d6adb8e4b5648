"""numactl: ``numactl --hardware`` captures, memory-only nodes and damaged outputs."""

from __future__ import annotations

import pytest
from triton_embed_server.host.topology.cpulist import cpu_ranges_of
from triton_embed_server.host.topology.errors import TopologyParseError
from triton_embed_server.host.topology.numactl import parse_numactl


def test_numactl_fields_one_by_one(numactl_name, capture, expected):
    want = expected(numactl_name)
    numa = parse_numactl(capture(numactl_name))
    assert numa.node_count == want["node_count"]
    assert numa.nodes_listed == want["nodes_listed"]
    for node, spec in want["nodes"].items():
        got = numa.nodes[int(node)]
        assert list(got.cpus) == spec["cpus"]
        assert got.size_mb == spec["size_mb"]
        assert got.free_mb == spec["free_mb"]
        assert [list(r) for r in cpu_ranges_of(got.cpus)] == spec["cpu_ranges"]
    assert list(numa.distance_nodes) == want["distance_nodes"]
    assert [list(r) for r in numa.distance_matrix] == want["distance_matrix"]
    assert {
        str(a): {str(b): d for b, d in row.items()} for a, row in numa.distances.items()
    } == want["distances"]
    d = numa.to_dict()
    for key in ("total_cpus", "total_size_mb", "total_free_mb", "local_distance", "max_distance"):
        assert d[key] == want[key]


def test_numactl_03_eight_nodes_npsx4(capture):
    numa = parse_numactl(capture("numactl_03.txt"))
    assert numa.distances[0] == {0: 10, 1: 12, 2: 12, 3: 12, 4: 32, 5: 32, 6: 32, 7: 32}
    assert numa.nodes[7].cpus[:2] == (112, 113)
    assert numa.nodes[7].size_mb == 64428


def test_h200_host_trailing_spaces(h200_capture):
    numa = parse_numactl(h200_capture("numactl.txt"))
    assert numa.nodes_listed == "0"
    assert numa.nodes[0].cpus == tuple(range(16))
    assert (numa.nodes[0].size_mb, numa.nodes[0].free_mb) == (5851, 3412)
    assert numa.distances == {0: {0: 10}}


def test_numactl_memory_only_node():
    text = (
        "available: 2 nodes (0-1)\nnode 0 cpus: 0 1\nnode 0 size: 100 MB\nnode 0 free: 50 MB\n"
        "node 1 cpus:\nnode 1 size: 200 MB\nnode 1 free: 150 MB\n"
        "node distances:\nnode   0   1\n  0:  10  20\n  1:  20  10\n"
    )
    numa = parse_numactl(text)
    assert numa.nodes[1].cpus == ()
    assert numa.to_dict()["total_size_mb"] == 300
    assert numa.to_dict()["total_cpus"] == 2


def test_numactl_garbled(capture):
    text = capture("numactl_01.txt")
    with pytest.raises(TopologyParseError, match="'available: 2 nodes' but 1 'node N cpus:' lines"):
        parse_numactl("\n".join(text.splitlines()[:4]))
    with pytest.raises(TopologyParseError, match="distance matrix is not square"):
        parse_numactl("\n".join(text.splitlines()[:-1]))
    with pytest.raises(TopologyParseError, match="expected CPU numbers separated by spaces"):
        parse_numactl(text.replace("cpus: 0 1 2", "cpus: 0 one 2"))
    with pytest.raises(TopologyParseError, match="No NUMA available on this system"):
        parse_numactl("No NUMA available on this system\n")
