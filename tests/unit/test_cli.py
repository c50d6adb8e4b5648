"""cli: summarize, nearest, build_parser (no server)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from triton_embed.cli import build_parser, nearest, summarize

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


# --- build_parser ------------------------------------------------------------------------


def test_parser_embed_defaults():
    args = build_parser().parse_args(["embed", "in.txt", "-o", "out.npy"])
    assert args.command == "embed"
    assert args.input == Path("in.txt")
    assert args.output == Path("out.npy")
    assert args.parquet is None
    assert args.batch_size is None
    assert args.concurrency == 4
    assert args.summary_json is None
    assert args.no_progress is False
    assert args.url == "127.0.0.1:8001"
    assert args.model == "embed"
    assert args.timeout_s == 120.0
    assert args.format == "auto"
    assert args.field == "text"


def test_parser_embed_all_options():
    args = build_parser().parse_args(
        [
            "embed",
            "c.jsonl",
            "--output",
            "o.npy",
            "--parquet",
            "o.parquet",
            "--batch-size",
            "64",
            "--concurrency",
            "8",
            "--summary-json",
            "s.json",
            "--no-progress",
            "--url",
            "h:1",
            "--model",
            "m",
            "--timeout-s",
            "2.5",
            "--format",
            "jsonl",
            "--field",
            "body",
        ]
    )
    assert args.parquet == Path("o.parquet")
    assert args.batch_size == 64
    assert args.concurrency == 8
    assert args.summary_json == Path("s.json")
    assert args.no_progress is True
    assert (args.url, args.model, args.timeout_s) == ("h:1", "m", 2.5)
    assert (args.format, args.field) == ("jsonl", "body")


def test_parser_query():
    args = build_parser().parse_args(
        [
            "query",
            "first query",
            "second",
            "--embeddings",
            "e.npy",
            "--corpus",
            "c.txt",
            "-k",
            "3",
            "--json",
        ]
    )
    assert args.command == "query"
    assert args.queries == ["first query", "second"]
    assert args.embeddings == Path("e.npy")
    assert args.corpus == Path("c.txt")
    assert args.top_k == 3
    assert args.json is True
    assert args.format == "auto"


def test_parser_query_default_top_k():
    args = build_parser().parse_args(["query", "q", "--embeddings", "e.npy", "--corpus", "c"])
    assert args.top_k == 5
    assert args.json is False


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["embed", "in.txt"],  # -o is required
        ["embed", "-o", "out.npy"],  # input is required
        ["embed", "in.txt", "-o", "o.npy", "--format", "csv"],
        ["embed", "in.txt", "-o", "o.npy", "--batch-size", "many"],
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
    import numpy as np
    import pytest
    from triton_embed.cli import nearest

    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        nearest(np.eye(3, dtype=np.float32), np.eye(3, dtype=np.float32)[:1], 0)
