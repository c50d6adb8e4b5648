"""Bulk embedding against real servers: streaming shards, kill and resume, flat memory, failover.

``triton-embed embed INPUT -o DIR`` runs as a user runs it (a subprocess of the installed
command) against the session's real tritonserver; corpora are Debian's fortunes. What is
checked (docs/bulk.md):

* the shards equal the in-memory ``.npy`` path bit for bit (same ids, token counts), and the
  vectors match sentence-transformers;
* SIGKILL mid-run, the same command again: the output equals an uninterrupted run's (same
  ids, vectors within VECTOR_ATOL; shards written before the kill kept byte for byte),
  ``verify`` passes, a changed input is refused;
* peak RSS does not grow with the corpus (a budget over a small run's peak that the larger
  corpus's vectors exceed several times);
* two servers behind ``--url a,b``, b SIGKILLed mid-run: every id once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from triton_embed.corpus import read_fortunes, write_jsonl
from triton_embed_server.run.launcher import TritonServer
from triton_embed_server.run.supervisor import remove_shm_regions

from perf.bulk import measure
from tests.helpers import COSINE_MIN, VECTOR_ATOL, cosines, stub_regions

pytestmark = [pytest.mark.integration]

CLI = [sys.executable, "-m", "triton_embed.cli"]
#: Peak RSS the large run may add over the small run's, bytes.
RSS_GROWTH_BUDGET = 16 * 2**20
SMALL, LARGE = 1_000, 40_000
DIM = 384


def fortune_lines(n: int) -> list[str]:
    """``n`` short real texts: fortunes' first 80 characters, repeated in order."""
    lines = [" ".join(t.split())[:80] for _, t in read_fortunes()]
    lines = [line for line in lines if len(line) > 20]
    return [lines[i % len(lines)] for i in range(n)]


def admin_env(server: TritonServer) -> dict[str, str]:
    """This environment plus the server's admin key (the CLI reads max_batch_size)."""
    return {**os.environ, "TRITON_EMBED_ADMIN_KEY": server.admin_key}


def line_corpus(tmp_path: Path, n: int) -> Path:
    """``c.txt``: ``n`` fortune lines, one text per line."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(fortune_lines(n)) + "\n")
    return corpus


def shard_job(corpus: Path, out: Path, urls: str, shard_rows: int, concurrency: int = 2) -> list:
    """``embed`` arguments of a sharded run: batches of 16, no progress bar."""
    return ["embed", corpus, "-o", out, "--url", urls, "--shard-rows", shard_rows,
            "--batch-size", 16, "--concurrency", concurrency, "--no-progress"]  # fmt: skip


def start_cli(args: list, server: TritonServer, **popen) -> subprocess.Popen:
    """The CLI started in the background with the server's admin key."""
    return subprocess.Popen([*CLI, *map(str, args)], env=admin_env(server), text=True, **popen)


def run_cli(args: list, server: TritonServer, check: bool = True, **kwargs):
    done = subprocess.run(
        [*CLI, *map(str, args)], env=admin_env(server), capture_output=True, text=True,
        timeout=600, **kwargs,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def read_output(folder: Path):
    """``(ids, num_tokens, vectors)`` of a shard folder, in shard order."""
    table = pq.read_table(folder)  # _manifest.json is skipped by the reader
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    return table.column("id").to_pylist(), table.column("num_tokens").to_numpy(), vectors


def test_shards_equal_the_in_memory_path_and_match_the_reference(server, tmp_path, reference_model):
    texts = [t for _, t in read_fortunes()][:300]
    corpus = tmp_path / "c.jsonl"
    write_jsonl(corpus, [{"id": f"doc-{i}", "text": t} for i, t in enumerate(texts)])
    url = server.grpc_url
    run_cli(["embed", corpus, "-o", tmp_path / "out", "--url", url, "--shard-rows", 128], server)
    run_cli(["embed", corpus, "-o", tmp_path / "c.npy", "--url", url], server)

    ids, counts, vectors = read_output(tmp_path / "out")
    assert ids == [f"doc-{i}" for i in range(300)]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        ".triton-embed.lock", "_manifest.json", "part-00000.parquet", "part-00001.parquet",
        "part-00002.parquet",
    ]  # fmt: skip
    assert vectors.dtype == np.float32 and vectors.shape == (300, DIM)
    # the two paths batch the texts differently: equal within VECTOR_ATOL (bit-equal at float32
    # on most hosts, not at bfloat16 where oneDNN picks AMX kernels by the batch's shape)
    np.testing.assert_allclose(vectors, np.load(tmp_path / "c.npy"), rtol=0, atol=VECTOR_ATOL)
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["rows"] == 300 and manifest["dimension"] == DIM
    assert [s["rows"] for s in manifest["shards"]] == [128, 128, 44]
    assert manifest["tokens"] == int(counts.sum())
    reference = reference_model.encode(texts[:40], convert_to_numpy=True)
    assert cosines(vectors[:40], reference).min() >= COSINE_MIN
    verify = run_cli(["verify", tmp_path / "out", corpus], server)
    assert "OK, 300 rows in 3 shards, 384 values per embedding" in verify.stdout


