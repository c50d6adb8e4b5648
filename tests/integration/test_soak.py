"""The soak's short form: 80 s of traffic, CPU hogs, a stub kill and a server kill.

``python -m perf.soak`` with short intervals; the run's own checks decide (no request lost,
no wrong answer, every fault recovered, RSS and /dev/shm back, no stub left).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from triton_embed_server.run.launcher import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_soak_short(tmp_path):
    out = tmp_path / "soak"
    cmd = [
        sys.executable, "-m", "perf.soak",
        "--duration-s", "80", "--clients", "4", "--hogs", "1", "--warmup-s", "5",
        "--stub-kill-every-s", "20", "--server-kill-at-s", "35",
        "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    report = json.loads((out / "soak.json").read_text())
    summary = {k: report[k] for k in ("requests", "outcomes", "faults", "checks")}
    assert proc.returncode == 0, json.dumps(summary, indent=1) + proc.stderr[-3000:]
    kinds = [f["kind"] for f in report["faults"]]
    assert "tritonserver SIGKILL" in kinds and "embedder stub SIGKILL" in kinds, kinds
    assert all(f["recovered_s"] is not None for f in report["faults"]), report["faults"]
    assert report["outcomes"].get("valid:ok", 0) > 100, report["outcomes"]
    assert (out / "soak.png").stat().st_size > 10_000
