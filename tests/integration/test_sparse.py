"""Sparse (SPLADE) models on a real tritonserver: SPARSE against SparseEncoder, options, bad input.

One tritonserver serves two sparse models made by ``triton-embed repository add`` (the CLI,
as a user runs it) from folders built at test time (``tests/sparse_factory.py``):

* ``splade``: a seeded ``BertForMaskedLM`` saved by ``SparseEncoder.save`` (``MLMTransformer``
  + ``SpladePooling("max")``, prompts ``query``/``document``);
* ``plain``: the same weights as a plain ``BertForMaskedLM`` checkpoint (no
  sentence-transformers files), served as SPLADE max pooling.

Reference: ``SparseEncoder.encode`` on the same weights (dense output). Per text, the
``SPARSE`` element's indices are exactly the reference's non-zero entries (above the
request's threshold, cut to its top_k), and each weight matches within ``rtol`` 1e-4 +
``atol`` 5e-5: both run float32 on CPU and differ only in the order of floating-point sums
inside the encoder (measured: at most 1.3e-5 on this model, which ``log1p(relu(.))``, slope
<= 1, does not magnify; ``tests/unit/test_sparse_engine.py`` checks the engine alone the
same way); no reference weight lies within 1e-4 of zero or of a threshold used, so the index
sets are not a matter of rounding.
``NUM_TOKENS`` is compared exactly with the reference tokenizer's counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_embed import codec
from triton_embed_server.run.launcher import TritonServer
from tritonclient.utils import InferenceServerException

from tests.helpers import CLI, running, text_input
from tests.model_factory import fortune_texts
from tests.sparse_factory import (
    SPLADE_MAX_LENGTH,
    make_plain_splade,
    make_splade,
    splade_reference,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RTOL = 1e-4
ATOL = 5e-5
#: No reference weight is this close to zero or to a threshold the tests use.
EDGE = 1e-4


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("splade")
    return {
        "splade": make_splade(base / "splade"),
        "plain": make_plain_splade(base / "plain"),
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory, folders):
    repo = tmp_path_factory.mktemp("sparse-repo") / "model_repository"
    for name, folder in folders.items():
        cli("repository", "add", "--repository", str(repo), "--model", str(folder),
            "--name", name, "--instances", "1")  # fmt: skip
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with running(TritonServer(model_repository=repository), "sparse tritonserver") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def encode(client, texts, model="splade", **parameters):
    """``(indices, weights)`` per text and ``NUM_TOKENS`` of one request."""
    result = client.infer(model, [text_input(texts)], parameters=parameters or None)
    return decode(result)


def decode(result):
    elements = result.as_numpy("SPARSE").reshape(-1)
    pairs = [codec.decode_sparse(e) for e in elements]
    return pairs, result.as_numpy("NUM_TOKENS").reshape(-1)


def sample_texts():
    return [
        *fortune_texts(8, seed=51),
        " ".join(fortune_texts(20, seed=52)),  # over 128 tokens: truncated
        "Grüße aus Köln — 東京? naïve café, señor ∑x² 🚀 «ça va»",
    ]


def assert_matches(pairs, reference, top_k=None, threshold=0.0):
    """Each text's entries: the reference's above ``threshold``, its ``top_k`` largest."""
    for (indices, weights), want in zip(pairs, reference, strict=True):
        assert not ((np.abs(want - threshold) <= EDGE) & (want > 0)).any()
        kept = np.flatnonzero(want > threshold)
        if top_k is not None and kept.size > top_k:
            kept = np.sort(kept[np.argsort(-want[kept], kind="stable")[:top_k]])
        assert indices.dtype == np.int32 and weights.dtype == np.float32
        np.testing.assert_array_equal(indices, kept)
        np.testing.assert_allclose(weights, want[kept], rtol=RTOL, atol=ATOL)


def threshold_between(reference, quantile):
    """A threshold in the widest gap between the texts' positive reference weights near
    ``quantile`` of them (so that no weight lies within the tolerance of it)."""
    weights = np.unique(reference[reference > 0])
    start = int(quantile * (len(weights) - 20))
    gaps = np.diff(weights[start : start + 20])
    k = start + int(gaps.argmax())
    return round(float(weights[k] + weights[k + 1]) / 2, 6)


def test_the_listing_shows_the_sparse_kind(repository, folders):
    out = cli("repository", "list", "--repository", str(repository), "--json").stdout
    listed = {m["name"]: m for m in json.loads(out)}
    assert {n: m["kind"] for n, m in listed.items()} == {"plain": "sparse", "splade": "sparse"}
    assert listed["splade"]["steps"] == ["splade_tokenizer", "splade_sparse_encoder"]
    assert listed["plain"]["spec"]["splade_pooling"] == "max"
    table = cli("repository", "list", "--repository", str(repository)).stdout
    assert " sparse " in table.splitlines()[1]


def test_sparse_vectors_are_sparse_encoders(client, folders):
    texts = sample_texts()
    pairs, num_tokens = encode(client, texts)
    reference = splade_reference(folders["splade"], texts)
    assert_matches(pairs, reference)
    nonzero = np.array([len(i) for i, _ in pairs])
    assert (nonzero > 10).all() and (nonzero < reference.shape[1] / 2).all()
    from sentence_transformers import SparseEncoder

    tokenized = SparseEncoder(str(folders["splade"]), device="cpu").preprocess(texts)
    assert num_tokens.tolist() == tokenized["attention_mask"].sum(dim=1).tolist()
    assert num_tokens.max() == SPLADE_MAX_LENGTH


def test_top_k_and_threshold_cut_each_text_exactly(client, folders):
    texts = sample_texts()[:5]
    reference = splade_reference(folders["splade"], texts)
    high, low = threshold_between(reference, 0.6), threshold_between(reference, 0.2)
    for parameters in ({"top_k": 7}, {"threshold": high}, {"top_k": 30, "threshold": str(low)}):
        pairs, _ = encode(client, texts, **parameters)
        assert_matches(
            pairs, reference, parameters.get("top_k"), float(parameters.get("threshold", 0))
        )
    pairs, _ = encode(client, texts, top_k=7)
    assert [len(i) for i, _ in pairs] == [7] * len(texts)
    # sentence-transformers' own top-k: the same entries and weights
    capped = splade_reference(folders["splade"], texts, max_active_dims=7)
    for (indices, weights), want in zip(pairs, capped, strict=True):
        np.testing.assert_array_equal(indices, np.flatnonzero(want))
        np.testing.assert_allclose(weights, want[indices], rtol=RTOL, atol=ATOL)


def test_a_plain_checkpoint_is_served_as_splade_max(client, folders):
    """The plain ``BertForMaskedLM`` folder holds the SparseEncoder folder's weights."""
    texts = sample_texts()[:4]
    pairs, _ = encode(client, texts, model="plain", top_k=20)
    assert_matches(pairs, splade_reference(folders["splade"], texts), 20)