def test_sigkill_then_the_same_command_equals_an_uninterrupted_run(server, tmp_path):
    corpus, out = line_corpus(tmp_path, 4000), tmp_path / "out"
    args = shard_job(corpus, out, server.grpc_url, 250)
    proc = start_cli(args, server, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    manifest_path = out / "_manifest.json"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if manifest_path.exists():
                try:
                    if len(json.loads(manifest_path.read_text())["shards"]) >= 4:
                        break
                except ValueError:  # replaced while read: read again
                    pass
            time.sleep(0.05)
        assert proc.poll() is None, f"finished before the kill: {proc.stderr.read()}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed = json.loads(manifest_path.read_text())
    assert not killed["complete"] and 4 <= len(killed["shards"]) < 16
    first_shards = {s["file"]: (out / s["file"]).read_bytes() for s in killed["shards"]}

    resumed = run_cli(args, server)
    assert f"{len(killed['shards'])} shards ({len(killed['shards']) * 250} records)" in (
        resumed.stderr
    )
    for name, data in first_shards.items():  # the shards written before the kill are kept
        assert (out / name).read_bytes() == data
    run_cli([*args[:3], tmp_path / "whole", *args[4:]], server)
    ids, counts, vectors = read_output(out)
    ids2, counts2, vectors2 = read_output(tmp_path / "whole")
    assert ids == ids2 == list(range(4000))
    assert np.array_equal(counts, counts2)
    np.testing.assert_allclose(vectors, vectors2, rtol=0, atol=VECTOR_ATOL)  # batched differently
    assert json.loads(manifest_path.read_text())["rows"] == 4000
    assert "OK, 4000 rows in 16 shards" in run_cli(["verify", out, corpus], server).stdout

    before = manifest_path.read_bytes()
    with corpus.open("a") as f:
        f.write("one more text\n")
    refused = run_cli(args, server, check=False)
    assert refused.returncode == 1
    assert "holds the output of another job: the input changed" in refused.stderr
    assert manifest_path.read_bytes() == before
    stale = run_cli(["verify", out, corpus], server, check=False)
    assert stale.returncode == 1 and "not the input this output was made from" in stale.stderr


def peak_rss(args: list, server: TritonServer) -> tuple[int, str]:
    """Peak RSS (bytes) of the CLI process over its run, sampled every 20 ms."""
    code, output, peak, _ = measure([*CLI, *map(str, args)], admin_env(server))
    assert code == 0, output
    return peak, output


@pytest.mark.slow
def test_peak_rss_does_not_grow_with_the_corpus(server, tmp_path):
    peaks = {}
    for n in (SMALL, LARGE):
        corpus = tmp_path / f"c{n}.jsonl"
        # Two-word texts: the vectors are what the in-memory path would hold, whatever the
        # texts (fortunes take 3.3x longer to embed on 2 cores for the same vectors).
        write_jsonl(corpus, [{"id": i, "text": f"text {i}"} for i in range(n)])
        peaks[n], output = peak_rss(
            ["embed", corpus, "-o", tmp_path / f"out{n}", "--url", server.grpc_url,
             "--shard-rows", 1000, "--no-progress"], server,
        )  # fmt: skip
        assert f"-> {tmp_path / f'out{n}'} ({n} rows in {n // 1000} shards)" in output
    # What the in-memory path would hold for the large corpus: its vectors alone.
    held = LARGE * DIM * 4
    assert held > 3 * RSS_GROWTH_BUDGET
    growth = peaks[LARGE] - peaks[SMALL]
    print(f"peak RSS {peaks[SMALL] / 2**20:.1f} MB at {SMALL} texts, "
          f"{peaks[LARGE] / 2**20:.1f} MB at {LARGE} (vectors {held / 2**20:.1f} MB)")  # fmt: skip
    assert growth < RSS_GROWTH_BUDGET, f"peak RSS grew {growth / 2**20:.1f} MB"


@pytest.mark.slow
def test_two_servers_one_killed_mid_run_every_id_once(server, tmp_path):
    corpus = tmp_path / "c.jsonl"
    texts = fortune_lines(6000)
    write_jsonl(corpus, [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)])
    b = TritonServer(admin_key=server.admin_key, ready_timeout_s=400,
                     log_path=tmp_path / "tritonserver-b.log")  # fmt: skip
    b.start()
    out = tmp_path / "out"
    urls = f"{server.grpc_url},{b.grpc_url}"
    args = shard_job(corpus, out, urls, 500, concurrency=4)
    proc = start_cli(args, server, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        answered_by_b = 0.0
        while time.monotonic() < deadline and answered_by_b < 20:
            answered_by_b = b_successes(b)
            time.sleep(0.2)
        assert answered_by_b >= 20, "server b got no requests"
        regions = stub_regions(b)
        os.killpg(b.process.pid, signal.SIGKILL)  # b, its supervisor and its stubs
        b.process.wait()
        remove_shm_regions(regions)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        b.stop()
    assert proc.returncode == 0, output
    ids, _, _ = read_output(out)
    assert ids == [f"t{i}" for i in range(6000)]  # every id once, in input order
    assert "OK, 6000 rows in 12 shards" in run_cli(["verify", out, corpus], server).stdout


def b_successes(b: TritonServer) -> float:
    from tests.helpers import metric_sum

    try:
        return metric_sum(b.metric_samples(), "nv_inference_request_success_total", model="embed")
    except Exception:  # not up yet
        return 0.0


def test_input_appended_mid_run_fails_the_job_clearly(server, tmp_path):
    """Issue 20 item 7: 500 lines appended to a 3,000-line input after the first shard."""
    corpus, out = line_corpus(tmp_path, 3000), tmp_path / "out"
    args = shard_job(corpus, out, server.grpc_url, 500)
    proc = start_cli(args, server, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not (out / "part-00000.parquet").exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        with corpus.open("a") as f:
            f.write("\n".join(fortune_lines(3500)[3000:]) + "\n")
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, stderr
    assert (
        f"triton-embed embed: error: {corpus} changed while this job read it: it holds more "
        "than the 3000 records it held when the job started (lines were appended). The output "
        "is not complete."
    ) in " ".join(stderr.split()), stderr
    manifest = json.loads((out / "_manifest.json").read_text())
    assert not manifest["complete"] and manifest["rows"] <= 3000
    refused = run_cli(args, server, check=False)  # the input as it is now: another input
    assert refused.returncode == 1 and "the input changed" in refused.stderr


def test_planted_links_at_the_temporaries_are_not_followed(server, tmp_path):
    """Issue 20 item 6, through the CLI: links at every temporary, a file outside the folder."""
    corpus = line_corpus(tmp_path, 300)
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "._manifest.json.tmp").symlink_to(precious)
    run_cli(["embed", corpus, "-o", out, "--url", server.grpc_url, "--shard-rows", 128], server)
    assert precious.read_text() == "keep me\n"
    assert [p.name for p in out.iterdir() if p.is_symlink()] == []
    assert "OK, 300 rows in 3 shards" in run_cli(["verify", out, corpus], server).stdout
    other = tmp_path / "other"  # shard temporaries planted in a fresh folder: refused
    other.mkdir()
    for k in range(3):
        (other / f".part-{k:05d}.parquet.tmp").symlink_to(precious)
    refused = run_cli(["embed", corpus, "-o", other, "--url", server.grpc_url], server, check=False)
    assert refused.returncode == 1
    assert "holds shard files (part-NNNNN.parquet) but no _manifest.json" in refused.stderr
    assert precious.read_text() == "keep me\n"
    (out / ".triton-embed.lock").unlink()
    (out / ".triton-embed.lock").symlink_to(precious)
    refused = run_cli(["embed", corpus, "-o", out, "--url", server.grpc_url], server, check=False)
    assert refused.returncode == 1
    assert ".triton-embed.lock is a symbolic link; the job's lock file must be a plain file" in (
        refused.stderr
    )
    assert precious.read_text() == "keep me\n"
