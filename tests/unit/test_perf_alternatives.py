"""The pure parts of ``perf.bench --mode alternatives`` and ``perf.engine_options``: the
per-round bests, the ratios against issue 16's targets (median / median), the latency table,
and the engine-option summary (test_bench runs their modules as programs)."""

from __future__ import annotations

import pytest

from perf import alternatives, engine_options
from perf.contenders import infinity


def row(contender, tokens_s, k, length=50, batch=1, conc=32, p50=None, p99=None, errors=0):
    return {
        "contender": contender,
        "length": length,
        "batch": batch,
        "concurrency": conc,
        "round": k,
        "tokens_s": tokens_s,
        "p50_ms": p50,
        "p99_ms": p99,
        "errors": errors,
    }


ROWS = [
    # ours: the best of its points is 12,000 in round 1 and 10,000 in round 2 (a slower
    # stretch of the machine); a run with errors never counts
    row("triton_pa", 9_000, 1, conc=1, p50=10.0, p99=20.0),
    row("triton_pa", 8_000, 2, conc=1, p50=12.0, p99=24.0),
    row("triton_pa", 12_000, 1),
    row("triton_pa", 10_000, 2),
    row("triton_pa", 50_000, 2, errors=3),
    # sentence-transformers: 8,000 and 6,000
    row("sentence_transformers", 8_000, 1, batch=0, conc=0),
    row("sentence_transformers", 6_000, 2, batch=0, conc=0),
    row("infinity_torch", 4_000, 1),
    row("infinity_torch", 3_000, 2),
    row("infinity_onnx", 9_000, 1),
    row("infinity_onnx", 8_000, 2),
    row("vllm_base64", 6_000, 1, conc=1, p50=9.0, p99=30.0),
    row("vllm_base64", 5_000, 2, conc=1, p50=11.0, p99=40.0),
    row("vllm_base64", 7_000, 1, conc=64),
    row("vllm_base64", 6_000, 2, conc=64),
    row("gateway_base64", 14_000, 1, conc=64),
    row("gateway_base64", 13_000, 2, conc=64),
]


def test_per_round_best_over_points_without_errors():
    assert alternatives.per_round(ROWS, ("triton_pa",), 50) == {1: 12_000, 2: 10_000}
    assert alternatives.per_round(ROWS, ("triton_pa",), 256) == {}


def test_latency_is_the_median_over_rounds_at_concurrency_1():
    assert alternatives.latency(ROWS, "triton_pa", 50) == (11.0, 22.0)
    assert alternatives.latency(ROWS, "vllm_base64", 50) == (10.0, 35.0)
    assert alternatives.latency(ROWS, "gateway_base64", 50) is None


def test_summary_ratios_are_median_over_median_against_the_better_backend(tmp_path):
    text = alternatives.summarize_alternatives(ROWS, tmp_path)
    assert (tmp_path / "alternatives.md").read_text() == text
    # ours 11,000 median / sentence-transformers 7,000 median
    assert "triton_pa / sentence_transformers: median / median **1.57** (target 1.0: met)" in text
    # Infinity's better backend by median is onnx (8,500): 11,000 / 8,500
    assert "triton_pa / infinity_torch or infinity_onnx: median / median **1.29** " in text
    assert "(target 1.5: NOT met)" in text
    # gateway 13,500 / vLLM 6,500 at 50 tokens; per round 14/7 and 13/6
    assert "gateway_base64 / vllm_base64: median / median **2.08** (target 2.0: met)" in text
    assert "per round 2.00 / 2.17" in text
    assert "| 50 | 11.0 / 22.0 | n/a | 10.0 / 35.0 |" in text
    assert "| infinity_onnx | 9,000 | 8,500 | 9,000 / 8,000 |" in text


def test_engine_options_summary_gives_each_variant_against_sentence_transformers():
    rows = [
        {"variant": name, "length": 50, "round": k, "tokens_s": value * k}
        for k in (1, 2)
        for name, value in zip(
            engine_options.VARIANTS, (1_000, 1_500, 2_000, 3_000, 500, 1_000), strict=True
        )
    ]
    text = engine_options.summarize(rows)
    assert "| sentence_transformers | 2,000 | 1,500 | 1.00 |" in text
    assert "| vllm compiled (enforce_eager=False) | 6,000 | 4,500 | 3.00 |" in text
    assert "| vllm 4096 tokens / 128 seqs per step | 1,000 | 750 | 0.50 |" in text


def test_infinity_engines_are_named_and_checked():
    with pytest.raises(ValueError, match="engine must be one of"):
        infinity.InfinityServer("tensorrt")
