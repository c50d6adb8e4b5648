"""The rerank routes driven by the real ``cohere`` SDK and LangChain's ``CohereRerank``.

No server: the SDKs' ``httpx`` client is the gateway app's Starlette ``TestClient`` (an
``httpx.Client``), so the requests are the SDKs' own, byte for byte, and their parsers read
the gateway's answers. The upstreams are ``test_gateway_rerank``'s ``RerankPool``.
"""

from __future__ import annotations

import pytest

from tests.unit.test_gateway_app import make_client
from tests.unit.test_gateway_rerank import DOCUMENTS, ORDER, QUERY, RAW, RerankPool, sigmoid

cohere = pytest.importorskip("cohere")

BASE_URL = "http://testserver"


@pytest.fixture
def gateway():
    test_client, pool, _ = make_client(RerankPool())
    return test_client, pool


def test_cohere_client_v2_rerank(gateway):
    http, pool = gateway
    client = cohere.ClientV2(api_key="unused", base_url=BASE_URL, httpx_client=http)
    response = client.rerank(model="rerank", query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [r.index for r in response.results] == ORDER[:3]
    assert [r.relevance_score for r in response.results] == pytest.approx(
        [sigmoid(RAW[i]) for i in ORDER[:3]]
    )
    assert response.meta.billed_units.search_units == 1
    assert response.meta.api_version.version == "2"
    assert response.meta.tokens.input_tokens > 0
    response = client.rerank(
        model="rerank", query=QUERY, documents=DOCUMENTS, max_tokens_per_doc=64
    )
    assert len(response.results) == len(DOCUMENTS)
    assert pool.calls[-1][2] == {"max_document_tokens": 64}


def test_cohere_client_v1_rerank_with_documents_returned(gateway):
    http, _ = gateway
    client = cohere.Client(api_key="unused", base_url=BASE_URL, httpx_client=http)
    documents = [{"text": d} for d in DOCUMENTS]
    response = client.rerank(
        model="BAAI/bge-reranker-base", query=QUERY, documents=documents, top_n=2,
        return_documents=True,
    )  # fmt: skip
    assert [r.index for r in response.results] == ORDER[:2]
    assert [r.document.text for r in response.results] == [DOCUMENTS[i] for i in ORDER[:2]]


def test_cohere_sdk_errors_carry_the_status_and_the_gateways_message(gateway):
    http, _ = gateway
    client = cohere.ClientV2(api_key="unused", base_url=BASE_URL, httpx_client=http)
    with pytest.raises(cohere.errors.BadRequestError) as caught:
        client.rerank(model="rerank", query=QUERY, documents=DOCUMENTS, top_n=0)
    assert caught.value.status_code == 400
    assert caught.value.body["message"].startswith("'top_n' must be a whole number >= 1")
    with pytest.raises(cohere.errors.BadRequestError) as caught:
        client.rerank(model="embed", query=QUERY, documents=DOCUMENTS)
    assert "is an embedding model, not a reranker" in caught.value.body["message"]


def test_langchain_cohere_rerank_compresses_documents(gateway):
    langchain_cohere = pytest.importorskip("langchain_cohere")
    from langchain_core.documents import Document

    http, _ = gateway
    client = cohere.ClientV2(api_key="unused", base_url=BASE_URL, httpx_client=http)
    reranker = langchain_cohere.CohereRerank(client=client, model="rerank", top_n=2)
    kept = reranker.compress_documents([Document(page_content=d) for d in DOCUMENTS], QUERY)
    assert [d.page_content for d in kept] == [DOCUMENTS[i] for i in ORDER[:2]]
    assert kept[0].metadata["relevance_score"] == pytest.approx(sigmoid(RAW[ORDER[0]]))
