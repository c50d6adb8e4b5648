"""The gateway's rerank and score routes against a test double of its upstreams (no server).

``RerankPool`` serves the embedding ensemble of ``test_gateway_app`` and a reranker
``rerank`` (alias ``BAAI/bge-reranker-base``, ``max_batch_size`` 4): a pair's raw score is
the number of the query's words in the document, minus 1, its score the sigmoid of that
(``raw_scores``: the raw one); it has ``words(query) + words(document) + 3`` tokens.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from triton_embed.transport.catalog import Catalog
from tritonclient.utils import InferenceServerException

from tests.unit.gateway_fakes import rerank_info
from tests.unit.test_gateway_app import MODEL, FakeUpstreamPool, make_client, post

RERANKER = rerank_info(
    4, served_model_name="BAAI/bge-reranker-base", max_length=512, family="cross_encoder"
)
QUERY = "what does a giant panda eat"
DOCUMENTS = [
    "a panda is a bear",  # {a, panda}: raw 1
    "cars are fast",  # raw -1
    "the giant panda does eat bamboo",  # {giant, panda, does, eat}: raw 3
    "bears sleep",  # raw -1
    "giant trees",  # raw 0
    "panda",  # raw 0
]
RAW = [1.0, -1.0, 3.0, -1.0, 0.0, 0.0]
ORDER = [2, 0, 4, 5, 1, 3]  # ties by lower index


def sigmoid(x: float) -> float:
    return float(np.float32(1 / (1 + np.exp(-np.float32(x)))))


def tokens(query: str, documents: list[str]) -> int:
    return sum(len(query.split()) + len(d.split()) + 3 for d in documents)


class RerankPool(FakeUpstreamPool):
    """``FakeUpstreamPool`` with a reranker ``rerank`` beside ``embed``."""

    def __init__(self, rerankers=(RERANKER,), **kwargs):
        super().__init__(Catalog.build([MODEL, *rerankers]), **kwargs)

    async def infer(self, model, inputs, outputs, parameters=None):
        if "QUERY" not in inputs:
            return await super().infer(model, inputs, outputs, parameters)
        queries, documents = list(inputs["QUERY"]), list(inputs["DOCUMENT"])
        self.calls.append((model, len(documents), dict(parameters or {})))
        if self.fail is not None and (
            self.fail_on_piece is None or self.fail_on_piece == len(self.calls) - 1
        ):
            raise self.fail
        pairs = [
            (bytes(q).split(), bytes(d).split()) for q, d in zip(queries, documents, strict=True)
        ]
        raw = np.array([len(set(q) & set(d)) - 1.0 for q, d in pairs], "<f4")
        scores = raw if (parameters or {}).get("raw_scores") else 1 / (1 + np.exp(-raw))
        counts = np.array([len(q) + len(d) + 3 for q, d in pairs], "<i4")
        return {"SCORE": scores.astype("<f4").tobytes(), "NUM_TOKENS": counts.tobytes()}


@pytest.fixture
def client():
    test_client, pool, _ = make_client(RerankPool())
    return test_client, pool


def body(**fields):
    return {"model": "rerank", "query": QUERY, "documents": DOCUMENTS, **fields}


# ---- Cohere / Jina ------------------------------------------------------------------------


def test_v2_rerank_answers_cohere_and_jinas_shape_best_first(client):
    c, pool = client
    r = post(c, "/v2/rerank", body())
    assert r.status_code == 200, r.text
    answer = r.json()
    assert set(answer) == {"id", "model", "results", "meta", "usage"}
    uuid.UUID(answer["id"])
    assert answer["model"] == "rerank"
    assert answer["results"] == [{"index": i, "relevance_score": sigmoid(RAW[i])} for i in ORDER]
    n = tokens(QUERY, DOCUMENTS)
    assert answer["meta"] == {
        "api_version": {"version": "2"},
        "billed_units": {"search_units": 1},
        "tokens": {"input_tokens": n},
    }
    assert answer["usage"] == {"prompt_tokens": n, "total_tokens": n}
    assert sorted(size for _, size, _ in pool.calls) == [2, 4]  # max_batch_size 4
    assert all(p == {} for _, _, p in pool.calls)  # no option: the server's defaults


def test_v1_rerank_takes_objects_top_n_return_documents_and_options(client):
    c, pool = client
    documents = [{"text": d, "id": f"doc-{i}"} for i, d in enumerate(DOCUMENTS)]
    fields = {"documents": documents, "top_n": 2, "return_documents": True,
              "max_tokens_per_doc": 128, "use_activation": False, "instruction": "Judge it",
              "rank_fields": ["text"], "model": "BAAI/bge-reranker-base"}  # fmt: skip
    r = post(c, "/v1/rerank", body(**fields))
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "BAAI/bge-reranker-base"  # as requested
    assert r.json()["results"] == [
        {"index": 2, "relevance_score": 3.0, "document": {"text": DOCUMENTS[2]}},
        {"index": 0, "relevance_score": 1.0, "document": {"text": DOCUMENTS[0]}},
    ]
    assert pool.calls[0][0] == "rerank"
    assert pool.calls[0][2] == {
        "raw_scores": True,
        "max_document_tokens": 128,
        "instruction": "Judge it",
    }


def test_a_request_without_model_uses_the_only_reranker_and_priority_user_are_ignored(client):
    c, _ = client
    fields = {"query": "panda", "documents": ["panda", "car"], "priority": 3, "user": "me"}
    r = post(c, "/v2/rerank", fields)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "rerank"
    assert [x["index"] for x in r.json()["results"]] == [0, 1]


def test_1000_documents_are_split_concurrently_and_1001_are_413(client):
    c, pool = client
    documents = [f"doc {i} panda" if i % 9 == 0 else f"doc {i}" for i in range(1000)]
    r = post(c, "/v1/rerank", body(query="panda", documents=documents, top_n=3))
    assert r.status_code == 200, r.text
    assert [x["index"] for x in r.json()["results"]] == [0, 9, 18]
    assert len(pool.calls) == 250 and {size for _, size, _ in pool.calls} == {4}
    assert r.json()["meta"]["billed_units"] == {"search_units": 10}
    pool.calls.clear()
    r = post(c, "/v1/rerank", body(documents=["d"] * 1001))
    assert r.status_code == 413
    assert r.json() == {
        "message": "'documents' has 1001 documents; at most 1000 are reranked per request; "
        "split them over several requests"
    }
    assert pool.calls == []


COHERE_BAD = [
    (body(documents=[]), "'documents' is an empty list; send at least one document"),
    (
        {"model": "rerank", "documents": ["d"]},
        "'query' is required: the text the documents are ranked against",
    ),  # fmt: skip
    (body(query="  "), "'query' is empty; send the text the documents are ranked against"),
    (body(query=3), "'query' must be a string, got 3"),
    (
        {"model": "rerank", "query": "q"},
        "'documents' is required: a list of strings or of objects {\"text\": ...}",
    ),  # fmt: skip
    (
        body(documents=["a", ""]),
        "documents[1] is empty; send at least one non-blank character in each document",
    ),  # fmt: skip
    (
        body(documents=["a", 3]),
        "documents[1] is 3; 'documents' must be a list of strings or of objects {\"text\": ...}",
    ),  # fmt: skip
    (
        body(documents=[{"title": "x"}]),
        "documents[0] is an object of 1 fields; 'documents' "
        'must be a list of strings or of objects {"text": ...}',
    ),  # fmt: skip
    (
        body(top_n=0),
        "'top_n' must be a whole number >= 1 (the best results to return; leave it "
        "out for all); got 0",
    ),  # fmt: skip
    (
        body(top_n=1.5),
        "'top_n' must be a whole number >= 1 (the best results to return; leave "
        "it out for all); got 1.5",
    ),  # fmt: skip
    (body(max_tokens_per_doc=0), "'max_tokens_per_doc' must be a whole number >= 1; got 0"),
    (
        body(max_tokens_per_doc="9"),
        "'max_tokens_per_doc' must be a whole number >= 1 (tokens kept per document); got '9'",
    ),  # fmt: skip
    (body(return_documents="yes"), "'return_documents' must be true or false, got 'yes'"),
    (
        body(rank_fields=["title"]),
        "'rank_fields' may only be [\"text\"]: the reranker ranks "
        "each document's text; got a list of 1 items",
    ),  # fmt: skip
    (
        body(instruction=""),
        "'instruction' must be a non-empty text of at most 2048 characters; got ''",
    ),  # fmt: skip
    (
        body(foo=1),
        "unknown field 'foo'; the fields are model, query, documents, top_n, "
        "return_documents, max_tokens_per_doc, rank_fields, instruction, use_activation, "
        "priority, user",
    ),  # fmt: skip
    (body(model=""), "'model' must be a non-empty string"),
    ([1], "the request body must be a JSON object"),
]


@pytest.mark.parametrize("request_body, message", COHERE_BAD)
def test_bad_rerank_requests_are_400_in_cohere_envelope(client, request_body, message):
    c, pool = client
    for path in ("/v1/rerank", "/v2/rerank"):
        r = post(c, path, request_body)
        assert r.status_code == 400, (path, r.text)
        if path == "/v2/rerank":  # strings only
            message = message.replace(' or of objects {"text": ...}', "")
        assert r.json() == {"message": message}
    assert pool.calls == []


def test_v2_takes_strings_only(client):
    c, _ = client
    r = post(c, "/v2/rerank", body(documents=[{"text": "a"}]))
    assert r.status_code == 400
    assert r.json() == {
        "message": "documents[0] is an object of 1 fields; 'documents' must be a list of strings"
    }


def test_a_pair_the_server_refused_is_named_by_its_index_in_the_documents(client):
    c, pool = client
    pool.fail = InferenceServerException(
        msg="in ensemble 'rerank', pair 1 has 700 tokens; the model reads 512 per pair; shorten "
        "it or set the request parameter truncation=longest_first or only_second",
        status="StatusCode.INVALID_ARGUMENT",
    )
    pool.fail_on_piece = 1  # the second piece: documents 4 and 5
    r = post(c, "/v1/rerank", body())
    assert r.status_code == 400
    assert r.json()["message"].startswith("in ensemble 'rerank', pair 5 has 700 tokens")


def test_teis_rerank_tells_an_over_long_pair_to_send_truncate_true(client):
    """TEI's route has no ``truncation`` field: the server's advice is put in its words."""
    c, pool = client
    pool.fail = InferenceServerException(
        msg="in ensemble 'rerank', pair 0 has 700 tokens; the model reads 512 per pair; shorten "
        "it or set the request parameter truncation=longest_first or only_second",
        status="StatusCode.INVALID_ARGUMENT",
    )
    r = post(c, "/rerank", {"query": QUERY, "texts": DOCUMENTS[:2]})
    assert r.status_code == 400
    assert r.json()["error"].endswith('512 per pair; shorten it or send "truncate": true')
    r = post(c, "/v1/rerank", body())  # Cohere's envelope keeps the parameter's name
    assert r.json()["message"].endswith("truncation=longest_first or only_second")


def test_an_over_long_document_is_cut_as_the_pair_tokenizer_cuts_it_unless_truncation_is_off():
    """A 2 MB document is truncated like TEI and Cohere do, not refused for its size."""
    model = rerank_info(4, max_length=512, max_chars=100)
    pool = RerankPool(rerankers=(model,))
    seen = []
    infer = pool.infer

    async def spy(name, inputs, outputs, parameters=None):
        seen.extend(bytes(d) for d in inputs.get("DOCUMENT", []))
        return await infer(name, inputs, outputs, parameters)

    pool.infer = spy
    c, _, _ = make_client(pool)
    huge = "é" + "panda " * 350_000  # 2.1 MB
    r = post(c, "/v2/rerank", body(documents=[huge, "a panda"]))
    assert r.status_code == 200, r.text
    assert seen == [huge[:100].encode(), b"a panda"]
    r = post(c, "/rerank", {"query": QUERY, "texts": [huge], "truncate": False})
    assert seen[-1] == huge.encode()  # truncation off: the server refuses it, naming the cap


def test_the_token_budget_bounds_a_rerank_request():
    c, _, _ = make_client(RerankPool(), max_request_tokens=20)
    r = post(c, "/v2/rerank", body())
    assert r.status_code == 400
    assert r.json()["message"].startswith("the request is over the gateway's token budget: ")
    assert "at most 20 tokens" in r.json()["message"]


def test_upstream_failures_keep_their_statuses_in_cohere_envelope(client):
    c, pool = client
    pool.fail = InferenceServerException(
        msg="in ensemble 'rerank', [request id: <id_unknown>] Exceeds maximum queue size",
        status="StatusCode.UNAVAILABLE",
    )
    r = post(c, "/v2/rerank", body())
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert "every upstream is overloaded" in r.json()["message"]


# ---- kinds, default reranker, listing -------------------------------------------------------


def test_a_request_for_the_other_kind_of_model_is_400_naming_its_kind_and_routes(client):
    c, pool = client
    r = post(c, "/v1/embeddings", {"model": "rerank", "input": "x"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("model", "wrong_model_kind")
    assert error["message"] == (
        "the model 'rerank' is a reranker, not an embedding model: rerankers are served by "
        "POST /v1/rerank, /v2/rerank, /rerank, /score, /v1/score, embedding models by POST "
        "/v1/embeddings, /embed (and TEI's POST /, /invocations); GET /v1/models lists each "
        "model's kind"
    )
    r = post(c, "/v2/rerank", body(model="embed"))
    assert r.status_code == 400
    assert r.json()["message"].startswith(
        "the model 'embed' is an embedding model, not a reranker: embedding models are "
        "served by POST /v1/embeddings, /embed"
    )
    r = post(c, "/score", {"model": "org/model", "text_1": "a", "text_2": "b"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_model_kind"
    c2, _, _ = make_client(RerankPool(), default_model="rerank")
    r = post(c2, "/embed", {"inputs": "x"})
    assert r.status_code == 400 and r.json()["error_type"] == "Validation"
    assert "the model 'rerank' is a reranker, not an embedding model" in r.json()["error"]
    assert pool.calls == []


def test_several_rerankers_need_a_model_or_the_default_reranker():
    other = rerank_info(4, name="other")
    c, pool, _ = make_client(RerankPool((RERANKER, other)))
    fields = {"query": "q", "documents": ["d"]}
    r = post(c, "/v2/rerank", fields)
    assert r.status_code == 400
    assert r.json() == {
        "message": "several rerankers are served (other, rerank): send 'model', or start the "
        "gateway with --default-reranker"
    }
    c, pool, _ = make_client(RerankPool((RERANKER, other)), default_reranker="other")
    assert post(c, "/v2/rerank", fields).status_code == 200
    assert pool.calls[-1][0] == "other"


def test_no_reranker_is_404():
    c, _, _ = make_client(FakeUpstreamPool())
    r = post(c, "/v2/rerank", {"query": "q", "documents": ["d"]})
    assert r.status_code == 404
    assert r.json()["message"].startswith("no reranker is served")
    r = post(c, "/v2/rerank", {"model": "nope", "query": "q", "documents": ["d"]})
    assert r.status_code == 404
    assert r.json()["message"].startswith("the model 'nope' does not exist; the models are: ")


def test_models_and_info_report_the_kind(client):
    c, _ = client
    listed = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert listed["rerank"]["kind"] == "reranker" and listed["embed"]["kind"] == "embedding"
    assert listed["BAAI/bge-reranker-base"]["root"] == "rerank"
    assert listed["rerank"]["dimension"] is None and listed["rerank"]["max_length"] == 512
    c2, _, _ = make_client(RerankPool(), default_model="rerank")
    info = c2.get("/info").json()
    assert info["model_type"] == {
        "reranker": {
            "id2label": {"0": "LABEL_0"},
            "label2id": {"LABEL_0": 0},
            "family": "cross_encoder",
        }
    }
    assert info["model_id"] == "BAAI/bge-reranker-base"
    assert info["max_input_length"] == 512 and info["max_client_batch_size"] == 1000
    assert "embedding" in c.get("/info").json()["model_type"]


def test_metrics_count_rerank_requests_pairs_and_tokens(client):
    c, _ = client
    post(c, "/v1/rerank", body())
    post(c, "/v2/rerank", body(documents=[]))  # 400: no pairs counted
    post(c, "/v1/embeddings", {"model": "embed", "input": ["a b", "c"]})
    text = c.get("/metrics").text
    n = tokens(QUERY, DOCUMENTS)
    assert (
        'triton_embed_gateway_requests_total{model="rerank",route="/v1/rerank",status="200"} 1.0'
        in text
    )
    assert 'triton_embed_gateway_inputs_total{model="rerank",route="/v1/rerank"} 6.0' in text
    assert f'triton_embed_gateway_tokens_total{{model="rerank",route="/v1/rerank"}} {n}.0' in text
    assert 'route="/v2/rerank"} ' not in text.split("triton_embed_gateway_inputs_total")[1]
    assert 'triton_embed_gateway_inputs_total{model="embed",route="/v1/embeddings"} 2.0' in text
    assert 'triton_embed_gateway_tokens_total{model="embed",route="/v1/embeddings"} 7.0' in text


def test_unknown_methods_on_the_cohere_routes_answer_in_cohere_envelope(client):
    c, _ = client
    r = c.get("/v2/rerank")
    assert r.status_code == 405 and r.json() == {"message": "/v2/rerank does not take GET"}


# ---- TEI and vLLM /rerank ---------------------------------------------------------------------


def test_tei_rerank_answers_ranks_best_first(client):
    c, pool = client
    r = post(c, "/rerank", {"query": QUERY, "texts": DOCUMENTS})
    assert r.status_code == 200, r.text
    assert r.json() == [{"index": i, "score": sigmoid(RAW[i])} for i in ORDER]
    assert all(p == {"truncation": "none"} for _, _, p in pool.calls)  # TEI: truncate false
    body_ = {"query": QUERY, "texts": DOCUMENTS[:2], "raw_scores": True, "return_text": True,
             "truncate": True, "truncation_direction": "Right", "model": "rerank"}  # fmt: skip
    r = post(c, "/rerank", body_)
    assert r.json() == [
        {"index": 0, "score": 1.0, "text": DOCUMENTS[0]},
        {"index": 1, "score": -1.0, "text": DOCUMENTS[1]},
    ]
    assert pool.calls[-1][2] == {"truncation": "longest_first", "raw_scores": True}


@pytest.mark.parametrize(
    "request_body, status, message, error_type",
    [
        (
            {"query": "q", "texts": []},
            400,
            "'texts' is an empty list; send at least one document",
            "Empty",
        ),  # fmt: skip
        (
            {"query": "q", "texts": ["a"], "truncation_direction": "Left"},
            400,
            "'truncation_direction' must be 'Right' (the reranker cuts a pair at its end); got "
            "'Left'",
            "Validation",
        ),  # fmt: skip
        (
            {"query": "q", "texts": ["a"], "top_n": 1},
            400,
            "unknown field 'top_n'; the fields "
            "are query, texts, raw_scores, return_text, truncate, truncation_direction, model",
            "Validation",
        ),  # fmt: skip
        (
            {"query": "q"},
            400,
            "'texts' is required (text-embeddings-inference's /rerank: a list "
            "of strings); or send 'documents' instead (vLLM's and Jina's /rerank)",
            "Validation",
        ),  # fmt: skip
        (
            {"query": "q", "texts": ["a"] * 1001},
            413,
            "'texts' has 1001 documents; at most 1000 "
            "are reranked per request; split them over several requests",
            "Validation",
        ),  # fmt: skip
    ],
)
def test_bad_tei_rerank_requests_are_in_teis_envelope(
    client, request_body, status, message, error_type
):
    c, pool = client
    r = post(c, "/rerank", request_body)
    assert r.status_code == status
    assert r.json() == {"error": message, "error_type": error_type}
    assert pool.calls == []


def test_rerank_with_documents_is_vllms_api_with_openais_envelope(client):
    c, _ = client
    r = post(c, "/rerank", body(return_documents=True, top_n=1))
    assert r.status_code == 200
    assert r.json()["results"] == [
        {"index": 2, "relevance_score": sigmoid(3.0), "document": {"text": DOCUMENTS[2]}}
    ]
    r = post(c, "/rerank", body(documents=[]))
    assert r.status_code == 400
    assert (
        r.json()["error"]["message"] == "'documents' is an empty list; send at least one document"
    )
    assert r.json()["error"]["param"] == "documents"


# ---- vLLM /score ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_1_to_n_and_n_to_n_in_pair_order(client, path):
    c, pool = client
    r = post(c, path, {"model": "rerank", "text_1": QUERY, "text_2": DOCUMENTS})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert set(answer) == {"id", "object", "created", "model", "data", "usage"}
    assert answer["object"] == "list" and answer["model"] == "rerank"
    assert answer["id"].startswith("score-") and isinstance(answer["created"], int)
    assert answer["data"] == [
        {"index": i, "object": "score", "score": sigmoid(RAW[i])} for i in range(6)
    ]
    n = tokens(QUERY, DOCUMENTS)
    assert answer["usage"] == {"prompt_tokens": n, "total_tokens": n}
    r = post(c, path, {"text_1": ["panda", "car"], "text_2": ["a panda", "a panda"],
                       "use_activation": False})  # fmt: skip
    assert [d["score"] for d in r.json()["data"]] == [0.0, -1.0]
    r = post(c, path, {"text_1": ["a"], "text_2": "b"})
    assert [d["score"] for d in r.json()["data"]] == [sigmoid(-1.0)]


@pytest.mark.parametrize(
    "request_body, message",
    [
        (
            {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]},
            "'text_1' has 2 texts and 'text_2' "
            "3: send one text_1 for all text_2 (1:N) or as many as text_2 (N:N)",
        ),  # fmt: skip
        ({"text_1": "a"}, "'text_2' is required: a list of strings"),
        (
            {"text_1": "", "text_2": "b"},
            "'text_1' is empty; send the text the documents are ranked against",
        ),  # fmt: skip
        (
            {"text_1": "a", "text_2": "b", "queries": ["a"]},
            "unknown field 'queries'; the "
            "fields are model, text_1, text_2, instruction, use_activation, max_tokens_per_doc, "
            "user",
        ),  # fmt: skip
    ],
)
def test_bad_score_requests_are_400_in_openais_envelope(client, request_body, message):
    c, pool = client
    r = post(c, "/score", request_body)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == message
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert pool.calls == []
