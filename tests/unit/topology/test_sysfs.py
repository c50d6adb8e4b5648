"""sysfs: NUMA nodes and SMT siblings read from fake ``/sys/devices/system`` trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from triton_embed_server.host.topology.errors import TopologyParseError
from triton_embed_server.host.topology.sysfs import read_sysfs_cpu_siblings, read_sysfs_nodes


def make_node_sysfs(
    root: Path, nodes: dict[int, str], distances: dict[int, str] | None = None
) -> Path:
    """A fake /sys/devices/system/node: ``node<N>/{cpulist,meminfo,distance}`` per node."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "online").write_text(f"0-{len(nodes) - 1}\n")
    (root / "possible").write_text("0-3\n")  # not a node folder
    for n, cpulist in nodes.items():
        folder = root / f"node{n}"
        folder.mkdir()
        (folder / "cpulist").write_text(cpulist + "\n")
        (folder / "meminfo").write_text(
            f"Node {n} MemTotal:       {2048 * (n + 1)} kB\nNode {n} MemFree:        1024 kB\n"
        )
        if distances is not None:
            (folder / "distance").write_text(distances[n] + "\n")
    return root


def make_cpu_sysfs(
    root: Path, siblings: dict[int, str | None], name: str = "thread_siblings_list"
) -> Path:
    """A fake /sys/devices/system/cpu: ``cpu<N>/topology/<name>`` per CPU (None: no topology)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "online").write_text("0-7\n")
    (root / "cpufreq").mkdir()
    (root / "cpuidle").mkdir()
    for cpu, text in siblings.items():
        (root / f"cpu{cpu}").mkdir()
        if text is not None:
            (root / f"cpu{cpu}" / "topology").mkdir()
            (root / f"cpu{cpu}" / "topology" / name).write_text(text + "\n")
    return root


def test_read_sysfs_nodes_tree(tmp_path):
    root = make_node_sysfs(
        tmp_path / "node",
        {0: "0-3,8-11", 1: "4-7,12-15", 2: ""},
        {0: "10 21 30", 1: "21 10 30", 2: "30 30 10"},
    )
    numa = read_sysfs_nodes(root)
    assert numa.source == "sysfs"
    assert numa.nodes_listed == "0-2"
    assert numa.nodes[0].cpus == (0, 1, 2, 3, 8, 9, 10, 11)
    assert numa.nodes[1].cpus == (4, 5, 6, 7, 12, 13, 14, 15)
    assert numa.nodes[2].cpus == ()
    assert [n.size_mb for n in numa.nodes.values()] == [2, 4, 6]
    assert numa.nodes[0].free_mb == 1
    assert numa.distances[1] == {0: 21, 1: 10, 2: 30}


def test_read_sysfs_nodes_missing_or_bad(tmp_path):
    with pytest.raises(TopologyParseError, match="has no node<N> folders"):
        read_sysfs_nodes(tmp_path / "absent")
    root = make_node_sysfs(tmp_path / "bad", {0: "0-x"})
    with pytest.raises(TopologyParseError, match="cpulist"):
        read_sysfs_nodes(root)
    no_distance = read_sysfs_nodes(make_node_sysfs(tmp_path / "nodist", {0: "0-1"}))
    assert no_distance.distance_matrix == ()


def test_read_sysfs_cpu_siblings_tree(tmp_path):
    root = make_cpu_sysfs(
        tmp_path / "cpu",
        {0: "0,4", 1: "1,5", 4: "0,4", 5: "1,5", 2: "2", 3: None, 6: "6-x", 10: "10-11"},
    )
    assert read_sysfs_cpu_siblings(root) == {
        0: (0, 4),
        1: (1, 5),
        2: (2,),
        3: (3,),  # offline: no topology folder -> its own core
        4: (0, 4),
        5: (1, 5),
        6: (6,),  # garbled list -> its own core
        10: (10, 11),  # cpu11 absent: kept as the kernel says
    }


def test_read_sysfs_cpu_siblings_newer_file_name_and_missing_root(tmp_path):
    root = make_cpu_sysfs(tmp_path / "cpu", {0: "0-1", 1: "0-1"}, name="core_cpus_list")
    assert read_sysfs_cpu_siblings(root) == {0: (0, 1), 1: (0, 1)}
    assert read_sysfs_cpu_siblings(tmp_path / "absent") == {}
    (tmp_path / "file").write_text("not a folder")
    assert read_sysfs_cpu_siblings(tmp_path / "file") == {}
