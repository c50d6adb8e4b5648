"""The benchmark's pure parts: best-of, headline summary, regression guard, repository
variants, the command line, the OpenAI load generator's requests (against a local test
double), and that its programs run as modules (``python -m perf...``)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf import text_format
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer
from tritonclient.grpc import model_config_pb2

from perf import bench, config_ablations, corpora, report
from perf.contenders import gateway, openai_load, triton_pa, vllm_server
from tests.unit.perf_fakes import LocalHttpServer


def row(contender, tokens_s, length=50, batch=1, conc=4, errors=0, **extra):
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
        **extra,
    }


ROWS = [
    row("engine", 10_000, batch=0, conc=0),
    row("triton_pa", 8_000, conc=4),
    row("triton_pa", 9_200, conc=16),
    row("triton_pa", 9_900, conc=32, errors=1),  # runs with errors never count
    row("triton_client", 7_000),
    row("vllm_float", 4_000),
    row("vllm_base64", 4_600),
    row("gateway_base64", 7_820, batch=16),
    row("gateway_float", 7_000, batch=16),
    row("triton_client", 8_500, batch=16),
    row("vllm_float", 4_000, batch=16),
    row("vllm_base64", 4_250, batch=16),
    row("gateway_base64", 8_280, conc=1, p50_ms=28.5),
    row("vllm_base64", 1_600, conc=1),
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


def test_summary_reports_the_gateways_ratios_and_latency(tmp_path):
    text = report.summarize(ROWS, tmp_path)
    assert (
        "- len 50, 1 text(s)/request: gateway_base64 / vLLM server = 1.80 (target 1.60); "
        "gateway_base64 / triton_client = 1.18\n" in text
    )
    assert (
        "- len 50, 16 text(s)/request: gateway_base64 / vLLM server = 1.84 (target 1.60); "
        "gateway_base64 / triton_client = 0.92 (target 0.90)" in text
    )
    assert "gateway_base64 28.5 / 2.0 ms, vllm_base64 1.0 / 2.0 ms" in text
    assert "| gateway_base64 | 8,280 | 7,820 |" in text
    assert (tmp_path / "throughput_len50_batch16.png").stat().st_size > 1000


def rounds_rows():
    """Three rounds: the gateway at 2 concurrencies, vLLM's two encodings, gRPC."""
    rows = []
    for k, drift in ((1, 1.0), (2, 0.8), (3, 1.1)):  # the machine drifts between rounds
        for b in (1, 16):
            rows += [
                row("gateway_base64", 7_000 * drift, batch=b, conc=1, round=k),
                row("gateway_base64", 8_000 * drift, batch=b, conc=32, round=k),
                row("vllm_float", 4_000 * drift, batch=b, conc=32, round=k),
                row("vllm_base64", (4_000 + 1_000 * (k == 2)) * drift, batch=b, conc=32, round=k),
                row("triton_client", 8_500 * drift, batch=b, conc=32, round=k),
            ]
    rows.append(row("triton_client", 99_999, batch=16, conc=32, round=3, errors=1))
    return rows


def test_round_bests_take_the_better_encoding_per_round():
    rows = rounds_rows()
    assert report.round_bests(rows, ("gateway_base64",), 50, 1) == {
        1: 8_000,
        2: 6_400,
        3: pytest.approx(8_800),
    }
    vllm = report.round_bests(rows, report.VLLM, 50, 16)
    assert vllm == {1: 4_000, 2: 4_000, 3: pytest.approx(4_400)}  # round 2: base64 5,000 x 0.8


def test_rounds_summary_gives_best_median_and_paired_ratios(tmp_path):
    text = report.summarize_rounds(rounds_rows(), tmp_path)
    assert "| gateway_base64 | 8,800 | 8,000 | 8,000 / 6,400 / 8,800 |" in text
    assert "| vLLM server (better encoding per round) | 4,400 | 4,000 |" in text
    assert (
        "- len 50, 1 text(s)/request, gateway_base64 / vLLM server: best / best 2.00, "
        "median / median 2.00, per round 2.00 / 1.60 / 2.00 (target 1.60: met)" in text
    )
    # the failed run (99,999) never counts
    assert (
        "- len 50, 16 text(s)/request, gateway_base64 / triton_client: best / best 0.94, "
        "median / median 0.94, per round 0.94 / 0.94 / 0.94 (target 0.90: met)" in text
    )
    assert "| gateway_base64 | 50 | 1.0 | 2.0 | 2.0-2.0 |" in text
    assert (tmp_path / "summary.md").read_text() == text
    for png in (
        "gateway_rounds.png",
        "throughput_len50_batch1.png",
        "throughput_len50_batch16.png",
    ):
        assert (tmp_path / png).stat().st_size > 1000


def test_median_rows_are_one_row_per_point():
    rows = report.median_rows(rounds_rows())
    gateway = [r for r in rows if r["contender"] == "gateway_base64" and r["concurrency"] == 32]
    assert [(r["batch"], r["tokens_s"]) for r in gateway] == [(1, 8_000), (16, 8_000)]
    assert len(rows) == 10


def test_vllm_request_is_unchanged_and_the_gateway_accepts_its_own():
    assert openai_load.request_body(
        ["a", "b"], "base64", vllm_server.SERVED_MODEL, vllm_server.TRUNCATION
    ) == {
        "model": "bench",
        "input": ["a", "b"],
        "encoding_format": "base64",
        "truncate_prompt_tokens": 256,
    }
    from triton_embed_server.gateway.openai_api import parse_embeddings_request

    body = openai_load.request_body(["a", "b"], "float", gateway.ENSEMBLE, gateway.TRUNCATION)
    parsed = parse_embeddings_request(body)
    assert (parsed.model, parsed.encoding_format) == ("embed", "float")
    assert parsed.options.to_parameters() == {"truncation": "END"}


