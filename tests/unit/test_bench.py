"""The benchmark's pure parts: best-of, headline summary, regression guard, repository
variants, the command line, and that its programs run as modules (``python -m perf...``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from google.protobuf import text_format
from triton_embed_server.launcher import REPO_ROOT, TritonServer
from tritonclient.grpc import model_config_pb2

from perf import bench, config_ablations, corpora, report
from perf.contenders import triton_pa


def row(contender, tokens_s, length=50, batch=1, conc=4, errors=0):
    return {
        "contender": contender,
        "length": length,
        "batch": batch,
        "concurrency": conc,
        "tokens_s": tokens_s,
        "texts_s": tokens_s / length,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "errors": errors,
    }


ROWS = [
    row("engine", 10_000, batch=0, conc=0),
    row("triton_pa", 8_000, conc=4),
    row("triton_pa", 9_200, conc=16),
    row("triton_pa", 9_900, conc=32, errors=1),  # runs with errors never count
    row("triton_client", 7_000),
    row("vllm_float", 4_000),
    row("vllm_base64", 4_600),
]


def test_best_ignores_runs_with_errors_and_filters_batch():
    assert report.best(ROWS, "triton_pa", 50, 1) == 9_200
    assert report.best(ROWS, "triton_pa", 50, 16) == 0.0
    assert report.best(ROWS, "engine", 50) == 10_000


def test_summary_reports_headline_ratios(tmp_path):
    text = report.summarize(ROWS, tmp_path)
    assert "| triton_pa | 9,200 |" in text
    assert "ensemble / engine = 0.92 (target 0.9)" in text
    assert "ensemble / vLLM server = 2.00 (target 1.8)" in text
    assert (tmp_path / "summary.md").read_text() == text
    assert (tmp_path / "throughput_len50_batch1.png").stat().st_size > 1000


def test_regression_guard_flags_drops_over_ten_percent(tmp_path):
    ref = tmp_path / "ref.json"
    ref.write_text(
        json.dumps({"rows": [row("triton_pa", 10_000, conc=16), row("vllm_float", 4_000)]})
    )
    drops = report.compare([row("triton_pa", 8_900, conc=16), row("vllm_float", 3_700)], ref)
    assert len(drops) == 1 and "-11%" in drops[0] and "triton_pa" in drops[0]
    assert report.compare([row("triton_pa", 9_100, conc=16)], ref) == []


def test_labels_and_mixed_length_key():
    assert corpora.label(50) == "50" and corpora.label(corpora.MIXED) == "mixed"


def parse(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_repository_variant_changes_only_the_asked_knobs(tmp_path):
    repo = config_ablations.repository_variant(
        str(tmp_path), embedder_count=4, tokenizer_count=2, embedder_delay_us=0
    )
    shipped = REPO_ROOT / "model_repository"
    embedder, tokenizer = (parse(repo / m / "config.pbtxt") for m in ("embedder", "tokenizer"))
    assert [g.count for g in embedder.instance_group] == [4]
    assert [g.count for g in tokenizer.instance_group] == [2]
    assert embedder.dynamic_batching.max_queue_delay_microseconds == 0
    # the tokenizer's delay and every other file are as shipped
    assert (
        tokenizer.dynamic_batching == parse(shipped / "tokenizer" / "config.pbtxt").dynamic_batching
    )
    for rel in ("embed/config.pbtxt", "embedder/configs/gpu.pbtxt", "embedder/1/model.py"):
        assert (repo / rel).read_text() == (shipped / rel).read_text()


def test_repository_variant_of_the_one_step_ablation_model(tmp_path):
    repo = config_ablations.repository_variant(
        str(tmp_path / "a"), ablation_model="embed_text", output_format="bytes"
    )
    assert [p.name for p in repo.iterdir()] == ["embed_text"]
    cfg = parse(repo / "embed_text" / "config.pbtxt")
    assert cfg.parameters["output_format"].string_value == "bytes"
    assert [g.count for g in cfg.instance_group] == [1]
    repo = config_ablations.repository_variant(
        str(tmp_path / "b"), ablation_model="embed_text", output_format="json", embedder_count=2
    )
    cfg = parse(repo / "embed_text" / "config.pbtxt")
    assert cfg.parameters["output_format"].string_value == "json"
    assert [g.count for g in cfg.instance_group] == [2]


def test_save_writes_json_and_csv(tmp_path):
    report.save(ROWS, tmp_path, "results", mode="full")
    assert json.loads((tmp_path / "results.json").read_text())["mode"] == "full"
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert len(lines) == 1 + len(ROWS) and "tokens_s" in lines[0]


def test_incremental_chart_is_drawn(tmp_path):
    rows = [
        row(step, t, batch=b, conc=c)
        for step, t in (("a", 3000), ("b", 5000))
        for b, c in config_ablations.ABLATION_LOAD
    ]
    report.plot_incremental(rows, tmp_path)
    assert (tmp_path / "incremental.png").stat().st_size > 1000


def test_every_ablation_variant_builds_a_repository(tmp_path):
    variants = [v for vs in config_ablations.ABLATIONS.values() for v in vs]
    for k, (_, model, knobs) in enumerate(variants):
        repo = config_ablations.repository_variant(str(tmp_path / str(k)), **knobs)
        assert parse(repo / model / "config.pbtxt").name == model


def test_served_counts_sums_the_tokenizer_steps_counters(tmp_path):
    # the exposition text a scrape returns (two tokenizer instances, an embedder to ignore)
    scrape = tmp_path / "metrics.txt"
    scrape.write_text(
        "# HELP triton_embed_texts_total Texts.\n# TYPE triton_embed_texts_total counter\n"
        'triton_embed_texts_total{model="tokenizer",model_instance="tokenizer_0"} 600\n'
        'triton_embed_texts_total{model="tokenizer",model_instance="tokenizer_1"} 400\n'
        'triton_embed_texts_total{model="embedder",model_instance="embedder_0_0"} 1000\n'
        "# HELP triton_embed_tokens_total Tokens.\n# TYPE triton_embed_tokens_total counter\n"
        'triton_embed_tokens_total{model="tokenizer",model_instance="tokenizer_0"} 36000\n'
        'triton_embed_tokens_total{model="tokenizer",model_instance="tokenizer_1"} 25000\n'
        'triton_embed_tokens_total{model="embedder",model_instance="embedder_0_0"} 61000\n'
    )

    class Server:  # the launcher's scrape, pointed at the file
        metrics_url = scrape.as_uri()
        metric_samples = TritonServer.metric_samples

    assert triton_pa.served_counts(Server()) == (1000.0, 61000.0)


def test_lengths_flag_parses_mixed():
    assert corpora.parse_lengths("50,mixed") == [50, corpora.MIXED]
    assert corpora.parse_lengths("256") == [256]


def test_command_line_flags():
    args = bench.build_parser().parse_args(
        ["--mode", "full", "--lengths", "256,mixed", "--compare", "ref.json", "--out", "o"]
    )
    assert (args.mode, args.lengths, str(args.compare), str(args.out)) == (
        "full",
        [256, corpora.MIXED],
        "ref.json",
        "o",
    )
    args = bench.build_parser().parse_args([])
    assert (args.mode, args.out, args.ablation) == ("quick", REPO_ROOT / "perf" / "results", None)
    for name in ("instances", "incremental", "batching"):
        assert bench.build_parser().parse_args(["--ablation", name]).ablation == name
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--ablation", "nope"])


@pytest.mark.parametrize(
    "module", ["perf.bench", "perf.contenders.engine", "perf.stub_profile", "perf.gpu_sweep"]
)
def test_programs_run_as_modules_from_the_repository_root(module):
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:")
