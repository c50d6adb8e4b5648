"""cli: summarize, nearest, the parser, and embed/query against a stand-in client (no server)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from triton_embed import InvalidInputError, cli_commands
from triton_embed.bulk import pool_embedder
from triton_embed.cli import build_parser, main, nearest, summarize
from triton_embed.client import EmbedResult
from triton_embed.codec import frame_bytes
from triton_embed.options import RequestOptions
from triton_embed.retry import RetryPolicy
from triton_embed.transport.catalog import Catalog, ModelInfo

from tests import fake_triton as fake_server
from tests.helpers import PoolLifecycle


@pytest.fixture
def fake_triton(monkeypatch):
    """The real EmbeddingClient over a stand-in gRPC client (tests/fake_triton.py)."""
    return fake_server.install(monkeypatch)


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

    def embed(self, texts, input_type=None):
        if input_type == "query":  # as a server whose model has no prompts answers
            raise InvalidInputError(
                "request parameter input_type='query' is not a prompt of this model; "
                "its input types are document"
            )
        return np.array([[1.0, 0.0]] * len(texts), dtype=np.float32)


@pytest.fixture
def fake_client(monkeypatch):
    FakeClient.made = []
    monkeypatch.setattr(cli_commands, "EmbeddingClient", FakeClient)
    return FakeClient


def test_embed_without_options_leaves_them_to_the_server(fake_client, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one two\n\nthree\n")
    out = tmp_path / "sub" / "v.npy"
    assert main(["embed", str(corpus), "-o", str(out), "--no-progress"]) == 0
    [made] = fake_client.made
    assert made["options"] == RequestOptions(input_type="document")  # a corpus is documents
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
        "--retries", "3", "--retry-max-wait-s", "0.5", "--normalize", "false",
    ]  # fmt: skip
    assert main(argv) == 0
    assert fake_client.made == [
        {
            "url": "h:1",
            "model": "m",
            "timeout_s": 2.5,
            "max_concurrency": 8,
            "batch_size": 64,
            "admin_key": None,  # the client reads TRITON_EMBED_ADMIN_KEY(_FILE) itself
            "retry": RetryPolicy(retries=3, initial_wait_s=0.1, max_wait_s=0.5),
            "options": RequestOptions(
                truncation="START",
                allow_empty=True,
                input_type="document",  # a corpus is embedded as documents
                normalize=False,
            ),
            "priority": "batch",  # embed's default class
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
    assert fake_client.made[0]["options"] == RequestOptions(truncation="NONE")  # no input_type
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
        ["embed", "in.txt", "-o", "o.npy", "--timeout-s", "0"],
        ["embed", "in.txt", "-o", "o.npy", "--timeout-s", "-5"],
        ["query", "q", "--embeddings", "e", "--corpus", "c", "--timeout-s", "nan"],
        ["repository", "load", "embed", "--timeout-s", "0"],
        ["serve"],
    ],
)
def test_parser_rejects(argv, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "triton-embed" in err
    if "--timeout-s" in argv:
        assert "argument --timeout-s: must be a finite number > 0" in err


def test_nearest_rejects_k_below_one():
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        nearest(np.eye(3, dtype=np.float32), np.eye(3, dtype=np.float32)[:1], 0)


# --- output files ------------------------------------------------------------------------


def test_embed_writes_a_npy_output_and_query_reads_it(fake_client, tmp_path, capsys):
    corpus = tmp_path / "ok.txt"
    corpus.write_text("one two\nthree\n")
    out = tmp_path / "vec.NPY"  # any case: numpy's np.save(name) would add ".npy"
    assert main(["embed", str(corpus), "-o", str(out), "--no-progress"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"-> {out}")
    assert out.is_file() and not (tmp_path / "vec.NPY.npy").exists()
    np.testing.assert_array_equal(np.load(out), [[7.0, 0.0], [5.0, 1.0]])
    argv = ["query", "hello", "--embeddings", str(out), "--corpus", str(corpus), "--json"]
    assert main(argv) == 0
    assert [h["text"] for h in json.loads(capsys.readouterr().out)[0]["hits"]] == [
        "one two",
        "three",
    ]


def test_embed_to_a_file_that_is_no_npy_fails_with_a_clear_error(fake_client, tmp_path, capsys):
    corpus = tmp_path / "ok.txt"
    corpus.write_text("one\n")
    assert main(["embed", str(corpus), "-o", "/dev/full", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "->" not in captured.out
    assert "error: -o /dev/full is a file; name a folder (or a .npy file)" in captured.err
    assert fake_client.made == []  # nothing was embedded


@pytest.mark.parametrize("flag", ["-o", "--parquet", "--summary-json"])
def test_unwritable_outputs_fail_before_embedding(fake_client, tmp_path, capsys, flag):
    corpus = tmp_path / "ok.txt"
    corpus.write_text("one\n")
    paths = {"-o": tmp_path / "v.npy", "--parquet": None, "--summary-json": None}
    paths[flag] = tmp_path  # a folder: no file can be written there
    if flag == "-o":  # a folder is an output folder; a folder named like a .npy file is not
        paths[flag] = tmp_path / "d.npy"
        paths[flag].mkdir()
    argv = ["embed", str(corpus), "--no-progress"]
    argv += [arg for f, p in paths.items() if p is not None for arg in (f, str(p))]
    assert main(argv) == 1
    assert fake_client.made == []  # nothing was embedded
    assert f"error: cannot write {flag} {paths[flag]}: Is a directory" in capsys.readouterr().err
    assert not (tmp_path / "v.npy").exists()


def test_the_writability_check_leaves_no_file_behind(fake_client, tmp_path, capsys):
    corpus = tmp_path / "ok.txt"
    corpus.write_text("one\n")
    out, parquet = tmp_path / "new" / "v.npy", tmp_path / "new" / "v.parquet"
    argv = ["embed", str(corpus), "-o", str(out), "--parquet", str(parquet), "--no-progress"]
    assert main([*argv, "--summary-json", str(tmp_path)]) == 1
    assert not out.exists() and not parquet.exists()


def test_summary_says_text_or_texts(fake_client, tmp_path, capsys):
    corpus = tmp_path / "one.txt"
    corpus.write_text("alone\n")
    assert main(["embed", str(corpus), "-o", str(tmp_path / "v.npy"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("embedded 1 text (3 tokens, dim 2)")


# --- query --embeddings ------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, what",
    [
        (b"one two\nthree\n", "not a .npy file"),
        (b"", "not a .npy file"),
        (None, "does not hold"),  # a .npy of another shape
    ],
)
def test_query_with_embeddings_that_are_not_an_embed_output(
    fake_client, tmp_path, capsys, content, what
):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a\nb\n")
    emb = tmp_path / "e.npy"
    if content is None:
        np.save(emb, np.arange(2.0))
    else:
        emb.write_bytes(content)
    argv = ["query", "q", "--embeddings", str(emb), "--corpus", str(corpus)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pickle" not in err
    assert f"--embeddings {emb}" in err and what in err
    assert "written by 'triton-embed embed'" in err


def test_query_with_missing_embeddings_points_at_the_npy_next_to_it(fake_client, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a\n")
    np.save(tmp_path / "vec.npy", np.eye(1, 2, dtype=np.float32))
    argv = ["query", "q", "--embeddings", str(tmp_path / "vec"), "--corpus", str(corpus)]
    assert main(argv) == 1
    assert f"did you mean {tmp_path / 'vec.npy'}?" in capsys.readouterr().err


# --- errors of one text, over the real client and a stand-in server ------------------------


def test_an_empty_jsonl_record_is_named_by_its_line_and_the_cli_flag(fake_triton, tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    lines = [f'{{"text": "t{i}"}}' for i in range(7)]
    lines[3] = ""  # a blank line: skipped, but it still counts as a line
    lines[5] = '{"text": ""}'  # the 5th text (index 4), on line 6, in the 2nd request
    corpus.write_text("\n".join(lines) + "\n")
    argv = ["embed", str(corpus), "-o", str(tmp_path / "v.npy"), "--no-progress"]
    assert main([*argv, "--batch-size", "2"]) == 1
    err = capsys.readouterr().err
    assert f"error: {corpus}:6: the text is empty; send at least one character, or pass " in err
    assert "--allow-empty to embed it" in err
    assert "request parameter" not in err and "texts[" not in err
    assert main([*argv, "--allow-empty"]) == 0


def test_an_over_long_line_is_named_by_its_line_and_the_cli_flag(fake_triton, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a\n\nb\nc\nd\ne\n" + "w " * 20 + "\n")  # line 7, text 5
    argv = ["embed", str(corpus), "-o", str(tmp_path / "v.npy"), "--no-progress"]
    assert main([*argv, "--truncation", "NONE"]) == 1
    err = capsys.readouterr().err
    assert f"error: {corpus}:7: the text has 22 tokens; the model accepts 8; shorten it or " in err
    assert "pass --truncation END or START" in err and "request parameter" not in err


def test_a_lone_surrogate_in_jsonl_is_named_by_its_line(fake_triton, tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "ok"}\n\n{"text": "a\\ud800b"}\n')  # a JSON escape
    argv = ["embed", str(corpus), "-o", str(tmp_path / "v.npy"), "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"error: {corpus}:3: the text " in err and "U+D800" in err
    assert "Traceback" not in err and fake_triton.requests == []


def test_a_bad_query_is_named_by_its_position(fake_triton, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a\n")
    np.save(tmp_path / "e.npy", np.eye(1, 2, dtype=np.float32))
    argv = ["query", "fine", "", "--embeddings", str(tmp_path / "e.npy"), "--corpus", str(corpus)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "error: query 2: the text is empty;" in err and "pass --allow-empty" in err


def test_two_outputs_on_one_file_are_refused_before_embedding(fake_client, tmp_path, capsys):
    corpus = tmp_path / "ok.txt"
    corpus.write_text("one\n")
    out = tmp_path / "v.npy"
    argv = ["embed", str(corpus), "-o", str(out), "--summary-json", str(out), "--no-progress"]
    assert main(argv) == 1
    assert f"-o and --summary-json name the same file, {out}" in capsys.readouterr().err
    assert fake_client.made == []


@pytest.mark.parametrize(
    "retries, words",
    [(1, "; 1 request sent again after the server refused it"), (3, "; 3 requests sent again")],
)
def test_summary_says_request_or_requests(
    fake_client, tmp_path, capsys, monkeypatch, retries, words
):
    def with_retries(self, texts, on_batch_done=None):
        return EmbedResult(
            np.ones((len(texts), 2), np.float32), np.ones(len(texts), np.int32), [0.01], retries
        )

    monkeypatch.setattr(FakeClient, "embed_with_details", with_retries)
    corpus = tmp_path / "two.txt"
    corpus.write_text("a\nb\n")
    assert main(["embed", str(corpus), "-o", str(tmp_path / "v.npy"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("embedded 2 texts (2 tokens, dim 2)") and words in printed


def test_a_server_command_that_cannot_be_imported_fails_with_one_line(monkeypatch, capsys):
    from importlib.metadata import EntryPoint

    from triton_embed import cli

    missing = EntryPoint("gateway", "no_such_server_package.command:register", cli.COMMANDS_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [missing])
    assert cli.main(["gateway", "--upstream", "h:1"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "triton-embed gateway: error: gateway needs the server package and its dependencies "
        "(No module named 'no_such_server_package'); install triton-embed[gateway,serve] on "
        "the serving host\n"
    )


# --- embed into an output folder, over a stand-in upstream pool ------------------------------

BULK_DIM = 4
# name, max_batch_size, tokenizer, embedder, their max_batch_size
BULK_MODEL = ModelInfo("embed", 4, "embed_tokenizer", "embed_embedder", 4, 4, dimension=BULK_DIM)


class StandInPool(PoolLifecycle):
    """Stands in for ``UpstreamPool`` under the bulk job: serves :data:`BULK_MODEL`.

    Records the request parameters of each call; text ``t`` embeds to ``len(t)`` repeated in
    the asked ``dimensions`` (float16 for ``embedding_type=float16``).
    """

    sent: list[dict] = []

    def __init__(self, targets, admin_key=None, timeout_s=None):
        self.catalog = Catalog.build([BULK_MODEL])

    def describe(self) -> list[dict]:
        return []

    async def infer(self, model, inputs, outputs, parameters=None):
        assert model == "embed"
        ((_, texts),) = inputs.items()
        parameters = dict(parameters or {})
        StandInPool.sent.append(parameters)
        dtype = "<f2" if parameters.get("embedding_type") == "float16" else "<f4"
        width = parameters.get("dimensions", BULK_DIM)
        vectors = [np.full(width, len(bytes(t)), dtype).tobytes() for t in texts]
        counts = np.full(len(texts), 3, "<i4").tobytes()
        return {"EMBEDDING": frame_bytes(vectors), "NUM_TOKENS": counts}


@pytest.fixture
def stand_in_pool(monkeypatch):
    StandInPool.sent = []
    monkeypatch.setattr(pool_embedder, "UpstreamPool", StandInPool)
    return StandInPool


def embed_into_folder(tmp_path, *flags: str) -> dict:
    """``embed`` of three texts into a folder; returns the manifest's job parameters."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("one\ntwo\nthree\n")
    out = tmp_path / "out"
    argv = ["embed", str(corpus), "-o", str(out), "--no-progress", "--url", "127.0.0.1:1"]
    assert main([*argv, *flags]) == 0
    return json.loads((out / "_manifest.json").read_text())["job"]["parameters"]


