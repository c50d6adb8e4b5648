"""EmbeddingClient.rerank and ``triton-embed rerank`` without a server: order, pieces, errors.

The gRPC client is :class:`tests.fake_triton.FakeTriton`, which serves a reranker ``rerank``
(``max_batch_size`` 4; a pair's raw score is the number of the query's words in the
document, minus 1).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from triton_embed import EmbeddingClient, InvalidInputError, RerankResult
from triton_embed.cli import main

from tests import fake_triton as fake_server

DOCUMENTS = [
    "a panda is a bear",  # 2 of the query's words: raw 1
    "cars are fast",  # 0: raw -1
    "the giant panda does eat bamboo",  # 4: raw 3
    "bears sleep",  # 0
    "giant trees",  # 1: raw 0
    "panda",  # 1
]
QUERY = "what does a giant panda eat"


@pytest.fixture
def fake_triton(monkeypatch):
    return fake_server.install(monkeypatch)


def test_rerank_ranks_best_first_with_ties_by_lower_index(fake_triton):
    with EmbeddingClient("h:1", model="rerank") as client:
        result = client.rerank(QUERY, DOCUMENTS)
    assert isinstance(result, RerankResult)
    assert result.indices.tolist() == [2, 0, 4, 5, 1, 3]
    assert result.scores.dtype == np.float32
    raw = np.array([3, 1, 0, 0, -1, -1], np.float32)
    assert np.allclose(result.scores, 1 / (1 + np.exp(-raw)))
    tokens = [len(QUERY.split()) + len(d.split()) + 3 for d in DOCUMENTS]
    assert result.num_tokens.tolist() == tokens
    # 6 documents, max_batch_size 4: two requests, the query on every row
    assert sorted(len(r) for r in fake_triton.requests) == [2, 4]
    assert fake_triton.parameters == [{}, {}]
    assert len(result.latencies_s) == 2 and result.retries == 0


def test_top_n_raw_scores_and_options_are_sent(fake_triton):
    with EmbeddingClient("h:1") as client:  # an embedding client reranks with model=
        result = client.rerank(
            QUERY,
            DOCUMENTS,
            model="rerank",
            top_n=2,
            raw_scores=True,
            truncation="ONLY_SECOND",
            max_document_tokens=100,
            instruction="Find the answer",
        )
    assert result.indices.tolist() == [2, 0] and result.scores.tolist() == [3.0, 1.0]
    assert len(result.num_tokens) == len(DOCUMENTS)  # every document's count
    assert fake_triton.parameters[0] == {
        "truncation": "only_second",
        "raw_scores": True,
        "max_document_tokens": 100,
        "instruction": "Find the answer",
    }


def test_batch_size_and_the_progress_callback(fake_triton):
    done = []
    with EmbeddingClient("h:1", model="rerank", batch_size=2) as client:
        result = client.rerank_with_details(QUERY, DOCUMENTS, lambda n, t: done.append((n, t)))
    assert [len(r) for r in fake_triton.requests] == [2, 2, 2]
    assert sorted(n for n, _ in done) == [2, 2, 2]
    assert sum(t for _, t in done) == int(result.num_tokens.sum())


def test_a_refused_document_is_named_by_its_index_in_the_callers_list(fake_triton):
    documents = ["a", "b", "c", "d", "e", " ", "g"]
    with EmbeddingClient("h:1", model="rerank") as client:
        with pytest.raises(InvalidInputError) as caught:
            client.rerank("q", documents)
    assert caught.value.index == 5
    assert str(caught.value).startswith(
        "documents[5] was rejected: in ensemble 'rerank', the document of pair 1 is empty"
    )
    assert "(pair 1 of the request that sent documents[4:7])" in str(caught.value)


@pytest.mark.parametrize(
    "query, documents, kwargs, message",
    [
        ("q", [], {}, "documents is empty; send at least one document to rank"),
        ("q", "one text", {}, "documents must be a sequence of texts, not a single str/bytes"),
        ("", ["d"], {}, "query is empty; send the text the documents are ranked against"),
        ("  ", ["d"], {}, "query is empty"),
        (None, ["d"], {}, "query must be str or bytes, got NoneType"),
        ("q", ["d", 3], {}, r"documents\[1\] must be str or bytes, got int"),
        ("q", ["d", "a\ud800"], {}, r"documents\[1\] holds a lone surrogate, U\+D800"),
        (
            "q",
            ["d"] * 1001,
            {},
            "1001 documents; at most 1000 are reranked per call \\(max_documents=\\): rerank "
            "the first-stage results in slices of at most 1000, or pass a larger max_documents=",
        ),
        ("q", ["d"] * 3, {"max_documents": 2}, "3 documents; at most 2 are reranked per call"),
        ("q", ["d"], {"top_n": 0}, "top_n must be a whole number >= 1, got 0"),
        ("q", ["d"], {"top_n": True}, "top_n must be a whole number >= 1, got True"),
        ("q", ["d"], {"truncation": "END"}, "truncation='END' is not one of longest_first"),
        ("q", ["d"], {"max_document_tokens": 0}, "max_document_tokens"),
        ("q", ["d"], {"timeout_s": 0}, "timeout_s must be a finite number of seconds > 0, got 0"),
    ],
)
def test_bad_calls_are_refused_before_anything_is_sent(
    fake_triton, query, documents, kwargs, message
):
    with EmbeddingClient("h:1", model="rerank") as client:
        with pytest.raises(InvalidInputError, match=message):
            client.rerank(query, documents, **kwargs)
    assert fake_triton.requests == []


def test_1000_documents_are_reranked_in_requests_of_max_batch_size(fake_triton):
    documents = [f"doc {i} panda" if i % 7 == 0 else f"doc {i}" for i in range(1000)]
    with EmbeddingClient("h:1", model="rerank", max_concurrency=8) as client:
        result = client.rerank("panda", documents, top_n=3)
    assert len(fake_triton.requests) == 250
    assert result.indices.tolist() == [0, 7, 14]  # the tied best, in input order


def test_each_kind_of_model_refuses_the_other_call_by_name(fake_triton):
    with EmbeddingClient("h:1") as client:
        with pytest.raises(InvalidInputError) as caught:
            client.rerank("q", ["d"])  # the client's model: embed
        assert str(caught.value) == (
            "model 'embed' is an embedding model; rerank() needs a reranker: call embed() "
            "with it, or pass model= the name of a reranker"
        )
        with pytest.raises(InvalidInputError) as caught:
            client.embed(["text"], model="rerank")
        assert str(caught.value) == (
            "model 'rerank' is a reranker; embed() needs an embedding model: call rerank() "
            "with it, or pass model= the name of an embedding model"
        )
    assert fake_triton.requests == []


# ---- triton-embed rerank ------------------------------------------------------------------


def write_documents(tmp_path, lines: list[str], name: str = "docs.txt"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_cli_prints_the_ranking_best_first(fake_triton, tmp_path, capsys):
    docs = write_documents(tmp_path, [DOCUMENTS[0], "", *DOCUMENTS[1:]])  # a blank line
    assert main(["rerank", QUERY, "--documents", str(docs), "--top-n", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"query: {QUERY}"
    assert out[1] == f"  1. [{1 / (1 + np.exp(-3)):.4f}] #2: the giant panda does eat bamboo"
    assert out[2].startswith("  2. [0.7311] #0: a panda is a bear")
    assert out[3].startswith("  3. [0.5000] #4: giant trees")
    assert len(out) == 4
    assert fake_triton.parameters == [{}, {}]  # no option flag: the server's defaults


def test_the_cli_json_output_and_option_flags(fake_triton, tmp_path, capsys):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"body": d}) + "\n" for d in DOCUMENTS))
    argv = ["rerank", QUERY, "--documents", str(docs), "--field", "body", "--json",
            "--raw-scores", "--truncation", "NONE", "--max-document-tokens", "64",
            "--instruction", "Judge it", "--model", "rerank", "--url", "h:1",
            "-n", "2"]  # fmt: skip
    assert main(argv) == 0
    ranking = json.loads(capsys.readouterr().out)
    assert ranking["query"] == QUERY and ranking["model"] == "rerank"
    assert ranking["results"] == [
        {"rank": 1, "index": 2, "score": 3.0, "document": DOCUMENTS[2]},
        {"rank": 2, "index": 0, "score": 1.0, "document": DOCUMENTS[0]},
    ]
    assert ranking["tokens"] == sum(len(QUERY.split()) + len(d.split()) + 3 for d in DOCUMENTS)
    assert fake_triton.parameters[0] == {
        "truncation": "none",
        "raw_scores": True,
        "max_document_tokens": 64,
        "instruction": "Judge it",
    }


def test_the_cli_names_a_refused_document_by_its_line(fake_triton, tmp_path, capsys):
    docs = tmp_path / "docs.jsonl"
    records = [{"text": "a"}, {"text": "b"}, {"text": "c"}, {"text": "d"}, {"text": "e"},
               {"text": "   "}]  # fmt: skip
    docs.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["rerank", "q", "--documents", str(docs)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"triton-embed rerank: error: {docs}:6: documents[5] was rejected: in ensemble "
        "'rerank', the document of pair 1 is empty"
    )


def test_the_cli_refuses_an_empty_file_and_too_many_documents(fake_triton, tmp_path, capsys):
    empty = write_documents(tmp_path, [""], "empty.txt")
    assert main(["rerank", "q", "--documents", str(empty)]) == 1
    assert f"{empty} holds no documents" in capsys.readouterr().err
    docs = write_documents(tmp_path, ["a", "b", "c"])
    assert main(["rerank", "q", "--documents", str(docs), "--max-documents", "2"]) == 1
    assert "3 documents; at most 2 are reranked per call" in capsys.readouterr().err
    assert main(["rerank", "q", "--documents", str(docs), "--model", "embed"]) == 1
    assert "model 'embed' is an embedding model; rerank() needs a reranker" in (
        capsys.readouterr().err
    )
    assert fake_triton.requests == []


def test_the_bulk_job_refuses_a_reranker_by_name(monkeypatch, tmp_path, capsys):
    from triton_embed.bulk import pool_embedder
    from triton_embed.transport.catalog import Catalog

    from tests.unit.gateway_fakes import rerank_info
    from tests.unit.test_cli import StandInPool

    class RerankerOnly(StandInPool):
        def __init__(self, *args, **kwargs):
            self.catalog = Catalog.build([rerank_info(4)])

    monkeypatch.setattr(pool_embedder, "UpstreamPool", RerankerOnly)
    corpus = write_documents(tmp_path, ["one", "two"], "c.txt")
    argv = ["embed", str(corpus), "-o", str(tmp_path / "out"), "--no-progress",
            "--url", "127.0.0.1:1", "--model", "rerank"]  # fmt: skip
    assert main(argv) == 1
    assert (
        "model 'rerank' is a reranker; the bulk job writes the vectors of an embedding, a "
        "sparse, a multi-vector or a hybrid model: pass --model the name of one"
    ) in capsys.readouterr().err
