"""The bulk job on a real local Ray cluster (a head and a second node on this machine).

``ray start`` starts the head and a worker node (2 logical CPUs each, small object stores,
their own temporary folder), ``python -m triton_embed.bulk.ray_job`` runs on it against the
session's real tritonserver, and the output must equal the CLI's for the same Parquet input
(same ids, token counts and vectors, bit for bit) and pass ``triton-embed verify``. The
cluster's processes are found by their temporary folder and stopped by PID, even on failure.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from triton_embed.corpus import read_fortunes
from triton_embed_server.run.launcher import free_port

from tests.helpers import VECTOR_ATOL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RAY = str(Path(sys.executable).with_name("ray"))
ROWS = 1200


def _cluster_processes(temp_dir: str, port: int) -> list[psutil.Process]:
    """The processes of the Ray cluster of ``temp_dir`` and head ``port``.

    The head's Ray client server names only the port (``ray.util.client.server``).
    """
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if temp_dir in cmdline or (f":{port}" in cmdline and "ray.util.client.server" in cmdline):
            found.append(proc)
    return found


@pytest.fixture(scope="module")
def ray_cluster():
    """``ray start --head`` and one more node, on loopback; their processes stopped by PID."""
    # A short folder: Ray's Unix socket paths must stay under 107 characters.
    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--num-cpus=2", "--object-store-memory=150000000", "--node-ip-address=127.0.0.1",
              "--disable-usage-stats", f"--temp-dir={temp_dir}"]  # fmt: skip
    started: list[psutil.Process] = []
    try:
        for args in (
            ["--head", f"--port={port}", "--include-dashboard=false"],
            [f"--address=127.0.0.1:{port}"],
        ):
            done = subprocess.run([RAY, "start", *args, *common], env=env, capture_output=True,
                                  text=True, timeout=180)  # fmt: skip
            started = _cluster_processes(temp_dir, port)
            assert done.returncode == 0, done.stdout + done.stderr
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = subprocess.run([RAY, "status", f"--address=127.0.0.1:{port}"], env=env,
                                    capture_output=True, text=True, timeout=60)  # fmt: skip
            if status.stdout.count(" node_") == 2:
                break
            time.sleep(1)
        assert status.stdout.count(" node_") == 2, status.stdout + status.stderr
        yield f"127.0.0.1:{port}"
    finally:
        procs = {p.pid: p for p in [*started, *_cluster_processes(temp_dir, port)]}
        for proc in list(procs.values()):
            try:
                for child in proc.children(recursive=True):
                    procs.setdefault(child.pid, child)
            except psutil.Error:
                pass
        for proc in procs.values():
            try:
                proc.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(list(procs.values()), timeout=15)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_data_on_two_nodes_equals_the_cli(server, ray_cluster, tmp_path):
    texts = [t for _, t in read_fortunes()][:ROWS]
    corpus = tmp_path / "corpus.parquet"
    # Several row groups, so Ray reads several blocks and both actors work.
    pq.write_table(pa.table({"id": list(range(7, 7 + ROWS)), "text": texts}), corpus,
                   row_group_size=100)  # fmt: skip
    env = {**os.environ, "TRITON_EMBED_ADMIN_KEY": server.admin_key,
           "RAY_USAGE_STATS_ENABLED": "0"}  # fmt: skip
    ray_out = tmp_path / "ray_out"
    job = subprocess.run(
        [sys.executable, "-m", "triton_embed.bulk.ray_job", corpus, ray_out, "--url",
         server.grpc_url, "--address", ray_cluster, "--concurrency", "2", "--batch-size", "64"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert f'"rows": {ROWS}' in job.stdout
    cli_out = tmp_path / "cli_out"
    cli = subprocess.run(
        [sys.executable, "-m", "triton_embed.cli", "embed", corpus, "-o", cli_out, "--url",
         server.grpc_url, "--no-progress"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stdout + cli.stderr

    files = glob.glob(str(ray_out / "*.parquet"))
    ray_table = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("id")
    cli_table = pq.read_table(cli_out)
    assert ray_table.schema.remove_metadata().equals(cli_table.schema.remove_metadata())
    assert ray_table.column("id").to_pylist() == list(range(7, 7 + ROWS))
    for column in ("id", "num_tokens"):
        assert ray_table.column(column).equals(cli_table.column(column)), column
    # batched differently by the two jobs: equal within VECTOR_ATOL (not bit for bit at
    # bfloat16, where oneDNN picks AMX kernels by the batch's shape)
    ray_vectors, cli_vectors = (
        np.stack(t.column("embedding").to_numpy(zero_copy_only=False))
        for t in (ray_table, cli_table)
    )
    np.testing.assert_allclose(ray_vectors, cli_vectors, rtol=0, atol=VECTOR_ATOL)
    verify = subprocess.run(
        [sys.executable, "-m", "triton_embed.cli", "verify", ray_out, corpus],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"OK, {ROWS} rows" in verify.stdout and f"ids exactly those of {corpus}" in verify.stdout