@pytest.mark.parametrize(
    "flags, normalize",
    [([], None), (["--normalize", "true"], True), (["--normalize", "false"], False)],
)
def test_embed_into_a_folder_sends_normalize(stand_in_pool, tmp_path, flags, normalize):
    recorded = embed_into_folder(tmp_path, *flags)
    sent = {"input_type": "document"} | ({} if normalize is None else {"normalize": normalize})
    assert stand_in_pool.sent == [sent]  # three texts: one request
    assert recorded == sent  # a rerun with another --normalize is another job


def test_embed_into_a_folder_sends_every_request_option(stand_in_pool, tmp_path):
    flags = ["--truncation", "start", "--allow-empty", "--input-type", "query", "--dimensions",
             "2", "--embedding-type", "float16", "--normalize", "false"]  # fmt: skip
    recorded = embed_into_folder(tmp_path, *flags)
    sent = {
        "truncation": "START",
        "allow_empty": True,
        "input_type": "query",
        "dimensions": 2,
        "embedding_type": "float16",
        "normalize": False,
    }
    assert stand_in_pool.sent == [sent]
    assert recorded == sent
    table = pq.read_table(tmp_path / "out")
    assert table.column("embedding").to_pylist() == [[3.0, 3.0], [3.0, 3.0], [5.0, 5.0]]
    assert table.schema.field("embedding").type.value_type == "halffloat"


