"""Multi-vector models in the repository: folders, add/list/remove, refusals, the tokenizer's IDs.

The ColBERT folders are made by ``tests/colbert_factory.py`` (Stanford's ``HF_ColBERT`` and
PyLate's layout); the hidden-state model is a small dense encoder (``tests/model_factory.py``).
Failing cases copy and edit one. No server, no engine: the configs ``repository add`` writes
are parsed back with the steps' own config classes, and the tokenizer step's IDs are compared
with each reference library's tokenization (markers, truncation, query augmentation).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from triton_embed import codec
from triton_embed.multivector_options import MultiVectorOptions
from triton_embed.options import Truncation
from triton_embed.serving_limits import TOKEN_MATRIX_BYTES
from triton_embed.transport.catalog import ModelKind, MultiVectorInfo, served_model
from triton_embed_server.host.shm.sizing import step_size
from triton_embed_server.models import repository as gen
from triton_embed_server.models.instance_group import read_config_pbtxt
from triton_embed_server.models.multivector_spec import (
    Layout,
    is_multivector,
    read_multivector_spec,
)
from triton_embed_server.models.repository import ModelOptions, RepositoryError
from triton_embed_server.models.spec import ModelFolderError
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.errors import TooLongError, TooMuchWorkError
from triton_embed_server.steps.multivector_config import TokenEncoderConfig
from triton_embed_server.steps.token_matrices import check_response_size
from triton_embed_server.steps.tokenization import TextRequest, TextTokenizer

from tests.colbert_factory import (
    COLBERT_DIM,
    DOCUMENT_LENGTH,
    QUERY_LENGTH,
    make_pylate_colbert,
    make_stanford_colbert,
    reference_ids,
    reference_inputs,
    reference_skiplist,
)
from tests.model_factory import HIDDEN_SIZE, fortune_texts, make_mean_encoder


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("colbert")
    return {
        "stanford": make_stanford_colbert(base / "stanford"),
        "pylate": make_pylate_colbert(base / "pylate"),
        "dense": make_mean_encoder(base / "dense"),
    }


def copy(built, tmp_path, which: str) -> Path:
    return Path(shutil.copytree(built[which], tmp_path / "models" / which))


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def texts() -> list[str]:
    return [
        *fortune_texts(5, seed=61),
        " ".join(fortune_texts(12, seed=62)),  # over the document and query lengths
        "Grüße aus Köln — 東京? naïve café",
        "a",
    ]


def test_colbert_folders_are_multivector_models_and_dense_ones_are_not(built):
    assert is_multivector(built["stanford"]) and is_multivector(built["pylate"])
    assert not is_multivector(built["dense"])


def test_the_spec_is_what_each_layout_states(built):
    from tokenizers import Tokenizer

    stanford = read_multivector_spec(built["stanford"])
    vocab = Tokenizer.from_file(str(built["stanford"] / "tokenizer.json"))
    assert (stanford.layout, stanford.architecture) == (Layout.STANFORD, "HF_ColBERT")
    assert (stanford.dim, stanford.normalize) == (COLBERT_DIM, True)
    assert (stanford.max_length, stanford.query_length) == (DOCUMENT_LENGTH, QUERY_LENGTH)
    assert stanford.query_marker_id == vocab.token_to_id("[unused0]")
    assert stanford.document_marker_id == vocab.token_to_id("[unused1]")
    assert stanford.mask_id == vocab.token_to_id("[MASK]") and stanford.attend_expansion
    pylate = read_multivector_spec(built["pylate"])
    vocab = Tokenizer.from_file(str(built["pylate"] / "tokenizer.json"))
    assert (pylate.layout, pylate.architecture, pylate.dim) == (
        Layout.PYLATE,
        "BertModel",
        COLBERT_DIM,
    )
    assert pylate.query_marker_id == vocab.token_to_id("[Q] ")
    assert pylate.document_marker_id == vocab.token_to_id("[D] ")
    with pytest.raises(ModelFolderError, match=r"not a ColBERT model; pass --kind multivector"):
        read_multivector_spec(built["dense"])
    hidden = read_multivector_spec(built["dense"], hidden=True)
    assert (hidden.layout, hidden.dim, hidden.normalize) == (Layout.HIDDEN, HIDDEN_SIZE, False)
    assert (hidden.max_length, hidden.query_length, hidden.mask_id) == (128, 0, -1)


def test_a_stanford_checkpoint_without_metadata_takes_colbertconfigs_defaults(built, tmp_path):
    folder = copy(built, tmp_path, "stanford")
    (folder / "artifact.metadata").unlink()
    spec = read_multivector_spec(folder)
    assert (spec.query_length, spec.max_length, spec.attend_expansion) == (32, 220, False)


@pytest.mark.parametrize(
    ("which", "edit"),
    [
        ("stanford", None),  # mask_punctuation absent: ColBERTConfig's default, true
        ("stanford", {"mask_punctuation": True}),
        ("stanford", {"mask_punctuation": False}),
        ("pylate", None),
        ("pylate", {"skiplist_words": [".", ",", "no-such-token"]}),  # the last: [UNK]'s ID
        ("pylate", {"skiplist_words": []}),
        ("dense", None),
    ],
)
def test_the_skiplist_is_the_token_ids_each_reference_drops(built, tmp_path, which, edit):
    folder = copy(built, tmp_path, which)
    if edit:
        stated = "artifact.metadata" if which == "stanford" else "config_sentence_transformers.json"
        edit_json(folder / stated, **edit)
    spec = read_multivector_spec(folder, hidden=which == "dense")
    assert set(spec.skiplist) == reference_skiplist(folder)
    assert list(spec.skiplist) == sorted(spec.skiplist)
    assert bool(spec.skiplist) == (which != "dense" and edit not in (
        {"mask_punctuation": False}, {"skiplist_words": []}))  # fmt: skip
    assert spec.parameters()["skiplist"] == ",".join(map(str, spec.skiplist))
    kept_ids = [i for i in range(100) if i not in spec.skiplist][:3]
    ids = [kept_ids[0], *spec.skiplist[:2], *kept_ids[1:]]
    assert spec.kept_rows(ids, "query") is None
    kept = spec.kept_rows(ids, "document")
    if spec.skiplist:
        assert kept.tolist() == [True] + [False] * len(spec.skiplist[:2]) + [True, True]
    else:
        assert kept is None


def test_a_skiplist_parameter_that_is_no_token_id_list_is_refused_by_name(tmp_path, built):
    repo = tmp_path / "repo"
    gen.add_model(repo, ModelOptions(name="colbert", model=str(built["stanford"])))
    encoder = read_config_pbtxt(repo / "colbert_token_encoder" / "config.pbtxt")
    assert encoder["parameters"]["skiplist"]["string_value"] == ",".join(
        map(str, sorted(reference_skiplist(built["stanford"])))
    )
    encoder["parameters"]["skiplist"] = {"string_value": "1,x"}
    with pytest.raises(ValueError, match=r"parameter skiplist='1,x' is not a comma-separated"):
        TokenEncoderConfig.from_model_config(encoder, repo)


@pytest.mark.parametrize(
    ("which", "edit", "message"),
    [
        ("stanford", "no_linear", r"no linear.weight \(the ColBERT projection\)"),
        ("stanford", "bad_marker", r"no token '\[nope\]' \(query_token_id\)"),
        ("pylate", "extra_module", r"modules Transformer, Dense, Normalize; a PyLate model"),
        ("pylate", "residual", r"use_residual is not served"),
        ("pylate", "long_query", r"query length 64 is more than the document length 48"),
        ("dense", "dense_module", r"a Dense module projects the pooled vector"),
        ("stanford", "no_tokenizer", r"tokenizer.json: missing"),
    ],
)
def test_a_folder_that_cannot_be_served_is_refused_by_name(built, tmp_path, which, edit, message):
    from safetensors.torch import load_file, save_file

    folder = copy(built, tmp_path, which)
    if edit == "no_linear":
        weights = load_file(str(folder / "model.safetensors"))
        del weights["linear.weight"]
        save_file(weights, str(folder / "model.safetensors"))
    elif edit == "bad_marker":
        edit_json(folder / "artifact.metadata", query_token_id="[nope]")
    elif edit == "extra_module":
        modules = json.loads((folder / "modules.json").read_text())
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})  # fmt: skip
        (folder / "modules.json").write_text(json.dumps(modules))
    elif edit == "residual":
        edit_json(folder / "1_Dense" / "config.json", use_residual=True)
    elif edit == "long_query":
        edit_json(folder / "config_sentence_transformers.json", query_length=64)
    elif edit == "dense_module":
        modules = json.loads((folder / "modules.json").read_text())
        modules.append({"idx": 3, "name": "3", "path": "3_Dense",
                        "type": "sentence_transformers.models.Dense"})  # fmt: skip
        (folder / "modules.json").write_text(json.dumps(modules))
    elif edit == "no_tokenizer":
        (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelFolderError, match=message):
        read_multivector_spec(folder, hidden=which == "dense")


def test_add_writes_the_ensemble_and_its_steps_which_parse_back(tmp_path, built):
    repo = tmp_path / "repo"
    written = gen.add_model(repo, ModelOptions(name="colbert", model=str(built["stanford"])))
    assert [p.name for p in written] == ["colbert", "colbert_tokenizer", "colbert_token_encoder"]
    ensemble = read_config_pbtxt(repo / "colbert" / "config.pbtxt")
    assert [o["name"] for o in ensemble["output"]] == ["TOKEN_EMBEDDINGS", "NUM_TOKENS"]
    params = {k: v["string_value"] for k, v in ensemble["parameters"].items()}
    assert params == {
        "kind": "multivector",
        "served_model_name": "stanford",
        "dimension": str(COLBERT_DIM),
        "max_length": str(DOCUMENT_LENGTH),
        "query_length": str(QUERY_LENGTH),
        "max_response_bytes": str(TOKEN_MATRIX_BYTES),
    }
    encoder = read_config_pbtxt(repo / "colbert_token_encoder" / "config.pbtxt")
    config = TokenEncoderConfig.from_model_config(encoder, repo)
    assert config.spec == read_multivector_spec(built["stanford"])
    assert config.max_length == DOCUMENT_LENGTH and config.dtype == "float32"
    assert config.kv_cache_bytes == 0 and config.max_response_bytes == TOKEN_MATRIX_BYTES
    assert config.max_request_tokens == 64 * DOCUMENT_LENGTH
    gpu = read_config_pbtxt(repo / "colbert_token_encoder" / "configs" / "gpu.pbtxt")
    assert TokenEncoderConfig.from_model_config(gpu, repo).dtype == "float16"
    tokenizer = TokenizerConfig.from_model_config(
        read_config_pbtxt(repo / "colbert_tokenizer" / "config.pbtxt"), repo
    )
    assert (tokenizer.kind, tokenizer.max_chunks, tokenizer.truncation) == (
        "multivector",
        1,
        Truncation.END,
    )
    assert tokenizer.multivector == config.spec and tokenizer.max_length == DOCUMENT_LENGTH
    steps = ["colbert_tokenizer", "colbert_token_encoder"]
    info = served_model(ensemble, {s: read_config_pbtxt(repo / s / "config.pbtxt") for s in steps})
    assert isinstance(info, MultiVectorInfo) and info.kind is ModelKind.MULTIVECTOR
    assert (info.dimension, info.max_length, info.query_length) == (
        COLBERT_DIM,
        DOCUMENT_LENGTH,
        QUERY_LENGTH,
    )
    # 64 texts x 48 tokens x 32 values x 4 bytes = 393,216 bytes: the whole batch fits the cap
    assert info.piece_size(None) == 64
    size = step_size("colbert_token_encoder", encoder, repo, kind="token_encoder")
    assert size.tensors["TOKEN_EMBEDDINGS"] == 64 * (4 + 4 * DOCUMENT_LENGTH * COLBERT_DIM)


def test_list_shows_the_multivector_kind_and_remove_deletes_its_three_models(tmp_path, built):
    repo = tmp_path / "repo"
    gen.add_model(repo, ModelOptions(name="colbert", model=str(built["stanford"]), instances=1))
    gen.add_model(repo, ModelOptions(name="pylate", model=str(built["pylate"])))
    gen.add_model(repo, ModelOptions(name="tokens", model=str(built["dense"]), kind="multivector"))
    listed = {m.name: m for m in gen.list_models(repo)}
    assert {n: m.kind for n, m in listed.items()} == {
        "colbert": "multivector",
        "pylate": "multivector",
        "tokens": "multivector",
    }
    assert all(m.error is None for m in listed.values())
    assert listed["tokens"].spec["multivector_layout"] == "hidden"
    assert listed["pylate"].spec["multivector_layout"] == "pylate"
    table = gen.format_table(list(listed.values())).splitlines()
    row = next(line for line in table if line.startswith("colbert "))
    assert row.split()[:9] == ["colbert", "multivector", "cpu", "float32", "none", "1",
                               str(COLBERT_DIM), "tokens", "stanford"]  # fmt: skip
    skipped = len(reference_skiplist(built["stanford"]))  # the document rows it leaves out
    assert row.split()[9] == f"skip={skipped}" and listed["tokens"].spec["skiplist"] == ""
    removed = gen.remove_model(repo, "colbert")
    assert sorted(p.name for p in removed) == [
        "colbert",
        "colbert_token_encoder",
        "colbert_tokenizer",
    ]


@pytest.mark.parametrize(
    ("which", "options", "message"),
    [
        ("stanford", {"pooling": "mean"}, r"--pooling is for embedding models; .* multi-vector"),
        ("stanford", {"dtype": "bfloat16"}, r"--dtype bfloat16 on cpu is not offered"),
        ("stanford", {"kind": "embedding"}, r"is a ColBERT model .*leave --kind out"),
        ("pylate", {"kind": "sparse"}, r"is a ColBERT model"),
        ("stanford", {"max_length": 49}, r"--max-length 49 must be in \[3, 48\]"),
        ("stanford", {"max_length": 12}, r"less than the model's query length 16"),
    ],
)
def test_options_of_other_kinds_are_refused(tmp_path, built, which, options, message):
    with pytest.raises(RepositoryError, match=message):
        gen.add_model(tmp_path / "r", ModelOptions(name="c", model=str(built[which]), **options))
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def tokenize(repo: Path, name: str, payloads, **options):
    config = TokenizerConfig.from_model_config(
        read_config_pbtxt(repo / f"{name}_tokenizer" / "config.pbtxt"), repo
    )
    opts = MultiVectorOptions(**options).text_options()
    (result,) = TextTokenizer(config).tokenize_requests([TextRequest(payloads, opts)])
    return result


@pytest.mark.parametrize("which", ["stanford", "pylate", "dense"])
@pytest.mark.parametrize("side", ["query", "document"])
def test_the_tokenizer_step_gives_each_references_token_ids(tmp_path, built, which, side):
    repo = tmp_path / "repo"
    kind = "multivector" if which == "dense" else ""
    gen.add_model(repo, ModelOptions(name="m", model=str(built[which]), kind=kind))
    sample = texts()
    result = tokenize(repo, "m", [t.encode() for t in sample], input_type=side)
    assert not isinstance(result, Exception), result
    want = reference_ids(built[which], sample, side)
    assert result.token_ids == want
    assert result.num_tokens == [len(ids) for ids in want]
    if which != "dense" and side == "query":
        assert set(result.num_tokens) == {QUERY_LENGTH}  # augmented with [MASK]


def test_truncation_none_refuses_a_long_query_with_its_length(tmp_path, built):
    repo = tmp_path / "repo"
    gen.add_model(repo, ModelOptions(name="m", model=str(built["stanford"])))
    long = " ".join(fortune_texts(6, seed=63)).encode()
    result = tokenize(repo, "m", [long], input_type="query", truncation="NONE")
    assert isinstance(result, TooLongError)
    assert f"the model accepts {QUERY_LENGTH}" in str(result)


def test_options_refuse_chunk_and_unknown_sides():
    with pytest.raises(ValueError, match=r"truncation='CHUNK' is not offered for multi-vector"):
        MultiVectorOptions(truncation="CHUNK")
    with pytest.raises(ValueError, match=r"input_type='passage' must be one of document, query"):
        MultiVectorOptions(input_type="passage")
    with pytest.raises(ValueError, match=r"request parameter 'top_k' is not an option"):
        MultiVectorOptions.from_parameters({"top_k": 3})
    opts = MultiVectorOptions.from_parameters({"input_type": "Query", "truncation": "start"})
    assert opts.to_parameters() == {"truncation": "START", "input_type": "query"}


def test_the_token_matrices_round_trip_with_their_counts():
    rng = np.random.default_rng(0)
    matrices = [rng.standard_normal((n, 7)).astype(np.float32) for n in (3, 1, 0, 5)]
    matrices[0][-1] = 0.0  # trailing zero bytes survive
    elements = codec.encode_token_matrices(matrices)
    decoded = codec.decode_token_matrices(list(elements), [3, 1, 0, 5])
    for got, want in zip(decoded, matrices, strict=True):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="a token matrix of 0 rows has 28 bytes"):
        codec.decode_token_matrices(list(elements), [3, 0, 0, 5])
    with pytest.raises(ValueError, match="different dimensions"):
        codec.decode_token_matrices([elements[0], b"\0" * 12], [3, 1])


def test_the_response_cap_names_its_arithmetic():
    assert check_response_size([10, 20], 128, 4 * 30 * 128) == 4 * 30 * 128
    with pytest.raises(TooMuchWorkError) as err:
        check_response_size([10, 21], 128, 4 * 30 * 128)
    assert str(err.value).startswith(
        "the request's 2 texts come to 31 tokens: their token vectors are 15872 bytes "
        "(4 x 31 tokens x 128 values), over the cap of 15360 bytes per response"
    )


def test_add_parameters_appends_entries_that_parse_and_refuses_a_key_twice():
    from triton_embed_server.models.repository.copies import add_parameters
    from triton_embed_server.models.repository.render import TEMPLATES

    text = (TEMPLATES / "tokenizer.pbtxt").read_text()
    added = add_parameters(text, {"dim": "32", "query_length": "16"}, "the spec")
    assert added.startswith(text[: text.rindex("}") + 1])
    assert '  # the spec\n  { key: "dim", value: { string_value: "32" } },' in added
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    parsed = text_format.Parse(added, model_config_pb2.ModelConfig())
    assert parsed.parameters["query_length"].string_value == "16"
    with pytest.raises(ValueError, match='already have the key "kind"'):
        add_parameters(text, {"kind": "x"}, "again")


def test_a_querys_expansion_is_the_trailing_run_of_mask_tokens_and_only_it(built, tmp_path):
    from dataclasses import replace

    from triton_embed_server.steps.masked_queries import query_passes

    spec = replace(read_multivector_spec(built["stanford"]), attend_expansion=False)
    assert spec.masks_expansion and not replace(spec, attend_expansion=True).masks_expansion
    assert not replace(spec, mask_id=-1).masks_expansion  # PyLate without query expansion
    m = spec.mask_id
    # [CLS] [Q] text-with-a-literal-[MASK] [SEP] [MASK] [MASK]: the text's own mask is a key
    ids = [2, spec.query_marker_id, 40, m, 41, 3, m, m]
    assert spec.query_key_mask(ids).tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert spec.query_key_mask(ids[:6]).tolist() == [1] * 6  # a full query: nothing to leave out
    assert spec.query_key_mask([m, m]).tolist() == [1, 1]  # some key must be attended
    assert spec.query_key_mask(ids).dtype == np.int64
    # as the references build it (their tokenizer's attention mask)
    folder = make_stanford_colbert(tmp_path / "masked", attend_to_mask_tokens=False)
    want_ids, want_masks = reference_inputs(folder, texts(), "query")
    masked = read_multivector_spec(folder)
    assert [masked.query_key_mask(x).tolist() for x in want_ids] == want_masks
    # repository add writes the setting; the token encoder's parameter can turn it over
    repo = tmp_path / "repo"
    gen.add_model(repo, ModelOptions(name="m", model=str(folder)))
    config = read_config_pbtxt(repo / "m_token_encoder" / "config.pbtxt")
    assert config["parameters"]["attend_expansion"]["string_value"] == "false"
    assert TokenEncoderConfig.from_model_config(config, repo).spec.masks_expansion
    config["parameters"]["attend_expansion"] = {"string_value": "true"}
    assert not TokenEncoderConfig.from_model_config(config, repo).spec.masks_expansion
    # forward passes of at most budget positions (texts x the longest), in order
    assert query_passes([16] * 10, 64) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert query_passes([5, 40, 3], 48) == [[0], [1], [2]]
    assert query_passes([100, 4, 4], 48) == [[0], [1, 2]]
    assert query_passes([], 48) == []
