"""Multi-vector models on a real tritonserver: TOKEN_EMBEDDINGS against transformers, APIs, cap.

One tritonserver (module scope) serves three models written by ``triton-embed repository
add`` (the CLI, as a user runs it) from folders built at test time:

* ``colbert``: a seeded Stanford ``HF_ColBERT`` checkpoint (``tests/colbert_factory.py``)
  saved with ``attend_to_mask_tokens: false`` (``ColBERTConfig``'s default): its queries run
  on the token encoder's ``transformers`` query encoder with the ``[MASK]`` expansion left out
  as keys, its documents on vLLM;
* ``tokens``: a small dense BERT encoder with ``--kind multivector`` (its hidden states),
  its response cap lowered to two full-length texts (``max_response_bytes``);
* ``dense``: the same folder as an embedding model (for the wrong-kind answers).

Reference: the token IDs and attention mask each reference library makes (markers,
truncation, the query's ``[MASK]`` augmentation, at 0 in the mask for ``colbert``'s queries;
``reference_inputs``), through ``transformers``' last hidden states, projected and
L2-normalized for ColBERT, a document's punctuation rows left out as the reference leaves
them out (``reference_vectors``; ``NUM_TOKENS`` is each matrix's rows); within ``rtol``
1e-4 + ``atol`` 1e-5 per value (float32 on CPU on both sides;
``tests/unit/test_multivector_engine.py`` says why).
Through the client library (``embed_tokens``), KServe v2 directly, the gateway's TEI
``/embed_all``, and the per-request cap error.
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

from tests.colbert_factory import (
    COLBERT_DIM,
    QUERY_LENGTH,
    make_stanford_colbert,
    reference_inputs,
    reference_vectors,
)
from tests.helpers import CLI, running, text_input
from tests.model_factory import HIDDEN_SIZE, fortune_texts, make_mean_encoder

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RTOL = 1e-4
ATOL = 1e-5
#: The ``tokens`` model's cap: two texts of its 128 tokens of 128 values (4 bytes each).
TOKENS_CAP = 2 * 4 * 128 * HIDDEN_SIZE
API_KEY = "multivector-gateway-key-7d2a"


def cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("colbert")
    return {
        "colbert": make_stanford_colbert(base / "colbert", attend_to_mask_tokens=False),
        "dense": make_mean_encoder(base / "dense"),
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory, folders):
    repo = tmp_path_factory.mktemp("multivector-repo") / "model_repository"
    for name, folder, kind in (
        ("colbert", folders["colbert"], []),
        ("tokens", folders["dense"], ["--kind", "multivector"]),
        ("dense", folders["dense"], []),
    ):
        cli("repository", "add", "--repository", str(repo), "--model", str(folder),
            "--name", name, "--instances", "1", *kind)  # fmt: skip
    for path in (repo / "tokens_token_encoder" / "config.pbtxt", repo / "tokens" / "config.pbtxt"):
        path.write_text(set_parameter(path.read_text(), "max_response_bytes", str(TOKENS_CAP)))
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with running(TritonServer(model_repository=repository), "multivector tritonserver") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def sample_texts():
    return [
        *fortune_texts(6, seed=81),
        " ".join(fortune_texts(12, seed=82)),  # over the document length: truncated
        "Grüße aus Köln — 東京? naïve café, señor 🚀",
        "?!... ;-)",  # punctuation only: a ColBERT document keeps [CLS], [D] and [SEP]
    ]


def expected(folder, texts, side):
    ids, masks = reference_inputs(folder, texts, side)
    return ids, reference_vectors(folder, ids, [side] * len(ids), masks)


def assert_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32 and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def infer(client, texts, model="colbert", **parameters):
    result = client.infer(model, [text_input(texts)], parameters=parameters or None)
    counts = result.as_numpy("NUM_TOKENS").reshape(-1)
    elements = result.as_numpy("TOKEN_EMBEDDINGS").reshape(-1)
    return codec.decode_token_matrices(list(elements), counts), counts


@pytest.mark.parametrize("side", ["query", "document"])
def test_kserve_token_embeddings_are_colberts(server, client, folders, side):
    texts = sample_texts()
    got, counts = infer(client, texts, input_type=side)
    ids, want = expected(folders["colbert"], texts, side)
    assert counts.tolist() == [len(w) for w in want]
    if side == "query":
        assert set(counts.tolist()) == {QUERY_LENGTH}
        unmasked = reference_vectors(folders["colbert"], ids)  # [MASK]s attended, as vLLM does
        assert max(float(np.abs(g - u).max()) for g, u in zip(got, unmasked, strict=True)) > 0.01
        assert "queries embedded by transformers" in server.log_tail(2_000_000)  # start line
    else:  # the punctuation rows are gone: fewer rows than tokens read
        assert sum(counts) < sum(len(i) for i in ids) and counts[-1] == 3
    assert_close(got, want)
    assert {g.shape[1] for g in got} == {COLBERT_DIM}


def test_the_client_library_embeds_tokens_in_several_requests(server, folders):
    from triton_embed import EmbeddingClient

    texts = sample_texts() * 9  # 72 texts: more than one request of the ensemble's 64
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key, model="colbert") as c:
        got = c.embed_tokens(texts, input_type="query")
        hidden = c.embed_tokens(texts[:8], model="tokens")
    assert_close(got, expected(folders["colbert"], texts, "query")[1])
    assert_close(hidden, expected(folders["dense"], texts[:8], "document")[1])


def test_the_cap_fails_its_request_alone_and_the_client_fits_under_it(server, client, folders):
    from triton_embed import EmbeddingClient

    long = [" ".join(fortune_texts(12, seed=83 + i)) for i in range(3)]  # 3 x 128 tokens
    with pytest.raises(InferenceServerException) as err:
        infer(client, long, model="tokens")
    assert "over the cap of 131072 bytes per response" in err.value.message()
    assert client.is_server_ready()
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key, model="tokens") as c:
        got = c.embed_tokens(long)  # pieces of two texts (the ensemble's max_response_bytes)
    assert_close(got, expected(folders["dense"], long, "document")[1])


@pytest.fixture(scope="module")
def gateway(server):
    from triton_embed_server.run.launcher import Gateway

    with Gateway([server.grpc_url], server.admin_key, api_key=API_KEY, model="dense") as gw:
        yield gw


def test_the_gateway_answers_embed_all_and_refuses_the_other_kinds(gateway, folders):
    import requests

    texts = sample_texts()[:4]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    r = requests.post(
        f"{gateway.base_url}/embed_all",
        json={"inputs": texts, "model": "colbert", "prompt_name": "query", "truncate": True},
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert_close(
        [np.array(m, np.float32) for m in r.json()],
        expected(folders["colbert"], texts, "query")[1],
    )
    r = requests.post(
        f"{gateway.base_url}/v1/embeddings",
        json={"input": texts, "model": "colbert"},
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_model_kind"
    assert "POST /embed_all" in r.json()["error"]["message"]
    r = requests.post(
        f"{gateway.base_url}/embed_all", json={"inputs": texts, "model": "dense"},
        headers=headers, timeout=60,
    )  # fmt: skip
    assert r.status_code == 400, r.text  # TEI's envelope: {"error": ..., "error_type": ...}
    assert "is an embedding model, not a multi-vector model" in r.json()["error"]
    models = requests.get(f"{gateway.base_url}/v1/models", headers=headers, timeout=60).json()
    assert {m["id"]: m["kind"] for m in models["data"]}["colbert"] == "multivector"


def test_the_bulk_job_writes_token_shards_that_verify(server, folders, tmp_path):
    import json
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = sample_texts()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "shards"
    env = {**os.environ, "TRITON_EMBED_ADMIN_KEY": server.admin_key}  # the configs are read
    proc = subprocess.run(
        [*CLI, "embed", str(corpus), "-o", str(out), "--url", server.grpc_url, "--model",
         "colbert", "--shard-rows", "4"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cli("verify", str(out))
    table = pq.read_table(out).sort_by("id")
    field = table.schema.field("tokens").type
    assert pa.types.is_list(field) and pa.types.is_fixed_size_list(field.value_type)
    assert (field.value_type.list_size, field.value_type.value_type) == (COLBERT_DIM, pa.float32())
    got = [np.array(row, np.float32) for row in table.column("tokens").to_pylist()]
    _, want = expected(folders["colbert"], texts, "document")
    assert table.column("num_tokens").to_pylist() == [len(w) for w in want]
    assert_close(got, want)
