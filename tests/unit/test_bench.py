"""The benchmark driver's pure parts: best-of, headline summary, regression guard."""

from __future__ import annotations

import json
import sys

from triton_embed.launcher import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "perf"))
import bench  # noqa: E402


def row(contender, tokens_s, length=50, batch=1, conc=4, errors=0):
    return {"contender": contender, "length": length, "batch": batch, "concurrency": conc,
            "tokens_s": tokens_s, "texts_s": tokens_s / length, "p50_ms": 1.0, "p99_ms": 2.0,
            "errors": errors}


ROWS = [
    row("engine", 10_000, batch=0, conc=0),
    row("triton_pa", 8_000, conc=4), row("triton_pa", 9_200, conc=16),
    row("triton_pa", 9_900, conc=32, errors=1),  # runs with errors never count
    row("triton_client", 7_000), row("vllm_float", 4_000), row("vllm_base64", 4_600),
]


def test_best_ignores_runs_with_errors_and_filters_batch():
    assert bench.best(ROWS, "triton_pa", 50, 1) == 9_200
    assert bench.best(ROWS, "triton_pa", 50, 16) == 0.0
    assert bench.best(ROWS, "engine", 50) == 10_000


def test_summary_reports_headline_ratios(tmp_path):
    text = bench.summarize(ROWS, tmp_path)
    assert "| triton_pa | 9,200 |" in text
    assert "ensemble / engine = 0.92 (target 0.9)" in text
    assert "ensemble / vLLM server = 2.00 (target 1.8)" in text
    assert (tmp_path / "summary.md").read_text() == text
    assert (tmp_path / "throughput_len50_batch1.png").stat().st_size > 1000


def test_regression_guard_flags_drops_over_ten_percent(tmp_path):
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"rows": [row("triton_pa", 10_000, conc=16), row("vllm_float", 4_000)]}))
    drops = bench.compare([row("triton_pa", 8_900, conc=16), row("vllm_float", 3_700)], ref)
    assert len(drops) == 1 and "-11%" in drops[0] and "triton_pa" in drops[0]
    assert bench.compare([row("triton_pa", 9_100, conc=16)], ref) == []
