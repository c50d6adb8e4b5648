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
from triton_embed_server.models import quantize as q
from triton_embed_server.models.model_spec import quantization_of

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
