"""python -m perf.rerank --smoke: the reranking benchmark runs end to end (issue 23).

It builds its cross-encoder, starts our tritonserver with the reranker ensemble, the gateway
in front of it (measured when it has a rerank route, else skipped with a note), vLLM's
server on the same folder and the in-process engines, runs one short round and stops them.
Contenders that cannot run here (Infinity not installed) are skipped with a note. The
figures of a 2 s smoke run mean nothing; what is checked is that every contender that runs
answers without errors and that the tokens are counted exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from triton_embed_server.run.launcher import REPO_ROOT

from perf import rerank

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_smoke_rerank_benchmark_runs_every_available_contender(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "perf.rerank", "--smoke", "--out", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows, skipped = results["rows"], results["skipped"]
    measured = {r["contender"] for r in rows}
    assert {"triton_grpc", "vllm_server", "engine"} <= measured
    assert measured | set(skipped) == set(rerank.ORDER)  # each one measured or skipped
    assert not measured & set(skipped)
    assert all(r["errors"] == 0 and r["pairs_s"] > 0 for r in rows)
    # pairs of exactly 64 tokens, as our server, vLLM's and the engine each counted them
    # (Infinity, where installed, counts characters: named in the summary, not multiplied)
    length = rerank.SMOKE.lengths[0]
    exact = [r for r in rows if r["contender"] != "infinity"]
    assert {r["tokens_per_pair"] for r in exact} == {length}
    assert all(r["tokens_s"] == pytest.approx(r["pairs_s"] * length) for r in rows)
    by = {r["contender"]: r["tokens_counted_by"] for r in rows}
    assert by["triton_grpc"] == by["vllm_server"] == "server" and by["engine"] == "engine"
    summary = (tmp_path / "summary.md").read_text()
    assert "triton_grpc / engine = **" in summary
    assert "triton_grpc / vllm_server = **" in summary
    if "infinity" in measured:
        assert "Tokens per pair as counted: infinity at 64 tokens: " in summary
    else:
        assert "Tokens per pair as counted: exact in every run." in summary
    for contender, why in skipped.items():
        assert f"- {contender}: skipped: {why}" in summary
