"""The HTTP gateway in front of a real tritonserver, driven by the real clients RAG code uses.

A real gateway process (``python -m triton_embed_server.gateway``, an API key, a free loopback
port) in front of the session ``server``; the official ``openai`` SDK and LangChain's
``OpenAIEmbeddings`` must get the vectors of the gRPC path (``EmbeddingClient``): bit for bit
through base64, equal float32 values through ``float``. Every error status comes from a real
request. TEI's routes answer in TEI's shapes.
"""

from __future__ import annotations

import asyncio
import base64
import re

import httpx
import numpy as np
import orjson
import pytest
from triton_embed import EmbeddingClient
from triton_embed_server.run.launcher import REPO_ROOT, Gateway

from tests.helpers import COSINE_MIN, DIM, MAX_LENGTH, NORM_RTOL, VECTOR_ATOL, cosines

pytestmark = [pytest.mark.integration, pytest.mark.slow]

API_KEY = "gateway-test-key-5f1c0e"
ALIAS = "sentence-transformers/all-MiniLM-L6-v2"


def texts(n: int, start: int = 0) -> list[str]:
    """``n`` distinct short texts."""
    topics = ("the sea", "a cat on a mat", "tax law", "graph theory", "bread", "the moon")
    return [f"text {i} is about {topics[i % len(topics)]}" for i in range(start, start + n)]


@pytest.fixture(scope="module")
def gateway(server):
    with Gateway([server.grpc_url], server.admin_key, api_key=API_KEY) as gw:
        yield gw
    print(f"\ngateway log: {gw.log_path}")


@pytest.fixture(scope="module")
def grpc(server):
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key, max_concurrency=4) as c:
        yield c


@pytest.fixture(scope="module")
def openai_client(gateway):
    import openai

    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=API_KEY, max_retries=0)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


def vectors(response) -> np.ndarray:
    return np.array([d.embedding for d in response.data], dtype=np.float32)


# ---- the openai SDK and LangChain ---------------------------------------------------------


@pytest.mark.parametrize("n", [1, 100, 2048])
def test_openai_sdk_base64_is_bit_identical_to_grpc_and_in_order(openai_client, grpc, n):
    batch = texts(n)
    response = openai_client.embeddings.create(model="embed", input=batch)  # base64 default
    assert [d.index for d in response.data] == list(range(n))
    expected = grpc.embed_with_details(batch)
    got = vectors(response)
    assert got.shape == (n, DIM)
    assert np.array_equal(got, expected.embeddings)
    assert response.usage.prompt_tokens == int(expected.num_tokens.sum())
    assert response.usage.total_tokens == response.usage.prompt_tokens
    assert response.model == "embed"


def test_openai_sdk_float_equals_the_float32_values(openai_client, grpc):
    batch = texts(20, start=5000)
    response = openai_client.embeddings.create(model="embed", input=batch, encoding_format="float")
    assert np.array_equal(vectors(response), grpc.embed(batch))


def test_base64_carries_the_servers_bytes(gateway, grpc):
    batch = texts(3, start=7000)
    r = httpx.post(
        f"{gateway.base_url}/v1/embeddings",
        headers=auth(),
        json={"model": "embed", "input": batch, "encoding_format": "base64"},
    )
    assert r.status_code == 200
    got = [base64.b64decode(d["embedding"]) for d in r.json()["data"]]
    assert got == [v.astype("<f4").tobytes() for v in grpc.embed(batch)]


def test_the_hugging_face_name_is_an_alias(openai_client, grpc):
    response = openai_client.embeddings.create(model=ALIAS, input="an alias works")
    assert response.model == ALIAS
    assert np.array_equal(vectors(response), grpc.embed(["an alias works"]))
    listed = {m.id: m for m in openai_client.models.list().data}
    assert {"embed", ALIAS} <= set(listed)
    assert listed["embed"].model_extra["dimension"] == DIM
    assert listed["embed"].model_extra["max_length"] == MAX_LENGTH


def test_options_reach_the_server(openai_client, grpc):
    long_text = "word " * 600
    response = openai_client.embeddings.create(
        model="embed", input=[long_text], extra_body={"truncate": "START"}
    )
    assert np.array_equal(vectors(response), grpc.embed([long_text], truncation="START"))
    assert response.usage.prompt_tokens == MAX_LENGTH


def test_token_ids_are_embedded_by_the_embedder_step(openai_client, grpc, hf_tokenizer):
    text = "token ids go straight to the embedder"
    ids = hf_tokenizer(text)["input_ids"]
    response = openai_client.embeddings.create(model="embed", input=[ids], encoding_format="float")
    assert response.usage.prompt_tokens == len(ids)
    assert np.array_equal(vectors(response), grpc.embed([text]))


