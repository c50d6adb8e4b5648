"""The client library and the triton-embed CLI end to end against the real server."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
from triton_embed import (
    EmbeddingClient,
    EmbedTimeoutError,
    InvalidInputError,
    ServerUnavailableError,
)
from triton_embed.admin import ADMIN_KEY_ENV
from triton_embed.corpus import read_fortunes, write_jsonl
from triton_embed_server.run.launcher import free_port

from tests.helpers import COSINE_MIN, DIM, cosines, run_cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cli_env(server):
    """The environment of a CLI run: the server's admin key (it reads max_batch_size)."""
    return {**os.environ, ADMIN_KEY_ENV: server.admin_key}


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """150 real texts (Debian fortunes) as JSONL, and 40 one-line ones as a text file."""
    fortunes = [t for _, t in read_fortunes()]
    texts = random.Random(7).sample(fortunes, 150)
    folder = tmp_path_factory.mktemp("corpus")
    jsonl = folder / "corpus.jsonl"
    write_jsonl(jsonl, [{"text": t} for t in texts])
    one_line = [t for t in fortunes if "\n" not in t][:40]
    txt = folder / "corpus.txt"
    txt.write_text("\n".join(one_line) + "\n", encoding="utf-8")
    return {"jsonl": jsonl, "texts": texts, "txt": txt, "lines": one_line, "dir": folder}


def test_client_splits_large_inputs_and_keeps_order(server, reference_model, small_corpus):
    texts = small_corpus["texts"]
    with EmbeddingClient(
        server.grpc_url, max_concurrency=4, batch_size=16, admin_key=server.admin_key
    ) as client:
        assert client.max_batch_size == 64
        result = client.embed_with_details(texts)
    assert result.embeddings.shape == (150, DIM)
    assert result.embeddings.dtype == np.float32
    assert len(result.latencies_s) == 10  # ceil(150 / 16) requests
    assert cosines(result.embeddings, reference_model.encode(texts)).min() >= COSINE_MIN


def test_client_caps_batch_size_at_the_servers_max_batch_size(server):
    with EmbeddingClient(server.grpc_url, batch_size=1000, admin_key=server.admin_key) as client:
        assert client.batch_size == 64
        result = client.embed_with_details([f"text number {i}" for i in range(130)])
    assert len(result.latencies_s) == 3  # 64 + 64 + 2


def test_client_raises_its_own_error_types(server):
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key) as client:
        with pytest.raises(InvalidInputError, match=r"texts\[1\] was rejected: .*text 1 is empty"):
            client.embed(["fine", ""])
        with pytest.raises(InvalidInputError, match="str or bytes"):
            client.embed([42])
        with pytest.raises(InvalidInputError, match=r"texts\[1\] holds a lone surrogate"):
            client.embed(["fine", "a\ud800b"])
    with EmbeddingClient(server.grpc_url, batch_size=4, admin_key=server.admin_key) as client:
        texts = ["fine"] * 10
        texts[6] = ""  # text 2 of the second request
        with pytest.raises(InvalidInputError) as info:
            client.embed(texts)
        assert info.value.index == 6 and "text 2 is empty" in info.value.server_message
        assert str(info.value).startswith("texts[6] was rejected: ")
    with pytest.raises(ServerUnavailableError):
        EmbeddingClient(f"127.0.0.1:{free_port()}")
    with pytest.raises(ServerUnavailableError, match=r"gRPC port \(8001 by default\)"):
        EmbeddingClient(server.http_url.removeprefix("http://"), retry=0)  # the HTTP port
    with pytest.raises(InvalidInputError, match="has a scheme"):
        EmbeddingClient(f"http://{server.grpc_url}")
    with pytest.raises(ServerUnavailableError, match="not ready"):
        EmbeddingClient(server.grpc_url, model="no_such_model")
    with EmbeddingClient(server.grpc_url, timeout_s=0.001, admin_key=server.admin_key) as client:
        with pytest.raises(EmbedTimeoutError):
            client.embed(["word " * 200] * 64)


