"""This machine's own ``lscpu``, ``numactl --hardware`` and sysfs, read by the parsers.

A test skips, saying why, when this host lacks the command or the sysfs folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from triton_embed_server.host.topology import (
    core_groups,
    parse_cpu_list,
    parse_lscpu,
    parse_numactl,
    read_sysfs_cpu_siblings,
    read_sysfs_nodes,
)


def run_here(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed on this machine")
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "LC_ALL": "C"},
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"{' '.join(argv)} failed here: {done.stderr.strip()}")
    return done.stdout


def online_cpus_here() -> list[int]:
    return sorted(parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text()))


def test_this_machines_lscpu():
    info = parse_lscpu(run_here("lscpu"))
    assert info.cpus >= len(online_cpus_here())  # CPU(s) counts offline CPUs too
    assert sorted(parse_cpu_list(info.online_cpus)) == online_cpus_here()
    node_cpus = sorted(c for n in info.numa_nodes for c in info.node_cpus(n))
    if info.numa_nodes:
        assert node_cpus == online_cpus_here()
        assert info.numa_node_count >= len(info.numa_nodes)  # memory-only nodes have no CPUs


def test_this_machines_sysfs():
    if not Path("/sys/devices/system/node/node0").is_dir():
        pytest.skip("this kernel exposes no /sys/devices/system/node")
    numa = read_sysfs_nodes()
    assert sorted(c for n in numa.nodes.values() for c in n.cpus) == online_cpus_here()
    assert all(n.size_mb and n.size_mb > 0 for n in numa.nodes.values())
    assert all(numa.distances[n][n] == 10 for n in numa.nodes)


def test_this_machines_numactl_agrees_with_sysfs():
    numa = parse_numactl(run_here("numactl", "--hardware"))
    sysfs = read_sysfs_nodes()
    assert {n: v.cpus for n, v in numa.nodes.items()} == {n: v.cpus for n, v in sysfs.nodes.items()}
    assert {n: v.size_mb for n, v in numa.nodes.items()} == {
        n: v.size_mb for n, v in sysfs.nodes.items()
    }
    assert numa.distance_matrix == sysfs.distance_matrix
    assert numa.nodes_listed == sysfs.nodes_listed


def test_this_machines_cpu_siblings():
    if not Path("/sys/devices/system/cpu/cpu0/topology").is_dir():
        pytest.skip("this kernel exposes no /sys/devices/system/cpu/cpu0/topology")
    sib = read_sysfs_cpu_siblings()
    online = online_cpus_here()
    assert set(online) <= set(sib)
    assert all(cpu in sib[cpu] for cpu in online)
    cores = core_groups(online, sib)
    assert sorted(c for core in cores for c in core) == online
    threads = parse_lscpu(run_here("lscpu")).threads_per_core
    if threads == 1:  # no SMT: every CPU is its own core
        assert cores == tuple((c,) for c in online)
    elif threads is not None:
        assert {len(core) for core in cores} == {threads}