def test_a_blank_input_type_is_refused_before_any_request(stand_in_pool, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one\n")
    for out in (tmp_path / "out", tmp_path / "v.npy"):
        assert main(["embed", str(corpus), "-o", str(out), "--input-type", " "]) == 1
        err = capsys.readouterr().err
        assert "error: input_type=' ' must be a prompt name such as query or document" in err
    assert stand_in_pool.sent == []


def test_embed_into_a_npy_sends_normalize(fake_triton, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one\n")
    argv = ["embed", str(corpus), "-o", str(tmp_path / "v.npy"), "--no-progress"]
    for flags in ([], ["--normalize", "true"], ["--normalize", "false"]):
        assert main([*argv, *flags]) == 0
    batch = {"priority_class": "batch"}  # the CLI's default class, for the engine step
    assert fake_triton.parameters == [
        {"input_type": "document", **batch},
        {"input_type": "document", "normalize": True, **batch},
        {"input_type": "document", "normalize": False, **batch},
    ]


def test_query_sends_its_option_flags(fake_triton, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a\n")
    np.save(tmp_path / "e.npy", np.eye(1, 2, dtype=np.float32))
    argv = ["query", "q", "--embeddings", str(tmp_path / "e.npy"), "--corpus", str(corpus)]
    assert main([*argv, "--dimensions", "2", "--normalize", "false", "--truncation", "end"]) == 0
    assert main([*argv, "--input-type", "document"]) == 0
    interactive = {"priority_class": "interactive"}  # query's default class
    assert fake_triton.parameters == [
        {"truncation": "END", "input_type": "query", "dimensions": 2, "normalize": False,
         **interactive},
        {"input_type": "document", **interactive},
    ]  # fmt: skip
