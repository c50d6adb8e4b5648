"""batching.flatten / batching.split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from triton_embed_server.steps.batching import flatten, split


def test_flatten_keeps_order_and_counts():
    flat, counts = flatten([["a", "b"], ["c"], ["d", "e", "f"]])
    assert flat == ["a", "b", "c", "d", "e", "f"]
    assert counts == [2, 1, 3]


def test_flatten_with_empty_requests():
    flat, counts = flatten([[], ["x"], [], []])
    assert flat == ["x"]
    assert counts == [0, 1, 0, 0]


def test_flatten_nothing():
    assert flatten([]) == ([], [])


def test_split_round_trip():
    per_request = [[1, 2], [], [3], [4, 5, 6], []]
    flat, counts = flatten(per_request)
    assert [list(p) for p in split(flat, counts)] == per_request


def test_split_empty():
    assert split([], []) == []
    assert split([], [0, 0]) == [[], []]


def test_split_numpy_rows():
    arr = np.arange(12).reshape(6, 2)
    parts = split(arr, [1, 0, 3, 2])
    assert [p.shape for p in parts] == [(1, 2), (0, 2), (3, 2), (2, 2)]
    assert parts[0].tolist() == [[0, 1]]
    assert parts[2].tolist() == [[2, 3], [4, 5], [6, 7]]
    assert parts[3].tolist() == [[8, 9], [10, 11]]
    assert all(isinstance(p, np.ndarray) for p in parts)


def test_split_numpy_counts():
    parts = split(list("abcde"), np.array([2, 3]))
    assert parts == [["a", "b"], ["c", "d", "e"]]


def test_split_mismatch_too_few_results():
    with pytest.raises(ValueError) as info:
        split([1, 2, 3], [2, 2])
    assert str(info.value) == "counts add up to 4 but there are 3 results"


def test_split_mismatch_too_many_results():
    with pytest.raises(ValueError, match="counts add up to 1 but there are 2 results"):
        split([1, 2], [1])


def test_split_negative_count():
    with pytest.raises(ValueError) as info:
        split([1, 2, 3], [4, -1])
    assert str(info.value) == "negative count in [4, -1]"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(), max_size=5), max_size=8))
def test_property_flatten_split_round_trip(per_request):
    flat, counts = flatten(per_request)
    assert sum(counts) == len(flat)
    assert [list(p) for p in split(flat, counts)] == per_request
