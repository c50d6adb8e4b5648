"""Live configuration, statistics and tools against the running server."""

from __future__ import annotations

import subprocess

import psutil
import pytest
from triton_embed_server.run.launcher import REPO_ROOT

from perf.contenders.triton_pa import perf_analyzer_command
from tests.helpers import infer_embed

pytestmark = pytest.mark.integration


def test_embedder_runs_at_least_two_instances(server, grpc_client):
    config = grpc_client.get_model_config(
        "embedder", as_json=True, headers=server.admin_grpc_headers
    )["config"]
    assert config["instance_group"][0]["count"] >= 2
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    stubs = [
        " ".join(p.cmdline())
        for p in psutil.Process(server.process.pid).children(recursive=True)
        if "triton_python_backend_stub" in " ".join(p.cmdline())
    ]
    embedder_stubs = [c for c in stubs if "/embedder/1/model.py" in c]
    assert len(embedder_stubs) == config["instance_group"][0]["count"]
    assert any("embedder_0_0" in c for c in embedder_stubs)
    assert any("embedder_0_1" in c for c in embedder_stubs)


def test_both_steps_show_executions_in_statistics(server, grpc_client):
    infer_embed(grpc_client, ["statistics probe"])
    stats = grpc_client.get_inference_statistics(as_json=True, headers=server.admin_grpc_headers)[
        "model_stats"
    ]
    by_name = {s["name"]: s for s in stats}
    for name in ("tokenizer", "embedder", "embed"):
        assert int(by_name[name].get("execution_count", 0)) >= 1, name
        assert int(by_name[name]["inference_stats"]["success"]["count"]) >= 1, name


def test_perf_analyzer_reports_zero_errors(server):
    data = REPO_ROOT / "perf" / "data" / "embed_input.json"
    proc = subprocess.run(
        perf_analyzer_command(
            server.grpc_url,
            data,
            "--concurrency-range",
            "2",
            "--measurement-interval",
            "2000",
            "--stability-percentage",
            "100",
            "--max-trials",
            "3",
            admin_key=server.admin_key,  # perf_analyzer reads the model config
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Throughput:" in out, out[-3000:]
    assert server.admin_key not in out
    assert "error" not in out.lower().replace("errors: 0", ""), out[-3000:]
