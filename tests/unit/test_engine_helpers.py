"""The engine module's pure functions (no vLLM: PoolingEngine is never built here)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from triton_embed_server.config import EmbedderConfig
from triton_embed_server.engine import (
    cpu_slice,
    decode_request_token_ids,
    engine_environment,
    instance_index,
    validate_token_ids,
)
from triton_embed_server.errors import InvalidTokenIdsError

VOCAB = 30522


def embedder(count: int = 1, threads_bind: str = "spread") -> EmbedderConfig:
    return EmbedderConfig(
        model_path=Path("/nonexistent"),
        max_length=256,
        instances_per_device=count,
        threads_bind=threads_bind,
    )


# --- instance_index ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, index",
    [
        ("embedder_0_1", 1),
        ("embedder_0_0", 0),
        ("embedder_0_12", 12),
        ("embedder", 0),
        ("my_embedder_gpu_3", 3),
        ("embedder_x", 0),
    ],
)
def test_instance_index(name, index):
    assert instance_index(name) == index


# --- cpu_slice ---------------------------------------------------------------------------


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


# --- engine_environment ------------------------------------------------------------------


def test_environment_gpu():
    env = engine_environment(embedder(2), 1, "GPU", 3, [0, 1, 2, 3])
    assert env == {"CUDA_VISIBLE_DEVICES": "3"}


def test_environment_gpu_lowercase_kind():
    assert engine_environment(embedder(1, "auto"), 0, "gpu", 0, [0]) == {
        "CUDA_VISIBLE_DEVICES": "0"
    }


def test_environment_cpu_spread_two_replicas():
    assert engine_environment(embedder(2), 0, "CPU", 0, [0, 1]) == {
        "VLLM_CPU_OMP_THREADS_BIND": "0",
        "OMP_NUM_THREADS": "1",
    }
    assert engine_environment(embedder(2), 1, "CPU", 0, [0, 1]) == {
        "VLLM_CPU_OMP_THREADS_BIND": "1",
        "OMP_NUM_THREADS": "1",
    }


def test_environment_cpu_spread_multi_cpu_slices():
    assert engine_environment(embedder(2), 0, "CPU", 0, [0, 1, 2, 3]) == {
        "VLLM_CPU_OMP_THREADS_BIND": "0,1",
        "OMP_NUM_THREADS": "2",
    }
    assert engine_environment(embedder(2), 1, "CPU", 0, [0, 1, 2, 3, 4]) == {
        "VLLM_CPU_OMP_THREADS_BIND": "3,4",
        "OMP_NUM_THREADS": "2",
    }


def test_environment_cpu_single_instance_takes_all():
    env = engine_environment(embedder(1), 0, "CPU", 0, {5, 6, 7})
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "5,6,7", "OMP_NUM_THREADS": "3"}


def test_environment_cpu_auto_is_empty():
    assert engine_environment(embedder(2, "auto"), 1, "CPU", 0, [0, 1, 2, 3]) == {}


# --- validate_token_ids ------------------------------------------------------------------


def test_validate_accepts_good_ids():
    assert validate_token_ids([101, 0, VOCAB - 1, 102], 0, VOCAB, 256) is None
    assert validate_token_ids([1] * 256, 0, VOCAB, 256) is None


def test_validate_empty():
    with pytest.raises(InvalidTokenIdsError) as info:
        validate_token_ids([], 4, VOCAB, 256)
    assert str(info.value) == "text 4 has no token IDs; send at least one token"


def test_validate_too_long():
    with pytest.raises(InvalidTokenIdsError) as info:
        validate_token_ids([1] * 257, 2, VOCAB, 256)
    msg = str(info.value)
    assert msg.startswith("text 2 has 257 token IDs; the model accepts 256")


def test_validate_id_equal_to_vocab_size():
    with pytest.raises(InvalidTokenIdsError) as info:
        validate_token_ids([101, 5, VOCAB, 102], 1, VOCAB, 256)
    msg = str(info.value)
    assert msg.startswith(f"text 1 has token ID {VOCAB} at position 2, outside the vocabulary")
    assert f"[0, {VOCAB})" in msg


def test_validate_negative_id():
    with pytest.raises(InvalidTokenIdsError) as info:
        validate_token_ids([101, 7, 8, -1, 102], 0, VOCAB, 256)
    assert str(info.value).startswith("text 0 has token ID -1 at position 3, outside")


def test_validate_reports_first_bad_position():
    with pytest.raises(InvalidTokenIdsError, match=r"token ID 99999 at position 1,"):
        validate_token_ids([1, 99999, -5], 0, VOCAB, 256)


def test_invalid_token_ids_error_code():
    assert InvalidTokenIdsError.code == "INVALID_ARG"


# --- decode_request_token_ids ------------------------------------------------------------


def pack(ids):
    return struct.pack(f"<{len(ids)}i", *ids)


def test_decode_request_token_ids():
    payloads = [pack([101, 7592, 102]), pack([101, 0, 102])]
    assert decode_request_token_ids(payloads, VOCAB, 256) == [[101, 7592, 102], [101, 0, 102]]


def test_decode_request_empty_request():
    assert decode_request_token_ids([], VOCAB, 256) == []


def test_decode_request_bad_length_names_text():
    with pytest.raises(InvalidTokenIdsError) as info:
        decode_request_token_ids([pack([1]), pack([1, 2]) + b"\x00"], VOCAB, 256)
    msg = str(info.value)
    assert msg.startswith("text 1: ")
    assert "9 bytes" in msg
    assert "multiple of 4" in msg


def test_decode_request_empty_payload():
    with pytest.raises(InvalidTokenIdsError, match="text 1 has no token IDs"):
        decode_request_token_ids([pack([1]), b""], VOCAB, 256)


def test_decode_request_out_of_vocab_and_too_long():
    with pytest.raises(InvalidTokenIdsError, match=r"text 0 has token ID 30522 at position 0"):
        decode_request_token_ids([pack([VOCAB])], VOCAB, 256)
    with pytest.raises(InvalidTokenIdsError, match=r"text 2 has 5 token IDs; the model accepts 4"):
        decode_request_token_ids([pack([1]), pack([1, 2]), pack([1] * 5)], VOCAB, 4)
    with pytest.raises(InvalidTokenIdsError, match=r"token ID -2147483648 at position 1"):
        decode_request_token_ids([pack([1, -(2**31)])], VOCAB, 256)


def placement_in_child(env: dict, echo: str) -> list:
    """apply_placement(env) in a child process (pinning is process-wide and must not leak
    into pytest); returns [returned cpus, affinity afterwards, os.environ[echo]]."""
    import json
    import subprocess
    import sys

    code = (
        "import os, json, sys; from triton_embed_server.engine import apply_placement; "
        f"cpus = apply_placement({env!r}); "
        f"print(json.dumps([cpus, sorted(os.sched_getaffinity(0)), os.environ[{echo!r}]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_apply_placement_pins_the_process_to_the_bound_cpus():
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}
    assert placement_in_child(env, "OMP_NUM_THREADS") == [[0], [0], "1"]


def test_apply_placement_without_a_bind_leaves_affinity_alone():
    import os

    everything = sorted(os.sched_getaffinity(0))
    assert placement_in_child({"CUDA_VISIBLE_DEVICES": "3"}, "CUDA_VISIBLE_DEVICES") == [
        everything,
        everything,
        "3",
    ]