def test_input_type_puts_the_models_prompt_in_front(client, folders):
    texts = sample_texts()[:3]
    pairs, num_tokens = encode(client, texts, input_type="query")
    assert_matches(pairs, splade_reference(folders["splade"], texts, prompt_name="query"))
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(folders["splade"]), device="cpu")
    tokenized = model.preprocess(["query: " + t for t in texts])
    assert num_tokens.tolist() == tokenized["attention_mask"].sum(dim=1).tolist()


def in_flight(client, calls):
    """``client.async_infer`` of every ``(texts, parameters)`` at once; results or errors."""
    done = threading.Semaphore(0)
    results: list = [None] * len(calls)

    def callback(i):
        def store(result, error):
            results[i] = error if error is not None else result
            done.release()

        return store

    for i, (texts, parameters) in enumerate(calls):
        client.async_infer("splade", [text_input(texts)], callback(i), parameters=parameters)
    for _ in calls:
        assert done.acquire(timeout=120)
    return results


def test_a_bad_request_fails_alone_in_a_batch(client, folders):
    good = sample_texts()[:3]
    reference = splade_reference(folders["splade"], good)
    calls = [(good, {"top_k": 5}), (good, {"top_k": 0}), (["ok", ""], None), (good, None)] * 3
    results = in_flight(client, calls)
    for (_, parameters), result in zip(calls, results, strict=True):
        if isinstance(result, InferenceServerException):
            assert result.status() == "StatusCode.INVALID_ARGUMENT"
            assert ("top_k=0 must be" in result.message()) or "text 1 is empty" in result.message()
            assert parameters in ({"top_k": 0}, None)
            continue
        pairs, _ = decode(result)
        assert_matches(pairs, reference, (parameters or {}).get("top_k"))
    assert sum(isinstance(r, InferenceServerException) for r in results) == 6