class FakeEmbeddings(LocalHttpServer):
    """A ``/v1/embeddings`` test double on a free loopback port (aiohttp, its own thread).

    Answers each text with the vector ``[len(text), 0.5]`` in the asked encoding; a request
    whose first text is ``"bad"`` gets 400 in OpenAI's error envelope.
    """

    def __init__(self):
        super().__init__({"/v1/embeddings": self.handle})

    async def handle(self, request):
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        if body["input"][0] == "bad":
            return web.json_response({"error": {"message": "bad input"}}, status=400)
        data = []
        for i, text in enumerate(body["input"]):
            vec = np.array([len(text), 0.5], "<f4")
            emb = (
                base64.b64encode(vec.tobytes()).decode()
                if body["encoding_format"] == "base64"
                else vec.tolist()
            )
            data.append({"object": "embedding", "index": i, "embedding": emb})
        return web.json_response({"object": "list", "data": data})


@pytest.fixture
def fake_server():
    server = FakeEmbeddings()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_load_generator_sends_the_servers_fields_and_counts_tokens(fake_server, fmt):
    url = f"http://127.0.0.1:{fake_server.port}/v1/embeddings"
    result = gateway.gateway_load(url, ["aa", "bbbb"], 2, 2, 0.3, fmt, text_tokens=[3, 5])
    assert result["errors"] == 0 and result["texts_s"] > 0 and result["p99_ms"] > 0
    assert result["tokens_per_text"] == 4.0  # every request sends both texts
    assert {json.dumps(b, sort_keys=True) for b in fake_server.bodies} <= {
        json.dumps(b, sort_keys=True)
        for b in (
            {"model": "embed", "input": i, "encoding_format": fmt, "truncate": "END"}
            for i in (["aa", "bbbb"], ["bbbb", "aa"])
        )
    }
    assert openai_load.decode({"data": [{"embedding": [1.0, 2.0]}]}, "float")[0].dtype == "float32"


def test_load_generator_counts_refusals_with_the_first_message(fake_server):
    url = f"http://127.0.0.1:{fake_server.port}/v1/embeddings"
    result = vllm_server.vllm_load(url, ["bad"], 1, 1, 0.2, "base64")
    assert result["errors"] > 0 and result["texts_s"] == 0 and result["p99_ms"] is None
    assert result["detail"].startswith("HTTP 400: {'error': {'message': 'bad input'}}")
    assert fake_server.bodies[0]["truncate_prompt_tokens"] == 256


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
    assert bench.build_parser().parse_args(["--mode", "gateway"]).mode == "gateway"
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--ablation", "nope"])


@pytest.mark.parametrize(
    "module",
    [
        "perf.bench",
        "perf.contenders.engine",
        "perf.stub_profile",
        "perf.gpu_sweep",
        "perf.gateway_profile",
        "perf.engine_options",
        "perf.contenders.sentence_transformers",
        "perf.rerank",
        "perf.cross_encoder",
        "perf.contenders.rerank_engine",
    ],
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


def test_idle_cpu_measures_the_machine_and_each_process_tree():
    import os

    machine, cores = bench.idle_cpu({"this test": os.getpid()}, seconds=0.2)
    assert 0.0 <= machine <= 100.0
    assert set(cores) == {"this test"} and cores["this test"] >= 0.0


def test_gateway_profile_sorts_samples_by_their_innermost_known_frame(tmp_path):
    from perf import gateway_profile

    raw = tmp_path / "gateway.txt"
    site = "/x/.venv/lib/python3.11/site-packages"
    raw.write_text(
        f"run (asyncio/runners.py:1);embeddings (/r/server/triton_embed_server/gateway/"
        f"openai_api.py:9);dumps ({site}/orjson/__init__.py:3) 3\n"
        f"run (asyncio/runners.py:1);infer ({site}/tritonclient/grpc/aio/__init__.py:5) 6\n"
        "run (asyncio/runners.py:1);_run_once (asyncio/base_events.py:2) 1\n"
    )
    summary = gateway_profile.summarize_collapsed(raw)
    assert summary["samples"] == 10
    assert summary["categories"] == {
        "gRPC client (tritonclient, grpc.aio, protobuf)": 0.6,
        "JSON and base64": 0.3,
        "event loop (asyncio, uvloop)": 0.1,
    }
    assert summary["top_frames"]["infer (tritonclient/grpc/aio/__init__.py:5)"] == 0.6


def test_rounds_summary_without_concurrency_1_has_no_latency_table(tmp_path):
    rows = [r for r in rounds_rows() if r["concurrency"] != 1]
    assert "Latency at concurrency 1" not in report.summarize_rounds(rows, tmp_path)


def test_gateway_profile_reads_texts_and_batches_from_tritons_counters(tmp_path):
    from perf import gateway_profile

    scrape = tmp_path / "metrics.txt"
    scrape.write_text(
        "# HELP nv_inference_count Inferences.\n# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="embed",version="1"} 640\n'
        'nv_inference_count{model="tokenizer",version="1"} 640\n'
        'nv_inference_count{model="embedder",version="1"} 640\n'
        "# HELP nv_inference_exec_count Executions.\n# TYPE nv_inference_exec_count counter\n"
        'nv_inference_exec_count{model="embedder",version="1"} 40\n'
    )

    class Server:
        metrics_url = scrape.as_uri()
        metric_samples = TritonServer.metric_samples

    assert gateway_profile.served(Server()) == {
        "tokenizer texts": 640.0,
        "embedder texts": 640.0,
        "embedder executions": 40.0,
    }