def test_cli_embed_jsonl_to_npy_and_parquet_then_query(
    server, reference_model, small_corpus, tmp_path, cli_env
):
    out = tmp_path / "vectors.npy"
    parquet = tmp_path / "vectors.parquet"
    summary_path = tmp_path / "summary.json"
    proc = run_cli(
        "embed", small_corpus["jsonl"], "-o", out, "--parquet", parquet, "--url",
        server.grpc_url, "--summary-json", summary_path, "--batch-size", "8", env=cli_env,
        timeout=300
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "embedded 150 texts" in proc.stdout and "tokens/s" in proc.stdout and "p99" in proc.stdout
    )
    vectors = np.load(out)
    assert vectors.shape == (150, DIM)
    assert cosines(vectors, reference_model.encode(small_corpus["texts"])).min() >= COSINE_MIN
    summary = json.loads(summary_path.read_text())
    assert summary["texts"] == 150 and summary["dim"] == DIM and summary["tokens"] > 150

    import pyarrow.parquet as pq

    table = pq.read_table(parquet)
    assert table.column("text").to_pylist() == small_corpus["texts"]
    assert sum(table.column("num_tokens").to_pylist()) == summary["tokens"]
    np.testing.assert_array_equal(
        np.array(table.column("embedding").to_pylist(), np.float32), vectors
    )

    probe = small_corpus["texts"][17]
    proc = run_cli(
        "query", probe, "--embeddings", out, "--corpus", small_corpus["jsonl"], "-k", "3",
        "--json", "--url", server.grpc_url, env=cli_env, timeout=120
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    hits = json.loads(proc.stdout)[0]["hits"]
    assert [h["rank"] for h in hits] == [1, 2, 3]
    assert hits[0]["index"] == 17 and hits[0]["cosine"] >= COSINE_MIN
    assert hits[0]["cosine"] >= hits[1]["cosine"] >= hits[2]["cosine"]


def test_cli_embed_text_file_one_text_per_line(
    server, reference_model, small_corpus, tmp_path, cli_env
):
    out = tmp_path / "lines.npy"
    proc = run_cli(
        "embed", small_corpus["txt"], "-o", out, "--url", server.grpc_url, "--no-progress",
        env=cli_env, timeout=300
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    vectors = np.load(out)
    assert vectors.shape == (40, DIM)
    assert cosines(vectors, reference_model.encode(small_corpus["lines"])).min() >= COSINE_MIN


def test_cli_reports_errors_without_a_traceback(server, tmp_path, cli_env):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": ""}\n')
    proc = run_cli(
        "embed", bad, "-o", tmp_path / "x.npy", "--url", server.grpc_url, "--no-progress",
        env=cli_env, timeout=120
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"{bad}:2: the text is empty;" in proc.stderr and "Traceback" not in proc.stderr
    assert "pass --allow-empty" in proc.stderr
    proc = run_cli(
        "embed", bad, "-o", tmp_path / "x.npy", "--url", f"127.0.0.1:{free_port()}",
        "--no-progress", env=cli_env, timeout=120
    )  # fmt: skip
    assert proc.returncode == 1 and "unavailable" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_output_folder_is_written_under_the_name_given_and_queried_by_it(
    server, small_corpus, tmp_path, cli_env
):
    out = tmp_path / "vec"  # no .npy suffix: an output folder of Parquet shards
    common = ["--url", server.grpc_url]
    proc = run_cli(
        "embed", small_corpus["txt"], "-o", out, "--no-progress", *common, env=cli_env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"-> {out} (" in proc.stdout and (out / "_manifest.json").is_file()
    assert (out / "part-00000.parquet").is_file()
    query = ["query", small_corpus["lines"][3], "--corpus", small_corpus["txt"]]
    proc = run_cli(
        *query, "--embeddings", out, "--json", "-k", "1", *common, env=cli_env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)[0]["hits"][0]["index"] == 3