@pytest.mark.parametrize(
    ("texts", "parameters", "message"),
    [
        (["a text"], {"top_k": "-1"}, "request parameter top_k='-1' must be a whole number >= 1"),
        (["a text"], {"threshold": "-0.5"}, "threshold='-0.5' must be a finite number >= 0"),
        (["a text"], {"threshold": "nan"}, "threshold='nan' must be a finite number >= 0"),
        (["a text"], {"truncation": "CHUNK"}, "truncation='CHUNK' is not offered for sparse"),
        (["a text"], {"dimensions": 8}, "'dimensions' is not an option of this service"),
        (["a text"], {"input_type": "poem"}, "input_type"),
        ([" ".join(fortune_texts(20, seed=53))], {"truncation": "NONE"}, "the model accepts 128"),
        ([""], {}, "text 0 is empty"),
    ],
)  # fmt: skip
def test_bad_input_is_invalid_argument_and_the_server_stays_ready(
    client, server, texts, parameters, message
):
    with pytest.raises(InferenceServerException) as caught:
        encode(client, texts, **parameters)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert message in caught.value.message()
    assert server.is_ready()
    pairs, _ = encode(client, ["still here"])
    assert len(pairs) == 1 and len(pairs[0][0]) > 0


def test_the_sparse_step_refuses_bad_token_ids_sent_to_it_directly(client):
    ids = codec.encode_token_ids([[2, 10**6, 3]]).reshape(-1, 1)
    tensor = grpcclient.InferInput("TOKEN_IDS", list(ids.shape), "BYTES")
    tensor.set_data_from_numpy(ids)
    with pytest.raises(InferenceServerException, match="outside the vocabulary"):
        client.infer("splade_sparse_encoder", [tensor])


# ---- the client library, the gateway and the bulk job, against the real server -------------

API_KEY = "sparse-gateway-key-5c1e"


@pytest.fixture(scope="module")
def gateway(server):
    from triton_embed_server.run.launcher import Gateway

    with Gateway([server.grpc_url], server.admin_key, api_key=API_KEY, model="splade") as gw:
        yield gw


def test_the_client_library_encodes_as_sparse_encoder(server, folders):
    from triton_embed import EmbeddingClient

    texts = sample_texts() * 7  # 70 texts: more than one request of the ensemble's 64
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key, model="splade") as c:
        result = c.embed_sparse(texts, top_k=20)
    reference = splade_reference(folders["splade"], texts)
    assert_matches(list(zip(result.indices, result.weights, strict=True)), reference, top_k=20)
    assert len(result.latencies_s) == 2


def test_the_gateway_answers_teis_embed_sparse_and_refuses_the_dense_routes(gateway, folders):
    import requests

    texts = sample_texts()[:4]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    r = requests.post(
        f"{gateway.base_url}/embed_sparse",
        json={"inputs": texts, "threshold": 0.01, "model": "splade"},
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    got = [
        (np.array([e["index"] for e in v], np.int32), np.array([e["value"] for e in v], np.float32))
        for v in r.json()
    ]
    assert_matches(got, splade_reference(folders["splade"], texts), threshold=0.01)
    r = requests.post(
        f"{gateway.base_url}/v1/embeddings",
        json={"input": texts, "model": "splade"},
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_model_kind"
    assert "POST /embed_sparse" in r.json()["error"]["message"]
    models = requests.get(f"{gateway.base_url}/v1/models", headers=headers, timeout=60).json()
    assert {m["id"]: m["kind"] for m in models["data"]}["splade"] == "sparse"


def test_the_bulk_job_writes_sparse_shards_that_verify(server, folders, tmp_path):
    import pyarrow.parquet as pq

    texts = sample_texts()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "shards"
    env = {**os.environ, "TRITON_EMBED_ADMIN_KEY": server.admin_key}  # the configs are read
    cli("embed", str(corpus), "-o", str(out), "--url", server.grpc_url, "--model", "splade",
        "--top-k", "16", "--shard-rows", "4", env=env)  # fmt: skip
    cli("verify", str(out))
    table = pq.read_table(out).sort_by("id")
    got = [
        (
            np.array([e["index"] for e in row], np.int32),
            np.array([e["value"] for e in row], np.float32),
        )
        for row in table.column("sparse").to_pylist()
    ]
    assert_matches(got, splade_reference(folders["splade"], texts), top_k=16)
