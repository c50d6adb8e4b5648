"""cli: summarize, nearest, the parser, and embed/query against a stand-in client (no server)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from triton_embed import cli
from triton_embed.cli import build_parser, main, nearest, summarize
from triton_embed.client import EmbedResult
from triton_embed.retry import RetryPolicy

# --- summarize ---------------------------------------------------------------------------


def test_summarize_values():
    s = summarize(10, 100, 2.0, [0.1, 0.2, 0.3])
    assert s == {
        "texts": 10,
        "tokens": 100,
        "seconds": 2.0,
        "texts_per_s": 5.0,
        "tokens_per_s": 50.0,
        "p50_ms": 200.0,
        "p99_ms": 298.0,  # linear interpolation: 200 + 0.98 * 100
    }


def test_summarize_rounding():
    s = summarize(7, 1000, 3.0, [0.0123456])
    assert s["seconds"] == 3.0
    assert s["texts_per_s"] == 2.3
    assert s["tokens_per_s"] == 333.3
    assert s["p50_ms"] == 12.35
    assert s["p99_ms"] == 12.35


def test_summarize_no_latencies_and_zero_time():
    s = summarize(0, 0, 0.0, [])
    assert s == {
        "texts": 0,
        "tokens": 0,
        "seconds": 0.0,
        "texts_per_s": 0.0,
        "tokens_per_s": 0.0,
        "p50_ms": 0.0,
        "p99_ms": 0.0,
    }


def test_summarize_percentiles_over_many_requests():
    lat = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    s = summarize(100, 100, 1.0, lat)
    assert s["p50_ms"] == 50.5
    assert s["p99_ms"] == 99.01


# --- nearest -----------------------------------------------------------------------------


def test_nearest_orders_by_cosine():
    corpus = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]], dtype=np.float32)
    queries = np.array([[1.0, 0.1], [0.0, -2.0]], dtype=np.float32)
    hits = nearest(corpus, queries, 4)
    assert [i for i, _ in hits[0]] == [0, 2, 1, 3]
    assert [i for i, _ in hits[1]] == [0, 3, 2, 1]  # 0 and 3 tie at 0.0: corpus order
    assert [round(s, 6) for _, s in hits[1]] == [0.0, 0.0, -0.707107, -1.0]
    q0 = queries[0] / np.linalg.norm(queries[0])
    assert hits[0][0][1] == pytest.approx(float(q0[0]), abs=1e-6)
    assert hits[0][1][1] == pytest.approx(float(q0 @ (np.array([1, 1]) / np.sqrt(2))), abs=1e-6)
    assert hits[0][3][1] == pytest.approx(-float(q0[0]), abs=1e-6)
    assert all(isinstance(i, int) and isinstance(s, float) for i, s in hits[0])


def test_nearest_is_scale_invariant():
    corpus = np.array([[3.0, 4.0], [100.0, 0.0]])
    hits = nearest(corpus, np.array([[0.6, 0.8]]), 2)
    assert [i for i, _ in hits[0]] == [0, 1]
    assert hits[0][0][1] == pytest.approx(1.0, abs=1e-6)
    assert hits[0][1][1] == pytest.approx(0.6, abs=1e-6)


def test_nearest_k_capped_at_corpus_size():
    corpus = np.eye(3, dtype=np.float32)
    hits = nearest(corpus, np.array([[0.0, 0.0, 1.0]], dtype=np.float32), 10)
    assert len(hits) == 1
    assert len(hits[0]) == 3
    assert hits[0][0] == (2, 1.0)


def test_nearest_k_smaller_than_corpus():
    corpus = np.eye(4, dtype=np.float32)
    hits = nearest(corpus, np.eye(4, dtype=np.float32)[[3, 1]], 1)
    assert hits == [[(3, 1.0)], [(1, 1.0)]]


def test_nearest_ties_keep_corpus_order():
    corpus = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [5.0, 0.0]], dtype=np.float32)
    hits = nearest(corpus, np.array([[1.0, 0.0]], dtype=np.float32), 4)
    assert [i for i, _ in hits[0]] == [0, 1, 3, 2]


def test_nearest_zero_vectors_score_zero():
    corpus = np.array([[0.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    hits = nearest(corpus, np.array([[1.0, 0.0], [0.0, 0.0]], dtype=np.float32), 2)
    assert hits[0] == [(1, 1.0), (0, 0.0)]
    assert hits[1] == [(0, 0.0), (1, 0.0)]
    assert not any(np.isnan(s) for _, s in hits[1])


def test_nearest_no_queries():
    assert nearest(np.eye(2, dtype=np.float32), np.zeros((0, 2), dtype=np.float32), 3) == []


# --- embed / query with a stand-in client -----------------------------------------------


class FakeClient:
    """Records how the CLI builds :class:`EmbeddingClient`; text i embeds to [len(text), i]."""

    made: list[dict] = []

    def __init__(self, url, model, **kwargs):
        FakeClient.made.append({"url": url, "model": model, **kwargs})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def embed_with_details(self, texts, on_batch_done=None):
        vectors = np.array([[len(t), i] for i, t in enumerate(texts)], dtype=np.float32)
        counts = np.array([len(t.split()) + 2 for t in texts], dtype=np.int32)
        if on_batch_done is not None:
            on_batch_done(len(texts), int(counts.sum()))
        return EmbedResult(vectors, counts, [0.010, 0.030])

    def embed(self, texts):
        return np.array([[1.0, 0.0]] * len(texts), dtype=np.float32)


@pytest.fixture
def fake_client(monkeypatch):
    FakeClient.made = []
    monkeypatch.setattr(cli, "EmbeddingClient", FakeClient)
    return FakeClient


def test_embed_without_options_leaves_them_to_the_server(fake_client, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one two\n\nthree\n")
    out = tmp_path / "sub" / "v.npy"
    assert main(["embed", str(corpus), "-o", str(out), "--no-progress"]) == 0
    [made] = fake_client.made
    assert made["truncation"] is None and made["allow_empty"] is None
    assert made["batch_size"] is None  # the server's max_batch_size
    np.testing.assert_array_equal(np.load(out), [[7.0, 0.0], [5.0, 1.0]])
    printed = capsys.readouterr().out
    assert "embedded 2 texts (7 tokens, dim 2)" in printed
    assert "p50 20.0 ms, p99 29.8 ms" in printed


def test_embed_passes_every_flag_and_writes_all_outputs(fake_client, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"body": "alpha beta"}\n{"body": ""}\n')
    out, parquet, summary = tmp_path / "v.npy", tmp_path / "v.parquet", tmp_path / "s.json"
    argv = [
        "embed", str(corpus), "--output", str(out), "--parquet", str(parquet),
        "--batch-size", "64", "--concurrency", "8", "--summary-json", str(summary),
        "--no-progress", "--url", "h:1", "--model", "m", "--timeout-s", "2.5",
        "--format", "jsonl", "--field", "body", "--truncation", "start", "--allow-empty",
        "--retries", "3", "--retry-max-wait-s", "0.5",
    ]  # fmt: skip
    assert main(argv) == 0
    assert fake_client.made == [
        {
            "url": "h:1",
            "model": "m",
            "timeout_s": 2.5,
            "max_concurrency": 8,
            "batch_size": 64,
            "truncation": "START",
            "allow_empty": True,
            "admin_key": None,  # the client reads TRITON_EMBED_ADMIN_KEY(_FILE) itself
            "retry": RetryPolicy(retries=3, initial_wait_s=0.1, max_wait_s=0.5),
        }
    ]
    np.testing.assert_array_equal(np.load(out), [[10.0, 0.0], [0.0, 1.0]])
    table = pq.read_table(parquet).to_pydict()
    assert table["text"] == ["alpha beta", ""]
    assert table["num_tokens"] == [4, 2]
    assert table["embedding"] == [[10.0, 0.0], [0.0, 1.0]]
    written = json.loads(summary.read_text())
    assert (written["texts"], written["tokens"], written["dim"]) == (2, 6, 2)


def test_retries_default_to_the_librarys_policy_and_turn_off_with_zero(fake_client, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one\n")
    argv = ["embed", str(corpus), "-o", str(tmp_path / "v.npy"), "--no-progress"]
    assert main(argv) == 0
    assert main([*argv, "--retries", "0"]) == 0
    assert main([*argv, "--retry-max-wait-s", "0.05"]) == 0  # below the 0.1 s first bound
    default, off, short = (made["retry"] for made in fake_client.made)
    assert default == RetryPolicy()
    assert off.retries == 0
    assert (short.initial_wait_s, short.max_wait_s) == (0.05, 0.05)


def test_embed_of_an_empty_file_is_an_error(fake_client, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n \n")
    assert main(["embed", str(corpus), "-o", str(tmp_path / "v.npy")]) == 1
    assert "holds no texts" in capsys.readouterr().err
    assert fake_client.made == []


def test_query_ranks_the_corpus_and_passes_options(fake_client, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"text {i}\n" for i in range(7)))
    vectors = np.array([[np.cos(a), np.sin(a)] for a in np.linspace(0, 3, 7)], np.float32)
    np.save(tmp_path / "e.npy", vectors)
    argv = ["query", "q1", "q2", "--embeddings", str(tmp_path / "e.npy"), "--corpus", str(corpus)]
    assert main([*argv, "--json", "--truncation", "NONE"]) == 0
    assert fake_client.made[0]["truncation"] == "NONE"
    results = json.loads(capsys.readouterr().out)
    assert [r["query"] for r in results] == ["q1", "q2"]
    hits = results[0]["hits"]
    assert [h["index"] for h in hits] == [0, 1, 2, 3, 4]  # default top-k 5, best first
    assert [h["text"] for h in hits[:2]] == ["text 0", "text 1"]
    assert hits[0]["cosine"] == 1.0
    assert main([*argv, "-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("query: q1\n  1. [1.000] #0: text 0\n  2. [")


def test_query_with_a_corpus_of_another_length_is_an_error(fake_client, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a\nb\n")
    np.save(tmp_path / "e.npy", np.eye(3, dtype=np.float32))
    argv = ["query", "q", "--embeddings", str(tmp_path / "e.npy"), "--corpus"]
    assert main([*argv, str(tmp_path / "c.txt")]) == 1
    assert "has 2 texts but" in capsys.readouterr().err


# --- build_parser ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["embed", "in.txt"],  # -o is required
        ["embed", "-o", "out.npy"],  # input is required
        ["embed", "in.txt", "-o", "o.npy", "--format", "csv"],
        ["embed", "in.txt", "-o", "o.npy", "--batch-size", "many"],
        ["embed", "in.txt", "-o", "o.npy", "--batch-size", "0"],
        ["embed", "in.txt", "-o", "o.npy", "--truncation", "MIDDLE"],
        ["embed", "in.txt", "-o", "o.npy", "--retries", "-1"],
        ["embed", "in.txt", "-o", "o.npy", "--retry-max-wait-s", "0"],
        ["query", "q", "--embeddings", "e", "--corpus", "c", "--retry-max-wait-s", "inf"],
        ["query", "--embeddings", "e.npy", "--corpus", "c"],  # no query
        ["query", "q", "--corpus", "c"],  # --embeddings is required
        ["query", "q", "--embeddings", "e.npy"],  # --corpus is required
        ["serve"],
    ],
)
def test_parser_rejects(argv, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert "triton-embed" in capsys.readouterr().err


def test_nearest_rejects_k_below_one():
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        nearest(np.eye(3, dtype=np.float32), np.eye(3, dtype=np.float32)[:1], 0)
