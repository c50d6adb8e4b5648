"""Hybrid (BGE-M3) models on a real tritonserver: three heads against FlagEmbedding, errors, APIs.

One tritonserver (module scope) serves two models written by ``triton-embed repository add``
(the CLI, as a user runs it) from a seeded BGE-M3-style folder built at test time
(``tests/bgem3_factory.py``: an ``XLMRobertaModel`` with a Unigram tokenizer, and
``colbert_linear.pt`` / ``sparse_linear.pt``):

* ``m3``: the folder as the hybrid kind (recognised by its head files);
* ``m3small``: the same, its ColBERT response cap lowered to two full-length texts
  (``max_response_bytes``).

Reference: FlagEmbedding's arithmetic with ``transformers`` on the same weights and texts
(:func:`tests.bgem3_factory.bge_m3_reference`); dense, sparse weights and ColBERT values
within ``rtol`` 1e-4 + ``atol`` 1e-5 (float32 on CPU on both sides;
``tests/unit/test_hybrid_engine.py`` says why), the same sparse non-zero set. One request
asking for all three, one request per head, the sparse cuts, per-request errors.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_embed import codec
from triton_embed_server.models.repository.copies import set_parameter
from triton_embed_server.run.launcher import TritonServer
from tritonclient.utils import InferenceServerException

from tests.bgem3_factory import BGE_M3_MAX_LENGTH, COLBERT_DIM, bge_m3_reference, make_bge_m3
from tests.helpers import CLI, running, text_input
from tests.model_factory import HIDDEN_SIZE, fortune_texts

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RTOL = 1e-4
ATOL = 1e-5
#: ``m3small``'s cap: two texts of 127 ColBERT rows of 128 values (4 bytes each).
SMALL_CAP = 2 * 4 * (BGE_M3_MAX_LENGTH - 1) * COLBERT_DIM
OUTPUT_NAMES = ("EMBEDDING", "SPARSE", "TOKEN_EMBEDDINGS", "NUM_TOKENS")


def cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_bge_m3(tmp_path_factory.mktemp("bge-m3") / "bge-m3")


@pytest.fixture(scope="module")
def repository(tmp_path_factory, folder):
    repo = tmp_path_factory.mktemp("hybrid-repo") / "model_repository"
    for name in ("m3", "m3small"):
        cli("repository", "add", "--repository", str(repo), "--model", str(folder),
            "--name", name, "--instances", "1")  # fmt: skip
    for path in (repo / "m3small_hybrid_encoder" / "config.pbtxt", repo / "m3small" /
                 "config.pbtxt"):  # fmt: skip
        path.write_text(set_parameter(path.read_text(), "max_response_bytes", str(SMALL_CAP)))
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with running(TritonServer(model_repository=repository), "hybrid tritonserver") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def sample_texts():
    return [
        *fortune_texts(6, seed=91),
        " ".join(fortune_texts(12, seed=92)),  # over the 128-token budget: truncated
        "Grüße aus Köln — 東京? naïve café, señor",  # <unk> pieces, left out of sparse
    ]


def infer(client, texts, model="m3", **parameters):
    """``{output: per-text elements}`` and ``NUM_TOKENS`` of one request."""
    outputs = [grpcclient.InferRequestedOutput(n) for n in OUTPUT_NAMES]
    result = client.infer(
        model, [text_input(texts)], outputs=outputs, parameters=parameters or None
    )
    got = {n: list(result.as_numpy(n).reshape(-1)) for n in OUTPUT_NAMES[:3]}
    return got, result.as_numpy("NUM_TOKENS").reshape(-1)


def check_dense(elements, want):
    got = codec.decode_embeddings(elements, HIDDEN_SIZE)
    assert got.dtype == np.float32 and got.shape == want.dense.shape
    np.testing.assert_allclose(got, want.dense, rtol=RTOL, atol=ATOL)


def check_sparse(elements, want, top_k=None, threshold=0.0):
    for element, weights in zip(elements, want.sparse, strict=True):
        indices, values = codec.decode_sparse(element)
        kept = sorted(i for i in weights if weights[i] > threshold)
        if top_k is not None:
            kept = sorted(sorted(kept, key=lambda i: (-weights[i], i))[:top_k])
        assert indices.tolist() == kept, "the same non-zero set"
        np.testing.assert_allclose(values, [weights[i] for i in kept], rtol=RTOL, atol=ATOL)


def check_colbert(elements, counts, want):
    got = codec.decode_token_matrices(elements, [int(c) - 1 for c in counts])
    for g, w in zip(got, want.colbert, strict=True):
        assert g.dtype == np.float32 and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_one_request_answers_all_three_heads(client, folder):
    texts = sample_texts()
    want = bge_m3_reference(folder, texts)
    got, counts = infer(client, texts)
    assert counts.tolist() == [len(i) for i in want.token_ids]
    assert max(counts) == BGE_M3_MAX_LENGTH and any(3 in i for i in want.token_ids)
    check_dense(got["EMBEDDING"], want)
    check_sparse(got["SPARSE"], want)
    check_colbert(got["TOKEN_EMBEDDINGS"], counts, want)
    same, _ = infer(client, texts, outputs="dense,sparse,colbert")
    assert same == got


@pytest.mark.parametrize(
    ("head", "tensor"),
    [("dense", "EMBEDDING"), ("sparse", "SPARSE"), ("colbert", "TOKEN_EMBEDDINGS")],
)
def test_a_request_for_one_head_gets_it_alone(client, folder, head, tensor):
    texts = sample_texts()
    want = bge_m3_reference(folder, texts)
    got, counts = infer(client, texts, outputs=head.upper())
    for name, elements in got.items():
        if name != tensor:
            assert [bytes(e) for e in elements] == [b""] * len(texts), name
    {"dense": lambda: check_dense(got[tensor], want),
     "sparse": lambda: check_sparse(got[tensor], want),
     "colbert": lambda: check_colbert(got[tensor], counts, want)}[head]()  # fmt: skip


def test_top_k_and_threshold_cut_the_sparse_output(client, folder):
    texts = sample_texts()
    want = bge_m3_reference(folder, texts)
    got, _ = infer(client, texts, outputs="sparse", top_k=5, threshold=0.5)
    check_sparse(got["SPARSE"], want, top_k=5, threshold=0.5)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"outputs": "dense,lexical"}, "request parameter outputs='dense,lexical' must be a "
         "comma-separated list of dense, sparse, colbert ('lexical' is not one)"),
        ({"outputs": ""}, "request parameter outputs='' must be a comma-separated list"),
        ({"top_k": 0}, "top_k"),
        ({"threshold": -1}, "threshold"),
        ({"truncation": "CHUNK"}, "is not offered for hybrid models"),
        ({"normalize": "false"}, "request parameter 'normalize' is not an option"),
    ],
)  # fmt: skip
def test_bad_options_fail_their_request_alone(client, parameters, message):
    with pytest.raises(InferenceServerException) as err:
        infer(client, ["a text"], **parameters)
    assert message in err.value.message()
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    got, _ = infer(client, ["a text"], outputs="dense")
    assert len(got["EMBEDDING"][0]) == 4 * HIDDEN_SIZE


def test_the_colbert_cap_fails_its_request_alone(client, folder):
    long = [" ".join(fortune_texts(12, seed=93 + i)) for i in range(3)]  # 3 x 128 tokens
    with pytest.raises(InferenceServerException) as err:
        infer(client, long, model="m3small")
    assert f"over the cap of {SMALL_CAP} bytes per response" in err.value.message()
    assert "come to 381 ColBERT rows" in err.value.message()
    assert "(4 x 381 ColBERT rows x 128 values)" in err.value.message()
    got, _ = infer(client, long, model="m3small", outputs="dense,sparse")  # no ColBERT: no cap
    want = bge_m3_reference(folder, long)
    check_dense(got["EMBEDDING"], want)
    check_sparse(got["SPARSE"], want)
    assert client.is_server_ready()


def test_the_client_library_serves_each_head_by_name(server, folder):
    from triton_embed import EmbeddingClient

    texts = sample_texts() * 9  # 72 texts: more than one request of the ensemble's 64
    want = bge_m3_reference(folder, texts)
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key, model="m3") as c:
        dense = c.embed_with_details(texts)
        sparse = c.embed_sparse(texts, top_k=5)
        tokens = c.embed_tokens(texts[:8], model="m3small")  # pieces within its cap
    np.testing.assert_allclose(dense.embeddings, want.dense, rtol=RTOL, atol=ATOL)
    assert dense.num_tokens.tolist() == [len(i) for i in want.token_ids]
    check_sparse(codec.encode_sparse(sparse.indices, sparse.weights), want, top_k=5)
    for g, w in zip(tokens, want.colbert[:8], strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


API_KEY = "hybrid-gateway-key-41c9"


@pytest.fixture(scope="module")
def gateway(server):
    from triton_embed_server.run.launcher import Gateway

    with Gateway([server.grpc_url], server.admin_key, api_key=API_KEY, model="m3") as gw:
        yield gw


def post(gateway, route, body):
    import requests

    headers = {"Authorization": f"Bearer {API_KEY}"}
    return requests.post(f"{gateway.base_url}{route}", json=body, headers=headers, timeout=60)


def test_the_gateway_serves_dense_sparse_and_token_routes(gateway, folder):
    texts = sample_texts()
    want = bge_m3_reference(folder, texts)
    r = post(gateway, "/v1/embeddings", {"input": texts, "model": "m3"})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    np.testing.assert_allclose(got, want.dense, rtol=RTOL, atol=ATOL)
    tei = {"model": "m3", "truncate": True}  # TEI refuses an over-long text by default
    r = post(gateway, "/embed_sparse", {"inputs": texts, **tei, "threshold": 0.5})
    assert r.status_code == 200, r.text
    for row, weights in zip(r.json(), want.sparse, strict=True):
        kept = sorted(i for i in weights if weights[i] > 0.5)
        assert [e["index"] for e in row] == kept
        np.testing.assert_allclose([e["value"] for e in row], [weights[i] for i in kept],
                                   rtol=RTOL, atol=ATOL)  # fmt: skip
    r = post(gateway, "/embed_all", {"inputs": texts[:4], **tei})
    assert r.status_code == 200, r.text
    for g, w in zip(r.json(), want.colbert[:4], strict=True):
        np.testing.assert_allclose(np.array(g, np.float32), w, rtol=RTOL, atol=ATOL)


def test_the_gateway_refuses_what_a_hybrid_model_does_not_do(gateway):
    import requests

    r = post(gateway, "/v1/embeddings", {"input": ["x"], "model": "m3", "dimensions": 64})
    assert r.status_code == 400, r.text
    assert "dimensions" in r.json()["error"]["message"]
    assert "not offered for hybrid models" in r.json()["error"]["message"]
    r = post(gateway, "/v2/rerank", {"model": "m3", "query": "q", "documents": ["a", "b"]})
    assert r.status_code == 400, r.text  # Cohere's envelope: {"message": ...}
    assert "is a hybrid model (BGE-M3), not a reranker" in r.json()["message"]
    assert "POST /v1/embeddings, /embed_sparse and /embed_all" in r.json()["message"]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    models = requests.get(f"{gateway.base_url}/v1/models", headers=headers, timeout=60).json()
    assert {m["id"]: m["kind"] for m in models["data"]}["m3"] == "hybrid"


@pytest.mark.parametrize("output_kind", ["dense", "sparse", "tokens"])
def test_the_bulk_job_writes_each_heads_shards_as_the_client_gets_them(
    server, tmp_path, output_kind
):
    import json
    import os

    import pyarrow.parquet as pq
    from triton_embed import EmbeddingClient
    from triton_embed.bulk import shards

    texts = sample_texts()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / output_kind
    flags = [] if output_kind == "dense" else ["--output-kind", output_kind]
    env = {**os.environ, "TRITON_EMBED_ADMIN_KEY": server.admin_key}  # the configs are read
    proc = subprocess.run(
        [*CLI, "embed", str(corpus), "-o", str(out), "--url", server.grpc_url, "--model", "m3",
         "--shard-rows", "3", "--no-progress", *flags],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cli("verify", str(out), str(corpus))
    table = pq.read_table(out).sort_by("id")
    column = {"dense": "embedding", "sparse": "sparse", "tokens": "tokens"}[output_kind]
    assert shards.read_manifest(out)["kind"] == {"dense": "embedding", "sparse": "sparse",
                                                 "tokens": "multivector"}[output_kind]  # fmt: skip
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key, model="m3") as c:
        if output_kind == "dense":  # input_type=document: BGE-M3 has no prompt, as none
            want = c.embed_with_details(texts)
            got = np.array(table.column(column).to_pylist(), np.float32)
            np.testing.assert_allclose(got, want.embeddings, rtol=RTOL, atol=ATOL)
            assert table.column("num_tokens").to_pylist() == want.num_tokens.tolist()
        elif output_kind == "sparse":
            want = c.embed_sparse(texts)
            for row, idx, val in zip(table.column(column).to_pylist(), want.indices,
                                     want.weights, strict=True):  # fmt: skip
                assert [e["index"] for e in row] == idx.tolist()
                got = np.array([e["value"] for e in row], np.float32)
                np.testing.assert_allclose(got, val, rtol=RTOL, atol=ATOL)
        else:
            want = c.embed_tokens(texts)
            for row, matrix in zip(table.column(column).to_pylist(), want, strict=True):
                got = np.array(row, np.float32).reshape(matrix.shape)
                np.testing.assert_allclose(got, matrix, rtol=RTOL, atol=ATOL)
            assert table.column("num_tokens").to_pylist() == [len(m) for m in want]


def reference_tokenizer(folder):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def test_the_gateway_decodes_sparse_indices_and_token_ids_as_the_tokenizer(gateway, folder):
    tokenizer = reference_tokenizer(folder)
    texts = sample_texts()
    ids = [tokenizer.encode(t).ids for t in texts]
    r = post(gateway, "/decode", {"ids": ids, "model": "m3"})
    assert r.status_code == 200, r.text
    assert r.json() == [tokenizer.decode(i, skip_special_tokens=True) for i in ids]
    r = post(gateway, "/decode", {"ids": ids[0], "skip_special_tokens": False, "model": "m3"})
    assert r.json() == [tokenizer.decode(ids[0], skip_special_tokens=False)]
    assert r.json()[0].startswith("<s>")
    sparse = post(gateway, "/embed_sparse", {"inputs": texts[:2], "model": "m3", "truncate": True})
    indices = [e["index"] for e in sparse.json()[0]]
    r = post(gateway, "/decode", {"ids": [[i] for i in indices], "model": "m3"})
    assert r.status_code == 200 and len(indices) > 3, r.text
    assert r.json() == [tokenizer.decode([i]) for i in indices]  # one token per index


def test_the_gateway_refuses_ids_outside_the_vocabulary_naming_it(gateway, folder):
    vocab = reference_tokenizer(folder).get_vocab_size(with_added_tokens=True)
    r = post(gateway, "/decode", {"ids": [[5, 6], [7, vocab]], "model": "m3"})
    assert r.status_code == 400, r.text
    assert (
        f"sequence 1 has token ID {vocab} at position 1, outside the vocabulary [0, {vocab})"
        in r.json()["error"]
    )
    r = post(gateway, "/decode", {"ids": [[-1]], "model": "m3"})
    assert r.status_code == 400 and "ids[0][0] is -1, not a token ID" in r.json()["error"]


def test_the_client_decodes_and_the_step_answers_over_kserve(server, client, folder):
    from triton_embed import EmbeddingClient
    from triton_embed.errors import InvalidInputError

    tokenizer = reference_tokenizer(folder)
    ids = [tokenizer.encode(t).ids for t in sample_texts()] * 10  # 80: two requests of 64
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key, model="m3") as c:
        assert c.decode(ids) == [tokenizer.decode(i) for i in ids]
        assert c.decode(ids[:2], skip_special_tokens=False) == [
            tokenizer.decode(i, skip_special_tokens=False) for i in ids[:2]
        ]
        with pytest.raises(InvalidInputError) as err:
            c.decode([[5]] * 70 + [[1 << 30]])
        assert err.value.index == 70
        assert "ids[70] was rejected: sequence 6 has token ID 1073741824" in str(err.value)
    # the step itself: DECODE_IDS in, DECODED out; neither input is refused alone
    payloads = codec.encode_token_ids(ids[:2]).reshape(-1, 1)
    tensor = grpcclient.InferInput("DECODE_IDS", list(payloads.shape), "BYTES")
    tensor.set_data_from_numpy(payloads)
    result = client.infer("m3_tokenizer", [tensor],
                          outputs=[grpcclient.InferRequestedOutput("DECODED")])  # fmt: skip
    got = [bytes(t).decode() for t in result.as_numpy("DECODED").reshape(-1)]
    assert got == [tokenizer.decode(i) for i in ids[:2]]
    with pytest.raises(InferenceServerException) as err:
        client.infer("m3_tokenizer", [], outputs=[grpcclient.InferRequestedOutput("DECODED")])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    got, _ = infer(client, ["a text"], outputs="dense")  # the ensemble is unaffected
    assert len(got["EMBEDDING"][0]) == 4 * HIDDEN_SIZE
