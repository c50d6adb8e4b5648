"""python -m perf.bench --mode smoke: every contender starts, runs and stops with no error.

Every contender includes the gateway (``gateway_float``, ``gateway_base64``) in front of the
server that ``triton_pa`` and ``triton_client`` load, driven by vLLM's load generator.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from triton_embed_server.run.launcher import REPO_ROOT

from perf.contenders import CONTENDERS

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_smoke_benchmark_runs_every_contender_without_errors(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "perf.bench",
            "--mode",
            "smoke",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {r["contender"] for r in rows} == set(CONTENDERS)  # the summary table's rows
    assert all(r["errors"] == 0 and r["tokens_s"] > 0 for r in rows)
    summary = (tmp_path / "summary.md").read_text()
    assert "ensemble / vLLM server" in summary
    assert "gateway_base64 / vLLM server" in summary and "gateway_base64 / triton_client" in summary
    assert "| gateway_base64 |" in summary
