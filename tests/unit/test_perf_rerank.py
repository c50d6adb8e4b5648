"""The pure parts of ``python -m perf.rerank`` (issue 23's benchmark): pairs of exact token
counts, the engine's pre-tokenized pairs, the summary and its ratios, the rerank load
generator and its answers (against a local test double), the gRPC inputs, the plan."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import AutoTokenizer

from perf import corpora, rerank, rerank_report
from perf.contenders import openai_load, rerank_engine, triton_rerank
from tests.unit.perf_fakes import LocalHttpServer

# all-MiniLM-L6-v2's tokenizer: the benchmark's cross-encoder saves it unchanged
MODEL = corpora.MODEL


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(MODEL))


@pytest.fixture(scope="module", params=[64, 256])
def pairs(request):
    return corpora.exact_pairs(MODEL, request.param, documents=6, queries=3)


def test_every_pairing_has_exactly_the_asked_tokens(pairs, tokenizer):
    queries = [q for q in pairs.queries for _ in pairs.documents]
    documents = list(pairs.documents) * len(pairs.queries)
    enc = tokenizer(queries, documents)
    assert {len(ids) for ids in enc["input_ids"]} == {pairs.length}
    # the query part is [CLS] query [SEP]: the document's segment starts at QUERY_TOKENS
    assert {types.index(1) for types in enc["token_type_ids"]} == {corpora.QUERY_TOKENS}
    assert len(set(pairs.documents)) == 6 and len(set(pairs.queries)) == 3
    assert not set(pairs.queries) & {d[: len(q)] for d in pairs.documents for q in pairs.queries}


def test_requests_go_round_the_corpus(pairs):
    query, documents = pairs.request(0, 4)
    assert query == pairs.queries[0] and documents == list(pairs.documents[:4])
    query, documents = pairs.request(1, 4)  # the documents wrap round
    assert query == pairs.queries[1] and documents == [pairs.documents[i] for i in (4, 5, 0, 1)]
    assert pairs.request(3, 1)[0] == pairs.queries[0]


def test_a_pair_too_short_for_the_query_is_refused():
    with pytest.raises(ValueError, match="leaves no room"):
        corpora.exact_pairs(MODEL, corpora.QUERY_TOKENS + 1)


def test_the_engine_gets_token_ids_and_segment_starts_as_the_scorer_does(pairs, tokenizer):
    got = rerank_engine.tokenized_pairs(MODEL, pairs, count=8)
    assert [len(ids) for ids in got["token_ids"]] == [pairs.length] * 8
    assert got["segment_starts"] == [corpora.QUERY_TOKENS] * 8
    first = tokenizer(pairs.queries[0], pairs.documents[0])["input_ids"]
    assert got["token_ids"][0] == first
    json.dumps(got)  # it travels to the replicas as JSON


def test_grpc_inputs_are_bytes_pairs_of_one_query():
    query_input, document_input = triton_rerank.rerank_inputs("q é", ["a\x00", "b"])
    assert (query_input.name(), query_input.shape(), query_input.datatype()) == (
        "QUERY",
        [2, 1],
        "BYTES",
    )
    assert (document_input.name(), document_input.shape()) == ("DOCUMENT", [2, 1])
    # BYTES on the wire: a 4-byte little-endian length, then the UTF-8 payload (NUL kept)
    raw = document_input._get_content()
    assert raw == b"\x02\x00\x00\x00a\x00\x01\x00\x00\x00b"


# --- the summary's maths ---------------------------------------------------------------------


def row(contender, tokens_s, k, length=64, docs=16, conc=4, p50=None, p99=None, errors=0, **kw):
    return {
        "contender": contender,
        "length": length,
        "batch": docs,
        "concurrency": conc,
        "round": k,
        "pairs_s": tokens_s / length,
        "tokens_s": tokens_s,
        "tokens_per_pair": length,
        "tokens_counted_by": "server",
        "p50_ms": p50,
        "p99_ms": p99,
        "errors": errors,
        **kw,
    }


ROWS = [
    # ours over gRPC: best of its points per round 9,000 / 8,000 / 10,000 (median 9,000)
    row("triton_grpc", 2_000, 1, conc=1, p50=100.0, p99=150.0),
    row("triton_grpc", 9_000, 1),
    row("triton_grpc", 2_200, 2, conc=1, p50=110.0, p99=200.0),
    row("triton_grpc", 8_000, 2),
    row("triton_grpc", 1_800, 3, conc=1, p50=90.0, p99=300.0),
    row("triton_grpc", 10_000, 3),
    row("triton_grpc", 90_000, 3, conc=8, errors=2),  # a run with errors never counts
    # the engine: per length (batch 0), 10,000 / 11,000 / 9,000 (median 10,000)
    row("engine", 10_000, 1, docs=0, conc=2),
    row("engine", 11_000, 2, docs=0, conc=2),
    row("engine", 9_000, 3, docs=0, conc=2),
    # vLLM's server: 5,000 / 6,000 / 7,000 (median 6,000)
    row("vllm_server", 5_000, 1),
    row("vllm_server", 6_000, 2),
    row("vllm_server", 7_000, 3),
    # a second point, where only ours ran, and counted other tokens than it sent
    row("triton_grpc", 4_000, 1, length=256, docs=64, tokens_per_pair=250.0),
]


def test_per_round_is_the_best_point_without_errors_and_the_engine_per_length():
    assert rerank_report.per_round(ROWS, "triton_grpc", 64, 16, "tokens_s") == {
        1: 9_000,
        2: 8_000,
        3: 10_000,
    }
    assert rerank_report.per_round(ROWS, "engine", 64, 16, "tokens_s") == {
        1: 10_000,
        2: 11_000,
        3: 9_000,
    }
    assert rerank_report.per_round(ROWS, "engine", 64, 64, "pairs_s")[1] == 10_000 / 64
    assert rerank_report.per_round(ROWS, "vllm_server", 256, 64, "tokens_s") == {}


def test_ratios_are_median_over_median_with_each_round_beside():
    to_engine = rerank_report.ratio(ROWS, "triton_grpc", "engine", 64, 16)
    assert to_engine.median == pytest.approx(0.9) and to_engine.verdict(0.9) == "met"
    assert to_engine.best == pytest.approx(10_000 / 11_000)
    assert to_engine.rounds == pytest.approx((0.9, 8 / 11, 10 / 9))
    to_vllm = rerank_report.ratio(ROWS, "triton_grpc", "vllm_server", 64, 16)
    assert to_vllm.median == pytest.approx(1.5) and to_vllm.verdict(1.5) == "met"
    assert to_vllm.verdict(1.6) == "NOT met"
    assert rerank_report.ratio(ROWS, "gateway", "engine", 64, 16) is None
    assert rerank_report.ratio(ROWS, "triton_grpc", "vllm_server", 256, 64) is None


def test_latency_is_the_median_over_rounds_at_one_request_in_flight():
    assert rerank_report.latency(ROWS, "triton_grpc", 64, 16) == (100.0, 200.0, 150.0, 300.0)
    assert rerank_report.latency(ROWS, "vllm_server", 64, 16) is None


def test_token_counts_that_differ_from_the_pairs_are_named():
    rows = [
        *ROWS,
        row("infinity", 100, 1, tokens_per_pair=269.0),
        row("infinity", 100, 2, tokens_per_pair=268.4),
    ]
    assert rerank_report.token_mismatches(rows) == [
        "infinity at 64 tokens: 268-269 per pair in 2 runs (counted by server)",
        "triton_grpc at 256 tokens: 250-250 per pair in 1 runs (counted by server)",
    ]


def test_summary_gives_the_figures_the_verdicts_and_what_was_skipped(tmp_path):
    notes = {"gateway": "no rerank route yet", "infinity": "not installed"}
    facts = {"skipped": notes, "started": "2026-12-07 04:00:00", "cpus": 2, "idle_cpu_percent": 3.0}
    text = rerank_report.summarize(ROWS, facts, tmp_path)
    assert (tmp_path / "summary.md").read_text() == text
    assert "| tokens/s | 64 tok x 16 docs | 256 tok x 64 docs |" in text
    assert "| triton_grpc | 9,000 (9,000 / 8,000 / 10,000) | 4,000 |" in text
    assert "| engine | 10,000 (10,000 / 11,000 / 9,000) | n/a |" in text
    assert "| triton_grpc | 141 (141 / 125 / 156) | 16 |" in text  # pairs/s
    assert (
        "- 64 tokens, 16 docs/request: triton_grpc / engine = **0.90** (target 0.9: met); "
        "best / best 0.91; per round 0.90 / 0.73 / 1.11"
    ) in text
    assert "triton_grpc / vllm_server = **1.50** (target 1.5: met)" in text
    assert "| triton_grpc | 64 | 16 | 100.0 | 200.0 | 150.0-300.0 |" in text
    assert "triton_grpc at 256 tokens: 250-250 per pair in 1 runs (counted by server)" in text
    assert "Runs with errors (left out of the figures): 1" in text
    assert "- gateway: skipped: no rerank route yet" in text
    assert "- infinity: skipped: not installed" in text
    assert "on 2 CPUs; the machine's CPU with every server up and idle: 3.0%" in text


# --- the rerank load generator -----------------------------------------------------------


class FakeRerank(LocalHttpServer):
    """``/rerank`` answering each document with the score ``len(document)``, best first.

    ``usage`` counts 10 tokens per document unless the request's ``model`` is ``quiet``;
    ``model`` ``short`` gets one result only; a query ``bad`` gets 400.
    """

    def __init__(self):
        super().__init__({"/rerank": self.handle})

    async def handle(self, request):
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        if body["query"] == "bad":
            return web.json_response({"message": "bad query"}, status=400)
        results = sorted(
            (
                {"index": i, "relevance_score": float(len(d))}
                for i, d in enumerate(body["documents"])
            ),
            key=lambda r: -r["relevance_score"],
        )[: 1 if body["model"] == "short" else body.get("top_n") or None]
        answer = {"results": results}
        if body["model"] != "quiet":
            answer["usage"] = {"prompt_tokens": 10 * len(body["documents"])}
        return web.json_response(answer)


@pytest.fixture
def fake_rerank():
    server = FakeRerank()
    try:
        yield server
    finally:
        server.close()


CORPUS = corpora.PairCorpus(10, 4, ("q0", "q1"), ("a", "bb", "ccc"))


def test_rerank_load_sends_the_body_and_takes_the_servers_token_count(fake_rerank):
    url = fake_rerank.url("/rerank")
    result = openai_load.rerank_load(url, CORPUS, 2, 2, 0.3, model="m", options={"top_n": 2})
    assert result["errors"] == 0 and result["pairs_s"] > 0 and result["p99_ms"] > 0
    assert (result["tokens_per_pair"], result["tokens_counted_by"]) == (10.0, "server")
    first = fake_rerank.bodies[0]
    assert first == {"model": "m", "query": "q0", "documents": ["a", "bb"], "top_n": 2}
    assert {b["query"] for b in fake_rerank.bodies} == {"q0", "q1"}


def test_without_a_count_the_pairs_exact_tokens_are_used(fake_rerank):
    url = fake_rerank.url("/rerank")
    result = openai_load.rerank_load(url, CORPUS, 3, 1, 0.2, model="quiet", options={})
    assert (result["tokens_per_pair"], result["tokens_counted_by"]) == (10.0, "client")


def test_refusals_and_bad_answers_are_errors_with_the_first_message(fake_rerank):
    bad = corpora.PairCorpus(10, 4, ("bad",), ("a",))
    result = openai_load.rerank_load(
        fake_rerank.url("/rerank"), bad, 1, 1, 0.2, model="m", options={}
    )
    assert result["errors"] > 0 and result["pairs_s"] == 0 and result["p99_ms"] is None
    assert result["detail"] == "HTTP 400: {'message': 'bad query'}"
    # one result where the client asked for every document's
    short = openai_load.rerank_load(
        fake_rerank.url("/rerank"), CORPUS, 2, 1, 0.2, model="short", options={}
    )
    assert short["errors"] > 0 and short["pairs_s"] == 0
    assert short["detail"] == "ValueError: 1 results for 2 documents"
    assert openai_load.probe_rerank(fake_rerank.url("/rerank"), "m", {}) is None
    missing = openai_load.probe_rerank(fake_rerank.url("/v1/rerank"), "m", {"top_n": 1})
    assert missing.startswith(f"POST {fake_rerank.url('/v1/rerank')}: HTTP 404")


def test_rerank_answers_are_decoded_in_every_servers_shape():
    scores, tokens = openai_load.rerank_scores(
        {"results": [{"index": 1, "relevance_score": 0.5}], "usage": {"total_tokens": 7}}, 1
    )
    assert scores.dtype == np.float32 and scores.tolist() == [0.5] and tokens == 7
    infinity_shape = {"data": [{"index": 0, "relevance_score": 1}], "usage": {"prompt_tokens": 3}}
    assert openai_load.rerank_scores(infinity_shape, 1)[1] == 3
    assert openai_load.rerank_scores({"results": [{"relevance_score": 1.0}]}, 1)[1] is None
    with pytest.raises(ValueError, match="1 results for 2 documents"):
        openai_load.rerank_scores({"results": [{"relevance_score": 1.0}]}, 2)
    with pytest.raises(ValueError, match="no results"):
        openai_load.rerank_scores({"detail": "Not Found"}, 2)
    with pytest.raises(ValueError, match="without relevance_score"):
        openai_load.rerank_scores({"results": [{"score": 1.0}]}, 1)


# --- the command line --------------------------------------------------------------------------


def test_the_smoke_plan_is_one_short_round_and_flags_override_the_plan():
    parser = rerank.build_parser()
    smoke = rerank.plan_of(parser.parse_args(["--smoke"]))
    assert smoke.rounds == 1 and smoke.seconds <= 2 and len(smoke.lengths) == 1
    full = rerank.plan_of(parser.parse_args([]))
    assert full == rerank.FULL and full.lengths == (64, 256) and full.docs == (16, 64)
    given = rerank.plan_of(
        parser.parse_args(
            ["--rounds", "2", "--lengths", "256", "--docs", "64", "--concurrency", "8"]
        )
    )
    assert (given.rounds, given.lengths, given.docs, given.concurrency) == (2, (256,), (64,), (8,))
    assert given.seconds == rerank.FULL.seconds
    assert parser.parse_args([]).out.parts[-2:] == ("perf", "rerank")


def test_tokens_per_second_is_pairs_per_second_times_the_exact_length(capsys):
    """Infinity counts characters as tokens: its count is kept as a check, not multiplied."""
    rows: list[dict] = []
    result = {"pairs_s": 100.0, "tokens_per_pair": 269.1, "tokens_counted_by": "server"}
    result |= {"p50_ms": 10.0, "p99_ms": 20.0, "errors": 0}
    rerank.record(rows, "infinity", SimpleNamespace(length=64), 16, 4, 1, result)
    assert (rows[0]["tokens_s"], rows[0]["tokens_per_pair"]) == (6400.0, 269.1)
    assert "6400 tokens/s" in capsys.readouterr().out
