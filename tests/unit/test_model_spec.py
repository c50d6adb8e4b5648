"""What a model folder states: pooling, normalization, prompts, dimensions; one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from triton_embed_server.models.model_spec import read_model_spec, read_prompt_spec
from triton_embed_server.models.spec import ModelFolderError, PromptSpec
from triton_embed_server.steps.vectors import Dimensions, Pooling

from tests.helpers import MODEL_PATH


@pytest.fixture
def folder(tmp_path) -> Path:
    """A copy of all-MiniLM-L6-v2's small files (weights are not read)."""
    dest = tmp_path / "model"
    dest.mkdir()
    for name in ("config.json", "tokenizer.json", "modules.json", "sentence_bert_config.json"):
        shutil.copy(MODEL_PATH / name, dest / name)
    shutil.copytree(MODEL_PATH / "1_Pooling", dest / "1_Pooling")
    return dest


def write(path: Path, value) -> None:
    path.write_text(json.dumps(value))


def test_the_shipped_model_is_mean_pooled_normalized_384(folder):
    spec = read_model_spec(folder)
    assert (spec.pooling, spec.normalize, spec.dimension, spec.max_length) == (
        Pooling.MEAN,
        True,
        384,
        256,
    )
    assert spec.prompting == PromptSpec({}, None, True)
    assert spec.dimensions == Dimensions(384, (), False)


@pytest.mark.parametrize(
    "pooling_config, expected",
    [
        ({"pooling_mode_cls_token": True}, Pooling.CLS),
        ({"pooling_mode_lasttoken": True}, Pooling.LASTTOKEN),
        ({"pooling_mode": "lasttoken"}, Pooling.LASTTOKEN),
        ({"pooling_mode": "cls"}, Pooling.CLS),
    ],
)
def test_pooling_is_read_from_the_pooling_module(folder, pooling_config, expected):
    write(folder / "1_Pooling" / "config.json", {"word_embedding_dimension": 384, **pooling_config})
    assert read_model_spec(folder).pooling is expected


def test_without_a_normalize_module_vectors_are_not_normalized(folder):
    modules = json.loads((folder / "modules.json").read_text())[:2]
    write(folder / "modules.json", modules)
    assert read_model_spec(folder).normalize is False
    assert read_model_spec(folder, normalize="true").normalize is True


def test_prompts_default_prompt_and_include_prompt(folder):
    write(
        folder / "config_sentence_transformers.json",
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage"},
    )
    write(
        folder / "1_Pooling" / "config.json",
        {"pooling_mode_mean_tokens": True, "include_prompt": False},
    )
    prompting = read_prompt_spec(folder)
    assert prompting.include_prompt is False
    assert prompting.prompt(None) == "passage: "
    assert prompting.prompt("query") == "query: "
    assert prompting.prompt("document") == ""  # no document prompt: the text as is
    assert prompting.names() == ["document", "passage", "query"]
    with pytest.raises(ValueError) as info:
        prompting.prompt("code")
    assert str(info.value) == (
        "request parameter input_type='code' is not a prompt of this model; "
        "its input types are document, passage, query"
    )


def test_a_model_without_prompts_accepts_document_only():
    prompting = PromptSpec()
    assert prompting.prompt("document") == prompting.prompt(None) == ""
    with pytest.raises(ValueError, match="its input types are document$"):
        prompting.prompt("query")


def test_matryoshka_dimensions_from_config_json_and_overrides(folder):
    config = json.loads((folder / "config.json").read_text())
    write(folder / "config.json", {**config, "matryoshka_dimensions": [256, 64, 128]})
    spec = read_model_spec(folder)
    assert spec.dimensions.matryoshka == (64, 128, 256)
    assert spec.dimensions.check(64) == 64
    assert spec.dimensions.check(384) == 384
    with pytest.raises(ValueError) as info:
        spec.dimensions.check(100)
    assert str(info.value) == (
        "request parameter dimensions=100 is not a dimension of this model; "
        "allowed: 64, 128, 256, 384"
    )
    assert read_model_spec(folder, dimensions="32,16").dimensions.matryoshka == (16, 32)
    anything = read_model_spec(folder, dimensions="any")
    anything.dimensions.check(1)
    with pytest.raises(ValueError, match="allowed: any value from 1 to 384"):
        anything.dimensions.check(385)
    write(folder / "config.json", {**config, "is_matryoshka": True})
    assert read_model_spec(folder).dimensions.any_length is True


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda f: (f / "config.json").unlink(), "{f}/config.json: missing"),
        (
            lambda f: (f / "tokenizer.json").unlink(),
            "{f}/tokenizer.json: missing; the tokenizer step needs a fast (Rust) tokenizer "
            "file (save one with AutoTokenizer.from_pretrained(...).save_pretrained)",
        ),
        (
            lambda f: (f / "modules.json").unlink(),
            "{f}/modules.json: missing, so the folder states no pooling; give one "
            "(repository add --pooling mean|cls|lasttoken, or the pooling model parameter)",
        ),
        (
            lambda f: write(
                f / "modules.json",
                [
                    {"path": "", "type": "sentence_transformers.models.Transformer"},
                    {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                    {"path": "2_Dense", "type": "sentence_transformers.models.Dense"},
                ],
            ),
            "{f}/modules.json: module 'Dense' is not supported (served: Transformer, Pooling, "
            "Normalize); the vectors would differ from the model's",
        ),
        (
            lambda f: write(
                f / "1_Pooling" / "config.json",
                {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True},
            ),
            "{f}/1_Pooling/config.json: exactly one of pooling_mode_mean_tokens, "
            "pooling_mode_cls_token, pooling_mode_lasttoken must be true (found: "
            "pooling_mode_mean_tokens, pooling_mode_max_tokens)",
        ),
        (
            lambda f: (f / "1_Pooling" / "config.json").write_text("{"),
            "{f}/1_Pooling/config.json: not valid JSON",
        ),
        (
            lambda f: write(
                f / "config_sentence_transformers.json",
                {"prompts": {"query": "q: "}, "default_prompt_name": "doc"},
            ),
            "{f}/config_sentence_transformers.json: default_prompt_name 'doc' is not one of "
            "its prompts",
        ),
    ],
)
def test_a_bad_folder_is_one_line_naming_the_file(folder, breakage, message):
    breakage(folder)
    with pytest.raises(ModelFolderError) as info:
        read_model_spec(folder)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(message.format(f=folder))


def test_a_plain_folder_takes_the_pooling_given(folder):
    (folder / "modules.json").unlink()
    spec = read_model_spec(folder, pooling="lasttoken")
    assert spec.pooling is Pooling.LASTTOKEN and spec.normalize is True
    with pytest.raises(ValueError, match="pooling='max' is not one of mean, cls, lasttoken"):
        read_model_spec(folder, pooling="max")