def test_langchain_openai_embeddings_equal_the_grpc_vectors(gateway, grpc):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model="embed",
        base_url=f"{gateway.base_url}/v1",
        api_key=API_KEY,
        check_embedding_ctx_length=False,
    )
    documents = texts(10, start=9000)
    got = np.array(embeddings.embed_documents(documents), dtype=np.float32)
    expected = grpc.embed(documents)
    assert cosines(got, expected).min() >= COSINE_MIN
    query = np.array([embeddings.embed_query("what is the moon?")], dtype=np.float32)
    assert cosines(query, grpc.embed(["what is the moon?"])).min() >= COSINE_MIN


# ---- errors from real requests ------------------------------------------------------------


def test_a_40_megabyte_body_is_413(gateway):
    body = orjson.dumps({"model": "embed", "input": ["x" * 1000] * 40000})
    assert len(body) > 40 * 10**6
    headers = {**auth(), "Content-Type": "application/json"}
    r = httpx.post(f"{gateway.base_url}/v1/embeddings", headers=headers, content=body, timeout=60)
    assert r.status_code == 413
    assert "the gateway accepts at most 33632256 bytes" in r.json()["error"]["message"]


def test_2049_inputs_are_413(openai_client):
    import openai

    with pytest.raises(openai.APIStatusError) as info:
        openai_client.embeddings.create(model="embed", input=["x"] * 2049)
    assert info.value.status_code == 413
    assert "at most 2048" in info.value.message


def test_a_token_id_outside_the_vocabulary_is_400_with_the_servers_message(openai_client):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        openai_client.embeddings.create(model="embed", input=[[101, 10**6, 102]])
    message = info.value.body["message"]
    assert "text 0 has token ID 1000000 at position 1, outside the vocabulary" in message


def test_an_unknown_model_is_404(openai_client):
    import openai

    with pytest.raises(openai.NotFoundError) as info:
        openai_client.embeddings.create(model="no-such-model", input="x")
    assert info.value.body["code"] == "model_not_found"


def test_a_wrong_or_missing_key_is_401(gateway):
    import openai

    wrong = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(model="embed", input="x")
    r = httpx.post(f"{gateway.base_url}/v1/embeddings", json={"model": "embed", "input": "x"})
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert httpx.post(f"{gateway.base_url}/embed", json={"inputs": "x"}).status_code == 401
    assert httpx.get(f"{gateway.base_url}/health").status_code == 200
    assert httpx.get(f"{gateway.base_url}/metrics").status_code == 200
    assert API_KEY not in gateway.log_tail()


def test_an_over_long_text_without_truncation_is_400_naming_its_index(openai_client):
    import openai

    batch = [*texts(70, start=100), "word " * 600]  # the long one is in the second piece
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.embeddings.create(
            model="embed", input=batch, extra_body={"truncation": "NONE"}
        )
    message = info.value.body["message"]
    assert "text 70 has 602 tokens; the model accepts 256" in message


def merged_requests(gateway) -> tuple[float, float]:
    """(calls, requests they carried) of ``triton_embed_gateway_merged_requests``."""
    text = httpx.get(f"{gateway.base_url}/metrics").text
    values = dict(
        re.findall(r"^triton_embed_gateway_merged_requests_(count|sum) (\S+)$", text, re.M)
    )
    return float(values.get("count", 0)), float(values.get("sum", 0))


@pytest.fixture(scope="module")
def merging_gateway(server):
    """A second gateway with request merging on (``--merge-in-flight 4``; off by default)."""
    extra = ["--merge-in-flight", "4"]
    with Gateway([server.grpc_url], server.admin_key, api_key=API_KEY, extra_args=extra) as gw:
        yield gw


def test_concurrent_small_requests_are_merged_and_each_gets_its_own_answer(merging_gateway, grpc):
    # 24 single-text requests at once (--merge-in-flight 4): most wait and share calls. One
    # is over the token budget with truncation NONE: only it is refused, naming text 0 (its
    # own index, not its place in the merged call).
    gateway = merging_gateway
    good = texts(23, start=11000)
    bad_at = 11
    inputs = [*good[:bad_at], "word " * 600, *good[bad_at:]]
    expected = {t: grpc.embed_with_details([t], truncation="NONE") for t in good}
    options = {"model": "embed", "truncation": "NONE", "encoding_format": "base64"}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.base_url, headers=auth(), timeout=60) as c:
            return await asyncio.gather(
                *(c.post("/v1/embeddings", json={**options, "input": text}) for text in inputs)
            )

    for _ in range(3):  # a burst that happens to arrive slower than calls finish: once more
        calls_before, requests_before = merged_requests(gateway)
        responses = asyncio.run(burst())
        for text, r in zip(inputs, responses, strict=True):
            if text not in expected:
                assert r.status_code == 400, r.text
                message = r.json()["error"]["message"]
                assert "text 0 has 602 tokens; the model accepts 256" in message
                continue
            assert r.status_code == 200, r.text
            (item,) = r.json()["data"]
            got = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
            # merged into other batches than the gRPC call's: equal within VECTOR_ATOL
            np.testing.assert_allclose(got, expected[text].embeddings[0], rtol=0, atol=VECTOR_ATOL)
            assert r.json()["usage"]["prompt_tokens"] == int(expected[text].num_tokens[0])
        calls, requests = merged_requests(gateway)
        if requests - requests_before > calls - calls_before:
            break  # some call carried more than one request
    else:
        pytest.fail(f"no call carried more than one request: {calls} calls, {requests} requests")


