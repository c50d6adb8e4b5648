"""cores: physical cores from sibling maps, and siblings guessed from captured CPU lists."""

from __future__ import annotations

from triton_embed_server.host.topology.cores import core_groups, infer_siblings
from triton_embed_server.host.topology.lscpu import parse_lscpu
from triton_embed_server.host.topology.numactl import parse_numactl


def test_core_groups_partition_and_cut():
    sib = {0: (0, 4), 4: (0, 4), 1: (1, 5), 5: (1, 5), 2: (2, 6), 6: (2, 6)}
    assert core_groups([0, 1, 2, 4, 5, 6], sib) == ((0, 4), (1, 5), (2, 6))
    # a cpuset holding one thread of core (2, 6); CPU 9 is unknown to the map
    assert core_groups([6, 0, 4, 9], sib) == ((0, 4), (6,), (9,))
    # an inconsistent map still gives disjoint cores
    bad = {0: (0, 1), 1: (1, 2), 2: (0, 2)}
    assert core_groups([0, 1, 2], bad) == ((0, 1), (2,))
    assert core_groups([], sib) == ()


def test_infer_siblings_split_runs_of_real_lscpu(capture):
    # lscpu_04 (2x Xeon Gold 6342, 2 threads per core): node 0 = 0-23,48-71
    info = parse_lscpu(capture("lscpu_04.txt"))
    sib = infer_siblings(info.node_cpus(0), info.threads_per_core)
    assert sib[0] == (0, 48) and sib[48] == (0, 48) and sib[23] == (23, 71)
    assert core_groups(info.node_cpus(0), sib) == tuple((c, c + 48) for c in range(24))
    # lscpu_02 (EPYC 7451, 8 NUMA nodes): node 5 = 30-35,78-83
    info2 = parse_lscpu(capture("lscpu_02.txt"))
    assert core_groups(info2.node_cpus(5), infer_siblings(info2.node_cpus(5), 2)) == tuple(
        (c, c + 48) for c in range(30, 36)
    )


def test_infer_siblings_numactl_02_without_lscpu(capture):
    # numactl_02: 128 CPUs, node 0 = 0-31,64-95 ("interleaved with SMT siblings"): with no
    # lscpu only the unmistakable shape counts: two equal runs, host CPUs / 2 apart
    numa = parse_numactl(capture("numactl_02.txt"))
    total = sum(len(n.cpus) for n in numa.nodes.values())
    assert total == 128
    for node, first in ((0, 0), (1, 32)):
        sib = infer_siblings(numa.nodes[node].cpus, None, total)
        assert core_groups(numa.nodes[node].cpus, sib) == tuple(
            (c, c + 64) for c in range(first, first + 32)
        )
    assert infer_siblings(numa.nodes[0].cpus, None, None) is None
    assert infer_siblings(numa.nodes[0].cpus, None, 192) is None  # not 96 apart
    # with lscpu's count the same list splits the same way
    assert infer_siblings(numa.nodes[0].cpus, 2) == infer_siblings(numa.nodes[0].cpus, None, 128)


def test_infer_siblings_other_shapes(capture):
    evens = list(range(0, 96, 2))  # a node of every other CPU: siblings c and c+48
    assert core_groups(evens, infer_siblings(evens, 2))[:2] == ((0, 48), (2, 50))
    adjacent = [0, 1, 4, 5, 8, 9]  # runs of exactly 2, aligned: each run is a core
    assert core_groups(adjacent, infer_siblings(adjacent, 2)) == ((0, 1), (4, 5), (8, 9))
    four = [0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51]  # SMT4, split
    assert core_groups(four, infer_siblings(four, 4))[0] == (0, 16, 32, 48)
    assert infer_siblings(range(8), 1) == {c: (c,) for c in range(8)}
    assert infer_siblings([], 2) == {}
    # unknown: one contiguous run fits both numberings; unequal runs; no lscpu, one run
    assert infer_siblings(range(48), 2) is None
    assert infer_siblings([0, 1, 2, 10, 11], 2) is None
    assert infer_siblings([0, 1, 2, 10, 11, 12, 13], 2) is None
    assert infer_siblings(range(32), None, 64) is None
    numa01 = parse_numactl(capture("numactl_01.txt"))  # no SMT, no lscpu: cannot tell
    assert infer_siblings(numa01.nodes[0].cpus, None, 64) is None
