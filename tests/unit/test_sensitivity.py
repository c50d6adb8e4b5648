"""``--keep-float auto``'s parts: the layers as vLLM fuses them, the int8 simulation against an
integer reference and the written checkpoint, the ranking, and the search for the fewest
layers kept float (with the costly vLLM gate replaced by a deterministic stand-in).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel
from triton_embed_server.models import accuracy
from triton_embed_server.models import quantize as q
from triton_embed_server.models import sensitivity as sens
from triton_embed_server.models.model_spec import read_model_spec

from tests.model_factory import fortune_texts, make_cls_encoder, make_mean_encoder

LAYER = "encoder.layer.{}.{}"


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return make_cls_encoder(tmp_path_factory.mktemp("src") / "bge", seed=3)


@pytest.fixture(scope="module")
def model(encoder):
    return AutoModel.from_pretrained(encoder, dtype=torch.float32).eval()


def test_units_are_vllms_linear_layers_in_model_order(model):
    units = sens.linear_units(model, q.IGNORE)
    expected = []
    for i in range(2):
        expected += [
            tuple(LAYER.format(i, f"attention.self.{p}") for p in ("query", "key", "value")),
            (LAYER.format(i, "attention.output.dense"),),
            (LAYER.format(i, "intermediate.dense"),),
            (LAYER.format(i, "output.dense"),),
        ]
    assert units == expected  # the pooler is ignored; q, k and v are one unit (qkv_proj)
    kept = sens.linear_units(model, (*q.IGNORE, q.KEEP_FLOAT_PRESETS["ffn-down"]))
    assert kept == [
        u for u in expected if not u[0].endswith(".output.dense") or "attention" in u[0]
    ]
    assert sens.describe_unit(expected[0]) == "encoder.layer.0.attention.self.{query,key,value}"


def test_keep_patterns_match_their_unit_under_any_prefix_and_nothing_else():
    unit = tuple(LAYER.format(1, f"attention.self.{p}") for p in ("query", "key", "value"))
    regex = sens.keep_pattern(unit).removeprefix("re:")
    for name in unit:
        assert re.match(regex, name) and re.match(regex, f"model.{name}")  # HF and vLLM names
    for other in (
        "encoder.layer.11.attention.self.query",
        "encoder.layer.1.attention.self.queryx",
        "encoder.layer.1.attention.output.dense",
        "xencoder.layer.1.attention.self.key",
    ):
        assert not re.match(regex, other), other


def test_a_kept_unit_is_written_float_by_quantize(encoder, model, tmp_path):
    unit = sens.linear_units(model, q.IGNORE)[4]  # layer 1's q, k, v
    q.quantize(encoder, tmp_path / "int8", (sens.keep_pattern(unit),))
    after = load_file(tmp_path / "int8/model.safetensors")
    for name in unit:
        assert after[f"{name}.weight"].dtype == torch.float32
        assert f"{name}.weight_scale" not in after
    assert after[LAYER.format(0, "attention.self.query.weight")].dtype == torch.int8


def integer_reference(x: torch.Tensor, linear: torch.nn.Linear) -> np.ndarray:
    """W8A8 with integer arithmetic (int64 numpy): per-channel weights, per-token activations."""
    w = linear.weight.detach().double().numpy()
    sw = np.abs(w).max(axis=1, keepdims=True) / 127.0
    wq = np.clip(np.rint(w / sw), -127, 127).astype(np.int64)
    xd = x.double().numpy()
    sx = np.abs(xd).max(axis=1, keepdims=True) / 127.0
    xq = np.clip(np.rint(xd / sx), -127, 127).astype(np.int64)
    return (xq @ wq.T) * sx * sw.T + linear.bias.detach().double().numpy()


def test_the_simulated_layer_equals_integer_arithmetic(model):
    linear = dict(model.named_modules())[LAYER.format(1, "intermediate.dense")]
    x = torch.randn(7, linear.in_features, generator=torch.Generator().manual_seed(1)) * 3
    got = sens.W8A8Linear(linear)(x)
    want = integer_reference(x, linear)
    assert got.dtype == torch.float32
    # float32 scaling of an exact integer sum: a few float32 ulps of the output's magnitude
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert np.abs(got.numpy() - linear(x).detach().numpy()).max() > 1e-4  # int8 moves it
    assert sens.W8A8Linear(linear)(x.bfloat16()).dtype == torch.bfloat16


def test_the_simulated_weights_are_the_checkpoints(encoder, model, tmp_path):
    q.quantize(encoder, tmp_path / "int8")
    after = load_file(tmp_path / "int8/model.safetensors")
    for unit in sens.linear_units(model, q.IGNORE):
        for name in unit:
            layer = sens.W8A8Linear(dict(model.named_modules())[name])
            assert torch.equal(layer.weight_int, after[f"{name}.weight"].float())
            assert torch.equal(layer.weight_scale, after[f"{name}.weight_scale"])


def test_simulated_int8_swaps_only_inside_and_restores(model):
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    before = model(input_ids=ids).last_hidden_state
    names = [LAYER.format(0, "output.dense")]
    with sens.simulated_int8(model, names):
        inside = model(input_ids=ids).last_hidden_state
    after = model(input_ids=ids).last_hidden_state
    assert torch.equal(before, after)
    assert not torch.allclose(before, inside, atol=1e-5)
    assert "forward" not in vars(dict(model.named_modules())[names[0]])


def test_the_simulators_float32_vectors_are_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = make_mean_encoder(tmp_path / "mean", normalize=False, seed=2)
    texts = fortune_texts(45)  # two batches of unequal lengths: padding is masked
    sim = sens.Simulator(folder, "mean", "float32", 128, texts=texts)
    st = SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(sim.reference, st, rtol=1e-4, atol=1e-5)
    assert sim.report([]).cosine_min > 0.99999  # nothing int8: the reference itself


def test_a_layer_with_outlier_weights_ranks_most_sensitive(encoder, tmp_path):
    model = AutoModel.from_pretrained(encoder, dtype=torch.float32).eval()
    target = LAYER.format(1, "attention.output.dense")
    with torch.no_grad():  # one input channel 200x the rest: each row's other weights round to 0
        dict(model.named_modules())[target].weight[:, 5] *= 200.0
    model.save_pretrained(tmp_path / "outlier")
    for f in encoder.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "config.json"):
            (tmp_path / "outlier" / f.name).write_bytes(f.read_bytes())
    sim = sens.Simulator(tmp_path / "outlier", "cls", "float32", 128, texts=fortune_texts(40))
    ranked = sens.rank_units(sim, sens.linear_units(sim.model, q.IGNORE))
    assert ranked[0].unit == (target,)
    assert ranked[0].report.recall_at_10 < min(r.report.recall_at_10 for r in ranked[1:])
    keys = [sens.sensitivity_key(r) for r in ranked]
    assert keys == sorted(keys)


def report(recall: float, cosine: float = 0.999) -> accuracy.AccuracyReport:
    gate = accuracy.GATES["int8"]
    return accuracy.AccuracyReport("int8", 300, cosine, cosine, cosine, recall, gate)


class FakeSimulator:
    """Recall 0.90 with every unit int8; each of the ``bad`` units kept float adds 0.02."""

    def __init__(self, bad: list[str]):
        self.bad, self.calls = bad, []

    def report(self, int8_names):
        self.calls.append(list(int8_names))
        return report(1.0 - 0.02 * sum(n in int8_names for n in self.bad))


def ranking(names: list[str]) -> list[sens.Sensitivity]:
    return [sens.Sensitivity((n,), report(0.99)) for n in names]


@pytest.mark.parametrize("bad, expected", [(["a", "b", "c", "d", "e"], 3), (["a"], 0)])
def test_simulated_keep_bisects_to_the_fewest_that_pass(bad, expected):
    sim = FakeSimulator(bad)
    names = ["a", "b", "c", "d", "e", "f", "g", "h"]
    k, got = sens.simulated_keep(sim, ranking(names))
    assert k == expected  # 5 bad: 0.90; 3 kept float: 2 int8, 0.96 >= 0.95; 2 kept: 0.94
    assert got.recall_at_10 == pytest.approx(1.0 - 0.02 * len(set(bad) - set(names[:k])))
    assert len(sim.calls) <= 4  # log2(9) bisection steps, not 9 forward passes


@pytest.mark.parametrize("threshold", range(0, 8))
def test_bisect_finds_the_threshold_of_a_monotone_check(threshold):
    seen = []
    k = sens.bisect_smallest(lambda k: seen.append(k) or k >= threshold, 0, 7)
    assert k == threshold and len(seen) <= 3
    assert sens.bisect_smallest(lambda k: False, 0, 7) == 7


@pytest.mark.parametrize(
    "start, threshold, tries, expected, calls",
    [
        (3, 3, 4, 3, 2),  # passes at 3, fails at 2: the prediction was right
        (3, 1, 4, 1, 4),  # passes at 3, 2, 1; fails at 0
        (3, 0, 9, 0, 4),  # down to 0
        (3, 5, 4, 5, 3),  # fails at 3, 4; passes at 5
        (3, 9, 3, None, 3),  # out of tries
        (6, 9, 9, None, 2),  # fails at 6 and at high (7): nothing passes
    ],
)
def test_walk_steps_from_the_prediction_to_the_smallest_pass(
    start, threshold, tries, expected, calls
):
    seen = []
    got = sens.walk_smallest(lambda k: seen.append(k) or k >= threshold, start, 7, tries)
    assert got == (expected, calls) and len(seen) == calls


def test_quantize_to_gate_writes_the_smallest_copy_vllm_passes(encoder, tmp_path, monkeypatch):
    """The search end to end on a real checkpoint, with the two costly checks stood in for: the
    simulator says keep 1 unit float, the "vLLM" gate passes copies that keep layer 1's FFN
    down projection float, so the walk goes 1 (fails) -> 2 (passes) and writes that copy."""
    order = [LAYER.format(0, "intermediate.dense"), LAYER.format(1, "output.dense")]

    class Sim:
        def __init__(self, folder, pooling, dtype, max_length):
            assert (pooling, dtype, max_length) == ("cls", "bfloat16", 128)
            self.model = AutoModel.from_pretrained(folder).eval()
            self.reference = np.zeros((300, 4))

        def report(self, int8_names):
            return report(0.96 if order[0] not in int8_names else 0.9)

    def fake_rank(sim, units):
        first = [u for u in units if u[0] in order]
        return [
            sens.Sensitivity(u, report(0.9)) for u in first + [u for u in units if u not in first]
        ]

    def fake_measure(folder, spec, precision, max_length, candidate, candidate_dtype, reference):
        assert (precision, candidate_dtype, reference) == ("int8", "bfloat16", "ref")
        ignore = json.loads((candidate / "config.json").read_text())["quantization_config"][
            "ignore"
        ]
        kept = order[1] in ignore  # compressed-tensors writes the names its patterns matched
        return report(0.96 if kept else 0.94)

    monkeypatch.setattr(sens, "Simulator", Sim)
    monkeypatch.setattr(sens, "rank_units", fake_rank)
    monkeypatch.setattr(accuracy, "reference_vectors", lambda *a: "ref")
    monkeypatch.setattr(accuracy, "measure", fake_measure)
    spec = read_model_spec(encoder)
    said = []
    result, got = q.quantize_to_gate(encoder, tmp_path / "out", spec, "bfloat16", say=said.append)
    assert got.passed and result.folder == tmp_path / "out"
    assert result.kept_names == (
        LAYER.format(0, "intermediate.dense"),
        LAYER.format(1, "output.dense"),
    )
    assert result.linear_layers == 2 * 6 - 2
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the other tries are removed
    assert "simulated: keeping the 1 most sensitive float" in "\n".join(said)
    assert [line.split(":")[0] for line in said if line.startswith("vLLM")] == [
        "vLLM, 1 kept float, engine at bfloat16",
        "vLLM, 2 kept float, engine at bfloat16",
    ]


def test_vllm_finds_a_kept_qkv_unit_in_the_ignore_list(encoder, model, tmp_path):
    """vLLM 0.32's BERT looks its q/k/v layer up as ``...attention.output.qkv_proj``; the copy
    lists that name too, and vLLM's own matching (its mappers, then should_ignore_layer)
    leaves exactly the kept units unquantized."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import (
        should_ignore_layer,
    )
    from vllm.model_executor.models.bert import BertEmbeddingModel, BertModel

    units = sens.linear_units(model, q.IGNORE)
    kept = [units[4], units[7]]  # layer 1's q/k/v and its FFN down projection
    q.quantize(encoder, tmp_path / "int8", tuple(map(sens.keep_pattern, kept)))
    config = json.loads((tmp_path / "int8/config.json").read_text())["quantization_config"]
    assert "encoder.layer.1.attention.output.query" in config["ignore"]
    vllm_config = CompressedTensorsConfig.from_config(config)
    for mapper in (BertEmbeddingModel.hf_to_vllm_mapper, BertModel.hf_to_vllm_mapper):
        vllm_config.apply_vllm_mapper(mapper.get_rename_mapper())
    fused = dict(BertEmbeddingModel.packed_modules_mapping)
    ignored = {
        f"{i}.{layer}"
        for i in range(2)
        for layer in ("output.qkv_proj", "output.dense", "intermediate", "ffn_down")
        if should_ignore_layer(
            f"model.encoder.layer.{i}."
            + {
                "output.qkv_proj": "attention.output.qkv_proj",  # vLLM's name for q/k/v
                "output.dense": "attention.output.dense",
                "intermediate": "intermediate.dense",
                "ffn_down": "output.dense",
            }[layer],
            ignore=vllm_config.ignore,
            fused_mapping=fused,
        )
    }
    assert ignored == {"1.output.qkv_proj", "1.ffn_down"}