# ---- TEI routes ---------------------------------------------------------------------------


def test_tei_embed(gateway, grpc):
    batch = texts(3, start=300)
    r = httpx.post(f"{gateway.base_url}/embed", headers=auth(), json={"inputs": batch})
    assert r.status_code == 200
    got = np.array(r.json(), dtype=np.float32)
    assert got.shape == (3, DIM)
    assert np.array_equal(got, grpc.embed(batch))  # normalized by the model: sent as they are
    r = httpx.post(f"{gateway.base_url}/embed", headers=auth(), json={"inputs": "one"})
    assert len(r.json()) == 1 and len(r.json()[0]) == DIM
    long = {"inputs": ["short", "word " * 600]}
    r = httpx.post(f"{gateway.base_url}/embed", headers=auth(), json=long)
    assert r.status_code == 400 and "text 1 has 602 tokens" in r.json()["error"]
    r = httpx.post(f"{gateway.base_url}/embed", headers=auth(), json={**long, "truncate": True})
    assert r.status_code == 200


def test_tei_embed_with_haystacks_request_shape(gateway, grpc, reference_model):
    """Haystack's TEI embedders send ``normalize: false`` by default: the pooled vectors
    without the model's Normalize module, as TEI returns them."""
    from sentence_transformers import SentenceTransformer

    batch = texts(3, start=400)
    body = {"inputs": batch, "normalize": False, "truncate": True}
    r = httpx.post(f"{gateway.base_url}/embed", headers=auth(), json=body)
    assert r.status_code == 200, r.text
    raw = np.array(r.json(), dtype=np.float32)
    pooled_only = SentenceTransformer(modules=[reference_model[0], reference_model[1]])
    expected = pooled_only.encode(batch)
    assert cosines(raw, expected).min() >= COSINE_MIN
    np.testing.assert_allclose(
        np.linalg.norm(raw, axis=1), np.linalg.norm(expected, axis=1), NORM_RTOL
    )
    assert np.array_equal(raw, grpc.embed(batch, normalize=False))
    r = httpx.post(f"{gateway.base_url}/embed", headers=auth(), json={**body, "normalize": True})
    assert np.array_equal(np.array(r.json(), dtype=np.float32), grpc.embed(batch))


def test_tei_tokenize_gives_the_tokenizers_ids(gateway, hf_tokenizer):
    batch = ["Hello world", "tokenize me, please"]
    r = httpx.post(f"{gateway.base_url}/tokenize", headers=auth(), json={"inputs": batch})
    assert r.status_code == 200
    assert [[t["id"] for t in tokens] for tokens in r.json()] == [
        hf_tokenizer(t)["input_ids"] for t in batch
    ]
    assert set(r.json()[0][0]) == {"id", "text", "special", "start", "stop"}


def test_tei_info_and_health(gateway):
    info = httpx.get(f"{gateway.base_url}/info", headers=auth()).json()
    assert info["model_id"] == ALIAS
    assert info["max_input_length"] == MAX_LENGTH
    assert info["max_client_batch_size"] == 2048
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    r = httpx.get(f"{gateway.base_url}/health")
    assert r.status_code == 200 and r.content == b""


def test_the_gateway_counts_its_requests(gateway):
    body = {"model": "embed", "input": "counted"}
    assert httpx.post(f"{gateway.base_url}/v1/embeddings", headers=auth(), json=body).is_success
    text = httpx.get(f"{gateway.base_url}/metrics").text
    assert 'triton_embed_gateway_upstream_up{upstream="127.0.0.1:' in text
    assert 'route="/v1/embeddings",status="200"' in text
    # every gateway series the shipped dashboard and alert rules read exists on a real gateway
    shipped = "".join(
        (REPO_ROOT / "scripts" / "monitoring" / f).read_text()
        for f in ("grafana_dashboard.json", "prometheus_rules.yml")
    )
    referenced = set(re.findall(r"\btriton_embed_gateway_[a-z_]+", shipped))
    names = set(re.findall(r"^(triton_embed_gateway_[a-z_]+)", text, flags=re.MULTILINE))
    # a labelled family with no sample yet (the tenant refusals of a gateway without
    # --tenants) is declared by its TYPE line; a counter's TYPE names it without _total
    declared = re.findall(r"^# TYPE (triton_embed_gateway_[a-z_]+) ", text, flags=re.MULTILINE)
    names |= {*declared, *(f"{n}_total" for n in declared)}
    missing = {r for r in referenced if r not in names and f"{r}_bucket" not in names}
    assert len(referenced) >= 4 and not missing, missing
