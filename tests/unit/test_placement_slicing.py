"""placement.slicing: the one rule that splits CPUs, or physical cores, among instances."""

from __future__ import annotations

import pytest
from triton_embed_server.host.placement.slicing import core_slice, cpu_slice


def test_cpu_slice_two_cpus_two_replicas():
    assert cpu_slice([0, 1], 0, 2) == [0]
    assert cpu_slice([0, 1], 1, 2) == [1]


def test_cpu_slice_remainder_goes_to_first_slices():
    assert cpu_slice(range(5), 0, 2) == [0, 1, 2]
    assert cpu_slice(range(5), 1, 2) == [3, 4]
    assert [cpu_slice(range(10), i, 4) for i in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]


def test_cpu_slice_more_replicas_than_cpus():
    assert [cpu_slice([0], i, 3) for i in range(3)] == [[0], [0], [0]]
    assert [cpu_slice([4, 7], i, 5) for i in range(5)] == [[4], [7], [4], [7], [4]]


def test_cpu_slice_single_replica_gets_everything():
    assert cpu_slice([3, 1, 2, 0], 0, 1) == [0, 1, 2, 3]


def test_cpu_slice_unsorted_non_contiguous_cpus():
    cpus = {14, 2, 8, 6, 10, 4}
    assert cpu_slice(cpus, 0, 2) == [2, 4, 6]
    assert cpu_slice(cpus, 1, 2) == [8, 10, 14]


def test_cpu_slice_index_wraps_modulo_count():
    assert cpu_slice(range(4), 3, 2) == cpu_slice(range(4), 1, 2) == [2, 3]


@pytest.mark.parametrize("ncpu", [1, 2, 3, 4, 5, 7, 8, 16, 31, 64])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 8])
def test_cpu_slice_partitions_disjointly(ncpu, count):
    cpus = list(range(100, 100 + ncpu))
    slices = [cpu_slice(cpus, i, count) for i in range(count)]
    assert all(slices), slices
    if count <= ncpu:
        flat = [c for s in slices for c in s]
        assert flat == cpus  # contiguous, in order, disjoint, covering every CPU
        sizes = [len(s) for s in slices]
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)
    else:
        assert all(len(s) == 1 for s in slices)
        assert [s[0] for s in slices] == [cpus[i % ncpu] for i in range(count)]


@pytest.mark.parametrize("cpus, count", [([], 1), ([0, 1], 0), ([0], -1)])
def test_cpu_slice_errors(cpus, count):
    with pytest.raises(ValueError) as info:
        cpu_slice(cpus, 0, count)
    assert str(info.value) == f"cannot split {len(cpus)} CPUs among {count} replicas"


@pytest.mark.parametrize("count", range(1, 15))
def test_core_slice_with_one_cpu_per_core_is_cpu_slice(count):
    cpus = [2, 3, 5, 8, 9, 10, 11, 20, 21, 30]
    for i in range(count + 2):
        assert core_slice([(c,) for c in cpus], i, count) == tuple(cpu_slice(cpus, i, count))


def test_core_slice_rules_and_errors():
    cores = [(0, 4), (1, 5), (2, 6)]
    assert [core_slice(cores, i, 2) for i in range(2)] == [(0, 1, 4, 5), (2, 6)]
    assert [core_slice(cores, i, 3) for i in range(3)] == [(0, 4), (1, 5), (2, 6)]
    assert [core_slice(cores, i, 4) for i in range(4)] == [(0, 4), (1, 5), (2,), (6,)]
    assert [core_slice(cores, i, 7) for i in range(7)] == [(0,), (1,), (2,), (4,), (5,), (6,), (0,)]
    with pytest.raises(ValueError, match="cannot split 0 CPUs among 2 instances"):
        core_slice([], 0, 2)
    with pytest.raises(ValueError, match="among 0 instances"):
        core_slice(cores, 0, 0)
