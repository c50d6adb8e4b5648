"""Hybrid (BGE-M3) models in the repository: the folder, add/list/remove, refusals, options.

The folder is made by ``tests/bgem3_factory.py`` (an ``XLMRobertaModel`` with a Unigram
tokenizer and the two head files); failing cases copy and edit it. No server, no engine: the
configs ``repository add`` writes are parsed back with the steps' own config classes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from triton_embed.hybrid_options import HybridOptions, head_parameters
from triton_embed.options import Truncation
from triton_embed.serving_limits import TOKEN_MATRIX_BYTES
from triton_embed.transport.catalog import ModelKind
from triton_embed.transport.hybrid_info import HybridInfo, any_served_model
from triton_embed_server.host.node_memory import engine_needs
from triton_embed_server.host.shm.sizing import step_size
from triton_embed_server.models import repository as gen
from triton_embed_server.models.hybrid_spec import HybridSpec, is_hybrid, read_hybrid_spec
from triton_embed_server.models.instance_group import read_config_pbtxt
from triton_embed_server.models.repository import ModelOptions, RepositoryError
from triton_embed_server.models.spec import ModelFolderError
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.errors import InvalidArgumentError
from triton_embed_server.steps.hybrid_config import HybridEncoderConfig
from triton_embed_server.steps.hybrid_heads import HybridHeads
from triton_embed_server.steps.tokenization import parse_request_options

from tests.bgem3_factory import BGE_M3_MAX_LENGTH, COLBERT_DIM, make_bge_m3
from tests.model_factory import HIDDEN_SIZE


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_bge_m3(tmp_path_factory.mktemp("bge-m3") / "bge-m3")


def copy(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(folder, out)
    return out


def test_the_folder_is_hybrid_and_its_spec_is_what_it_states(folder):
    assert is_hybrid(folder)
    assert read_hybrid_spec(folder) == HybridSpec(
        architecture="XLMRobertaModel",
        dim=HIDDEN_SIZE,
        colbert_dim=COLBERT_DIM,
        vocab_size=read_hybrid_spec(folder).vocab_size,
        max_length=BGE_M3_MAX_LENGTH,
        skipped_token_ids=(0, 1, 2, 3),  # <s>, <pad>, </s>, <unk>
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: (p / "sparse_linear.pt").unlink(), "sparse_linear.pt: missing"),
        (lambda p: torch.save(torch.nn.Linear(HIDDEN_SIZE, 2).state_dict(),
                              p / "sparse_linear.pt"),
         r"weight \(2, 128\), bias \(2,\); the encoder's hidden size is 128, so a head of 1 "
         r"outputs has weight \(1, 128\) and bias \(1,\)"),
        (lambda p: torch.save(torch.nn.Linear(64, 64).state_dict(), p / "colbert_linear.pt"),
         r"colbert_linear.pt: weight \(64, 64\)"),
        (lambda p: torch.save({"w": torch.zeros(1)}, p / "colbert_linear.pt"),
         "not a torch.nn.Linear state dict"),
        (lambda p: (p / "colbert_linear.pt").write_bytes(b"not a pickle"), "unreadable"),
    ],
)  # fmt: skip
def test_a_folder_that_cannot_be_served_is_refused_by_name(folder, tmp_path, edit, message):
    broken = copy(folder, tmp_path)
    edit(broken)
    with pytest.raises(ModelFolderError, match=message):
        read_hybrid_spec(broken)
    with pytest.raises(RepositoryError, match=message):
        gen.add_model(tmp_path / "r", ModelOptions(name="m", model=str(broken), kind="hybrid"))


def test_add_writes_the_ensemble_and_its_steps_which_parse_back(tmp_path, folder):
    repo = tmp_path / "repo"
    written = gen.add_model(repo, ModelOptions(name="m3", model=str(folder)))
    assert [p.name for p in written] == ["m3", "m3_tokenizer", "m3_hybrid_encoder"]
    ensemble = read_config_pbtxt(repo / "m3" / "config.pbtxt")
    assert [o["name"] for o in ensemble["output"]] == [
        "EMBEDDING", "SPARSE", "TOKEN_EMBEDDINGS", "NUM_TOKENS"]  # fmt: skip
    spec = read_hybrid_spec(folder)
    params = {k: v["string_value"] for k, v in ensemble["parameters"].items()}
    assert params == {
        "kind": "hybrid",
        "served_model_name": "bge-m3",
        "dimension": str(HIDDEN_SIZE),
        "colbert_dimension": str(COLBERT_DIM),
        "vocab_size": str(spec.vocab_size),
        "max_length": str(BGE_M3_MAX_LENGTH),
        "max_response_bytes": str(TOKEN_MATRIX_BYTES),
    }
    encoder = read_config_pbtxt(repo / "m3_hybrid_encoder" / "config.pbtxt")
    config = HybridEncoderConfig.from_model_config(encoder, repo)
    assert config.spec == spec and config.max_length == BGE_M3_MAX_LENGTH
    assert config.dtype == "float32" and config.kv_cache_bytes == 0
    assert config.max_response_bytes == TOKEN_MATRIX_BYTES
    gpu = read_config_pbtxt(repo / "m3_hybrid_encoder" / "configs" / "gpu.pbtxt")
    assert HybridEncoderConfig.from_model_config(gpu, repo).dtype == "float32"
    tokenizer = TokenizerConfig.from_model_config(
        read_config_pbtxt(repo / "m3_tokenizer" / "config.pbtxt"), repo
    )
    assert (tokenizer.kind, tokenizer.max_chunks, tokenizer.truncation) == (
        "hybrid", 1, Truncation.END)  # fmt: skip
    steps = ["m3_tokenizer", "m3_hybrid_encoder"]
    info = any_served_model(
        ensemble, {s: read_config_pbtxt(repo / s / "config.pbtxt") for s in steps}
    )
    assert isinstance(info, HybridInfo) and info.kind is ModelKind.HYBRID
    assert (info.dimension, info.colbert_dimension) == (HIDDEN_SIZE, COLBERT_DIM)
    needs = engine_needs([repo])  # its node-memory need is counted, one per instance
    assert [(n.model, n.instance) for n in needs] == [("m3_hybrid_encoder", i) for i in (0, 1)]
    assert needs[0].weight_bytes > 0
    size = step_size("m3_hybrid_encoder", encoder, repo, kind="hybrid_encoder")
    rows = BGE_M3_MAX_LENGTH - 1
    assert size.tensors["TOKEN_EMBEDDINGS"] == 64 * (4 + 4 * rows * COLBERT_DIM)
    assert size.tensors["SPARSE"] == 64 * (4 + 8 * BGE_M3_MAX_LENGTH)


def test_list_shows_the_hybrid_kind_and_remove_deletes_its_three_models(tmp_path, folder):
    repo = tmp_path / "repo"
    gen.add_model(repo, ModelOptions(name="m3", model=str(folder), instances=1))
    (listed,) = gen.list_models(repo)
    assert (listed.kind, listed.error) == ("hybrid", None)
    row = gen.format_table([listed]).splitlines()[1].split()
    assert row[:7] == ["m3", "hybrid", "cpu", "float32", "none", "1", str(HIDDEN_SIZE)]
    removed = gen.remove_model(repo, "m3")
    assert sorted(p.name for p in removed) == ["m3", "m3_hybrid_encoder", "m3_tokenizer"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pooling": "mean"}, r"--pooling is for embedding models; .* hybrid model"),
        ({"dtype": "bfloat16"}, r"--dtype bfloat16 on cpu is not offered for hybrid models"),
        ({"max_length": BGE_M3_MAX_LENGTH + 1}, r"--max-length 129 must be in \[3, 128\]"),
    ],
)
def test_options_of_other_kinds_are_refused(tmp_path, folder, options, message):
    with pytest.raises(RepositoryError, match=message):
        gen.add_model(tmp_path / "r", ModelOptions(name="m", model=str(folder), **options))


def test_kind_hybrid_on_a_folder_without_heads_names_the_missing_file(tmp_path, folder):
    plain = copy(folder, tmp_path)
    (plain / "colbert_linear.pt").unlink()
    assert not is_hybrid(plain)
    with pytest.raises(RepositoryError, match="colbert_linear.pt: missing; a BGE-M3 folder"):
        gen.add_model(tmp_path / "r", ModelOptions(name="m", model=str(plain), kind="hybrid"))


def test_options_parse_the_heads_and_refuse_what_is_not_one():
    assert HybridOptions().heads == ("dense", "sparse", "colbert")
    opts = HybridOptions.from_parameters({"outputs": " ColBERT,dense,dense", "top_k": "3"})
    assert (opts.outputs, opts.top_k) == (("dense", "colbert"), 3)
    assert opts.to_parameters() == {"outputs": "dense,colbert", "top_k": 3}
    assert head_parameters(True, "sparse", {"top_k": 2}) == {"top_k": 2, "outputs": "sparse"}
    assert head_parameters(False, "sparse", {"top_k": 2}) == {"top_k": 2}
    for parameters, message in [
        ({"outputs": "dense,lexical"}, "('lexical' is not one)"),
        ({"outputs": ","}, "must be a comma-separated list of dense, sparse, colbert"),
        ({"truncation": "CHUNK"}, "is not offered for hybrid models"),
        ({"dimensions": 8}, "request parameter 'dimensions' is not an option"),
    ]:
        with pytest.raises(InvalidArgumentError) as err:
            parse_request_options(parameters, "hybrid")
        assert message in str(err.value)


def test_the_heads_follow_flagembeddings_formulas_on_any_states(folder):
    """Plain torch on random states: the per-ID max, the skipped IDs, the CLS row left out."""
    spec = read_hybrid_spec(folder)
    heads = HybridHeads(folder, spec)
    sparse = torch.load(folder / "sparse_linear.pt", weights_only=True)
    colbert = torch.load(folder / "colbert_linear.pt", weights_only=True)
    rng = np.random.default_rng(5)
    states = rng.standard_normal((7, HIDDEN_SIZE)).astype(np.float32)
    ids = [0, 40, 41, 40, 3, 1, 2]  # <s>, 40 twice, <unk>, <pad>, </s>
    weights = np.maximum(states @ sparse["weight"].numpy().T + sparse["bias"].numpy(), 0)[:, 0]
    want = {}
    for w, i in zip(weights, ids, strict=True):
        if i not in (0, 1, 2, 3) and w > 0:
            want[i] = max(want.get(i, 0.0), float(w))
    indices, values = heads.sparse(states, ids)
    assert indices.tolist() == sorted(want)
    np.testing.assert_allclose(values, [want[i] for i in sorted(want)], rtol=1e-6)
    vectors = states[1:] @ colbert["weight"].numpy().T + colbert["bias"].numpy()
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(heads.colbert(states), vectors, rtol=1e-5, atol=1e-6)
    dense = heads.dense([states, states[3:]])
    np.testing.assert_allclose(dense[0], states[0] / np.linalg.norm(states[0]), rtol=1e-6)
    np.testing.assert_allclose(dense[1], states[3] / np.linalg.norm(states[3]), rtol=1e-6)
