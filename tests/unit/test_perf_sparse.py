"""perf.sparse's summary: best per round over the points, medians, targets, sizes (no server)."""

from __future__ import annotations

import pytest

from perf import sparse


def row(name, tokens_s, k, length=50, batch=16, conc=4, p50=None, p99=None, errors=0):
    run = {"contender": name, "length": length, "batch": batch, "concurrency": conc}
    return {**run, "round": k, "tokens_s": tokens_s, "p50_ms": p50, "p99_ms": p99, "errors": errors}


ROWS = [
    row("triton_grpc", 9_000, 1),
    row("triton_grpc", 10_000, 1, conc=8),  # the round's best
    row("triton_grpc", 12_000, 2),
    row("triton_grpc", 99_999, 2, errors=1),  # a run with errors never counts
    row("triton_grpc", 500, 1, batch=1, conc=1, p50=10.0, p99=20.0),
    row("triton_grpc", 500, 2, batch=1, conc=1, p50=12.0, p99=30.0),
    row("sparse_encoder", 5_000, 1, batch=32, conc=1),
    row("sparse_encoder", 6_000, 2, batch=32, conc=1),
    row("vllm_server", 2_000, 1),
    row("vllm_server", 2_200, 2),
]
SIZES = {50: {"nonzeros": 200.0, "sparse_ours": 1_604.0, "sparse_tei_json": 6_000.0}}
FACTS = {"started": "2026-12-07 08:00:00", "cpus": 2, "idle_cpu_percent": 1.5}


def test_summary_takes_each_rounds_best_and_the_median_of_the_rounds():
    text = sparse.summarize(ROWS, SIZES, FACTS)
    assert "| triton_grpc | 11,000 (10,000 / 12,000) |" in text
    assert "| sparse_encoder | 5,500 (5,000 / 6,000) |" in text
    assert "- 50 tokens: triton_grpc / sparse_encoder = **2.00** (target 1.5: met)" in text
    assert "- 50 tokens: triton_grpc / vllm_server = **5.24** (target 1.5: met)" in text
    assert "| triton_grpc | 50 | 11.0 | 25.0 |" in text  # latency: medians over the rounds
    assert "| sparse_ours | 1,604 |" in text and "| sparse_tei_json | 6,000 |" in text


def test_a_target_below_is_not_met():
    rows = [r for r in ROWS if r["contender"] != "vllm_server"]
    rows += [row("vllm_server", 9_000, 1), row("vllm_server", 9_000, 2)]
    assert "triton_grpc / vllm_server = **1.22** (target 1.5: NOT met)" in sparse.summarize(
        rows, SIZES, FACTS
    )


def test_record_counts_tokens_as_texts_times_the_exact_length(capsys):
    got = sparse.record("vllm_server", 256, 16, 4, 1, {"texts_s": 10.0, "errors": 0})
    assert got["tokens_s"] == pytest.approx(2560.0)
    assert "2560 tokens/s" in capsys.readouterr().out
