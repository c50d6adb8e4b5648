"""The `embed` ensemble on a real tritonserver against sentence-transformers."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from triton_embed.codec import decode_embeddings
from triton_embed.corpus import read_fortunes

from tests.helpers import COSINE_MIN, DIM, MAX_LENGTH, cosines, infer_embed

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def real_texts():
    """Real human-written texts of varied length (Debian fortunes), seeded sample."""
    texts = [t for _, t in read_fortunes()]
    return random.Random(1).sample(texts, 200)


@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_embeddings_match_sentence_transformers(
    grpc_client, reference_model, real_texts, batch_size
):
    texts = real_texts[:batch_size]
    elements, _ = infer_embed(grpc_client, texts)
    assert len(elements) == batch_size
    assert all(len(e) == 4 * DIM for e in elements)
    got = decode_embeddings(elements)
    want = reference_model.encode(texts, convert_to_numpy=True)
    cos = cosines(got, want)
    assert cos.min() >= COSINE_MIN, f"worst text {int(cos.argmin())}: cosine {cos.min():.6f}"
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-3)


def test_eight_concurrent_clients_get_their_own_results_in_order(
    server, reference_model, real_texts
):
    import tritonclient.grpc as grpcclient

    batches = [real_texts[i * 20 : i * 20 + 3 + i * 2] for i in range(8)]  # sizes 3, 5, ..., 17

    def call(batch):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            return [decode_embeddings(infer_embed(client, batch)[0]) for _ in range(3)]
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(call, batches))
    for batch, runs in zip(batches, results, strict=True):
        want = reference_model.encode(batch, convert_to_numpy=True)
        for got in runs:
            assert got.shape == (len(batch), DIM)
            assert cosines(got, want).min() >= COSINE_MIN


def test_num_tokens_is_the_tokenizers_own_count(grpc_client, hf_tokenizer, real_texts):
    texts = real_texts[:32] + ["hi", "word " * 1000]
    _, num_tokens = infer_embed(grpc_client, texts)
    full = [len(ids) for ids in hf_tokenizer(texts)["input_ids"]]  # special tokens included
    assert num_tokens.dtype == np.int32
    assert num_tokens.tolist() == [min(n, MAX_LENGTH) for n in full]
    assert num_tokens[-2] == 3  # [CLS] hi [SEP]
    assert num_tokens[-1] == MAX_LENGTH  # truncated to the model's limit


def test_over_long_text_is_truncated_like_the_reference(grpc_client, reference_model, real_texts):
    long_text = " ".join(real_texts[:60])  # far more than 256 tokens
    elements, num_tokens = infer_embed(grpc_client, [long_text])
    assert num_tokens.tolist() == [MAX_LENGTH]
    got = decode_embeddings(elements)
    want = reference_model.encode([long_text])  # sentence-transformers truncates at 256 too
    assert cosines(got, want)[0] >= COSINE_MIN


def test_http_infer_works_with_binary_outputs(server, reference_model):
    """The ensemble is not decoupled: plain KServe v2 HTTP infer answers (with the admin key:
    Triton's HTTP inference is restricted, docs/operations.md "Ports")."""
    import json

    import requests

    texts = ["first text over HTTP", "second"]
    body = {
        "inputs": [{"name": "TEXT", "shape": [2, 1], "datatype": "BYTES", "data": texts}],
        "outputs": [
            {"name": "EMBEDDING", "parameters": {"binary_data": True}},
            {"name": "NUM_TOKENS", "parameters": {"binary_data": False}},
        ],
    }
    resp = requests.post(
        f"{server.http_url}/v2/models/embed/infer",
        json=body,
        headers=server.admin_http_headers,
        timeout=60,
    )
    assert resp.status_code == 200, resp.text[:500]
    header_len = int(resp.headers["Inference-Header-Content-Length"])
    header = json.loads(resp.content[:header_len])
    outputs = {o["name"]: o for o in header["outputs"]}
    raw = resp.content[header_len:]
    assert outputs["EMBEDDING"]["parameters"]["binary_data_size"] == len(raw)
    elements, pos = [], 0
    while pos < len(raw):  # BYTES elements: 4-byte little-endian length + payload
        n = int.from_bytes(raw[pos : pos + 4], "little")
        elements.append(raw[pos + 4 : pos + 4 + n])
        pos += 4 + n
    got = decode_embeddings(elements)
    assert cosines(got, reference_model.encode(texts)).min() >= COSINE_MIN
    assert outputs["NUM_TOKENS"]["data"] == [6, 3]
