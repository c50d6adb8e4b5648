"""``triton-embed quantize``: the int8 W8A8 compressed-tensors copy, checked file by file.

No engine here (tests/integration/test_quantize.py serves a copy on vLLM): the copy's
``config.json`` says what vLLM reads, every rounded weight is int8 with one float32 scale per
output channel that gives back the float weight within half a step, and what is kept in float
is kept bit for bit.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from triton_embed_server.models import accuracy
from triton_embed_server.models import quantize as q
from triton_embed_server.models import repository as gen
from triton_embed_server.models.model_spec import quantization_of
from triton_embed_server.models.repository import ModelOptions, RepositoryError

from tests.model_factory import make_cls_encoder


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return make_cls_encoder(tmp_path_factory.mktemp("src") / "bge", seed=3)


def test_every_linear_weight_is_int8_per_channel_within_half_a_step(encoder, tmp_path):
    out = tmp_path / "int8"
    result = q.quantize(encoder, out)
    before = load_file(encoder / "model.safetensors")
    after = load_file(out / "model.safetensors")
    linear = [k[: -len(".weight")] for k, v in before.items() if k.endswith(".weight")
              and v.ndim == 2 and "embeddings" not in k and "pooler" not in k]  # fmt: skip
    assert result.linear_layers == len(linear) == 2 * 6  # 2 layers x (q, k, v, o, up, down)
    for name in linear:
        w, scale = after[f"{name}.weight"], after[f"{name}.weight_scale"]
        original = before[f"{name}.weight"]
        assert w.dtype == torch.int8 and scale.dtype == torch.float32
        assert scale.shape == (original.shape[0], 1)
        assert torch.equal(scale[:, 0], original.abs().amax(dim=1) / 127.0)
        assert w.abs().max() == 127  # each row's largest value maps to 127
        assert (w.float() * scale - original).abs().max() <= scale.max() / 2 + 1e-7
    for key in before.keys() - {f"{n}.weight" for n in linear}:
        assert torch.equal(after[key], before[key]), key  # biases, LayerNorms, embeddings
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (config["quant_method"], config["format"]) == ("compressed-tensors", "int-quantized")
    group = config["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"]
    assert {k: group["weights"][k] for k in ("num_bits", "type", "symmetric", "strategy")} == {
        "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}  # fmt: skip
    acts = group["input_activations"]
    assert (acts["num_bits"], acts["strategy"], acts["dynamic"]) == (8, "token", True)
    assert quantization_of(out) == "int8" and quantization_of(encoder) == "none"
    kept = {p.name for p in encoder.rglob("*") if p.is_file()} - {"model.safetensors"}
    assert kept <= {p.name for p in out.rglob("*") if p.is_file()}  # tokenizer, pooling, modules


def test_keep_float_ffn_down_leaves_those_layers_as_they_were(encoder, tmp_path):
    result = q.quantize(encoder, tmp_path / "int8", keep_float=("ffn-down",))
    assert result.linear_layers == 2 * 5
    before, after = (
        load_file(encoder / "model.safetensors"),
        load_file(tmp_path / "int8/model.safetensors"),
    )
    for i in range(2):
        key = f"encoder.layer.{i}.output.dense.weight"
        assert torch.equal(after[key], before[key])
        assert f"encoder.layer.{i}.output.dense.weight_scale" not in after
        assert after[f"encoder.layer.{i}.intermediate.dense.weight"].dtype == torch.int8
    assert "kept in float: re:" in q.describe(result)


def test_an_existing_folder_is_refused_and_left_alone(encoder, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("x")
    with pytest.raises(FileExistsError, match="exists: pass a new folder"):
        q.quantize(encoder, tmp_path / "taken")
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["mine.txt"]


# ---- the gate record: quantize gates a copy at its serving dtype, repository add reads it ----


def gated(dtype: str, recall: float) -> accuracy.AccuracyReport:
    return accuracy.AccuracyReport("int8", 300, 0.99, 0.995, 0.998, recall, accuracy.GATES["int8"])


def test_the_gate_record_round_trips(tmp_path):
    assert accuracy.read_gate_record(tmp_path) is None
    accuracy.write_gate_record(tmp_path, "bfloat16", gated("bfloat16", 0.96))
    record = accuracy.read_gate_record(tmp_path)
    assert record["dtype"] == "bfloat16"
    assert (record["gate"]["recall_at_10"], record["gate"]["passed"]) == (0.96, True)
    accuracy.write_gate_record(tmp_path, "float32", None)
    assert accuracy.read_gate_record(tmp_path) == {"dtype": "float32", "gate": None}
    (tmp_path / accuracy.GATE_RECORD).write_text('{"dtype": "float16"}')
    with pytest.raises(ValueError, match="no dtype of float32, bfloat16"):
        accuracy.read_gate_record(tmp_path)


@pytest.fixture(scope="module")
def int8_copy(encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "int8"
    q.quantize(encoder, out)
    return out


def embedder_dtype(repository, name):
    from triton_embed_server.models.instance_group import read_config_pbtxt
    from triton_embed_server.steps.config import model_parameters

    config = read_config_pbtxt(repository / f"{name}_embedder" / "config.pbtxt")
    return model_parameters(config)["dtype"]


def test_add_serves_an_int8_copy_at_the_dtype_it_was_gated_at(int8_copy, tmp_path):
    accuracy.write_gate_record(int8_copy, "bfloat16", gated("bfloat16", 0.96))
    said = []
    check = accuracy.gate_for_add(False, said.append)
    gen.add_model(tmp_path, ModelOptions(name="i8", model=str(int8_copy)), accuracy=check)
    assert embedder_dtype(tmp_path, "i8") == "bfloat16"
    assert said == [
        "int8 copy gated by triton-embed quantize with the engine at bfloat16: cosine p1 "
        "0.99500, recall@10 0.960: passed"
    ]
    with pytest.raises(
        RepositoryError,
        match=r"passed the gate with the engine at bfloat16, "
        r"not at --dtype float32; quantize again with --dtype float32",
    ):
        gen.add_model(
            tmp_path, ModelOptions(name="f", model=str(int8_copy), dtype="float32"), accuracy=check
        )
    assert not (tmp_path / "f").exists()
    accepted = accuracy.gate_for_add(True, said.append)
    gen.add_model(
        tmp_path, ModelOptions(name="f", model=str(int8_copy), dtype="float32"), accuracy=accepted
    )
    assert embedder_dtype(tmp_path, "f") == "float32"


def test_add_refuses_an_int8_copy_that_failed_its_gate(int8_copy, tmp_path):
    accuracy.write_gate_record(int8_copy, "float32", gated("float32", 0.93))
    check = accuracy.gate_for_add(False, print)
    with pytest.raises(RepositoryError, match="failed the accuracy gate"):
        gen.add_model(tmp_path, ModelOptions(name="i8", model=str(int8_copy)), accuracy=check)


def test_an_int8_copy_without_a_record_is_added_with_a_note(int8_copy, tmp_path):
    (int8_copy / accuracy.GATE_RECORD).unlink(missing_ok=True)
    said = []
    check = accuracy.gate_for_add(False, said.append)
    gen.add_model(tmp_path, ModelOptions(name="i8", model=str(int8_copy)), accuracy=check)
    assert embedder_dtype(tmp_path, "i8") == "float32"
    assert said and said[0].endswith(
        "its accuracy was not measured; triton-embed quantize gates the copies it writes"
    )


def test_auto_refuses_no_gate(encoder, tmp_path, capsys):
    from triton_embed.cli import main

    code = main(
        ["quantize", str(encoder), str(tmp_path / "o"), "--keep-float", "auto", "--no-gate"]
    )
    assert code == 2 and "--keep-float auto runs the gate" in capsys.readouterr().out
    assert not (tmp_path / "o").exists()
