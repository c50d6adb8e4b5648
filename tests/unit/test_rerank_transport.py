"""Rerankers in the transport: the catalog's kinds, "pair N" errors, SCORE decoding, pieces."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest
from triton_embed.codec import float32_values
from triton_embed.rerank_options import PairOptions
from triton_embed.reranking import rank
from triton_embed.transport.catalog import (
    Catalog,
    ModelInfo,
    ModelKind,
    RerankerInfo,
    kind_of_config,
    preferred_pairs,
    served_model,
)
from triton_embed.transport.failures import ErrorKind, TransportError, upstream_error
from triton_embed.transport.inference import TokenBudget
from triton_embed.transport.scoring import pair_queries, score_pairs
from tritonclient.utils import InferenceServerException

from tests.unit.gateway_fakes import RERANK_CONFIG, RERANK_STEP_CONFIGS, embed_info, rerank_info
from tests.unit.test_gateway_upstreams import EMBED_CONFIG, STEP_CONFIGS

CONFIGS = {**STEP_CONFIGS, **RERANK_STEP_CONFIGS}

# ---- catalog ------------------------------------------------------------------------------


def test_a_reranker_ensemble_is_recognised_with_its_facts():
    info = served_model(RERANK_CONFIG, CONFIGS)
    assert info == RerankerInfo(
        name="rerank",
        max_batch_size=64,
        tokenizer="rerank_tokenizer",
        scorer="rerank_scorer",
        served_model_name="BAAI/bge-reranker-base",
        max_length=512,
        family="cross_encoder",
        dtype="bfloat16",
        # the pair tokenizer's default: min(64 pairs x 512 tokens, 65,536)
        max_request_tokens=32768,
        max_chars=16 * 512,  # its default max_chars: PAIR_CHARS_PER_TOKEN x max_length
    )
    assert info.kind is ModelKind.RERANKER and info.piece_size() == 64
    assert kind_of_config(RERANK_CONFIG) is ModelKind.RERANKER


def test_a_scorers_preferred_batch_sets_the_piece_size():
    scorer = {
        **RERANK_STEP_CONFIGS["rerank_scorer"],
        "dynamic_batching": {"preferred_batch_size": [32, 16]},
    }
    info = served_model(RERANK_CONFIG, {**CONFIGS, "rerank_scorer": scorer})
    assert info.preferred_pairs == 16 and info.piece_size() == 16
    assert preferred_pairs({"dynamic_batching": {"preferred_batch_size": ["x"]}}) is None
    assert preferred_pairs({}) is None
    # the token budget still caps it: 8,192-token pairs under a 65,536-token budget
    long = RerankerInfo("r", 64, "t", "s", max_length=8192, max_request_tokens=65536,
                        preferred_pairs=16)  # fmt: skip
    assert long.piece_size() == 8


def test_an_embedding_ensemble_is_still_an_embedding_model_and_reads_its_facts_only_then():
    asked = []

    def facts():
        asked.append(1)
        return None

    info = served_model(EMBED_CONFIG, CONFIGS, facts)
    assert isinstance(info, ModelInfo) and info.kind is ModelKind.EMBEDDING
    assert kind_of_config(EMBED_CONFIG) is ModelKind.EMBEDDING
    assert served_model(RERANK_CONFIG, CONFIGS, facts).kind is ModelKind.RERANKER
    assert asked == [1]  # a reranker's folder is never read for pooling


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c.update(input=[{"name": "QUERY"}]),  # no DOCUMENT
        lambda c: c.update(output=[{"name": "SCORE"}]),  # no NUM_TOKENS
        lambda c: c["parameters"].update(kind={"string_value": "embedding"}),
        lambda c: c.update(platform="python"),
        lambda c: c.update(ensemble_scheduling={"step": [{"model_name": "rerank_scorer"}]}),
    ],
)
def test_a_config_short_of_the_contract_is_no_reranker(edit):
    config = copy.deepcopy(RERANK_CONFIG)
    edit(config)
    assert served_model(config, CONFIGS) is None
    assert RerankerInfo.from_configs(config, CONFIGS) is None


def test_a_long_token_budget_per_pair_cuts_the_pieces():
    config = copy.deepcopy(RERANK_CONFIG)
    config["parameters"]["max_length"] = {"string_value": "8192"}
    assert served_model(config, CONFIGS).piece_size() == 8  # 65,536 // 8,192
    steps = copy.deepcopy(CONFIGS)
    steps["rerank_tokenizer"]["parameters"] = {"max_request_tokens": {"string_value": "20000"}}
    assert served_model(config, steps).piece_size() == 2


def test_both_kinds_share_one_name_space():
    catalog = Catalog.build(
        [embed_info(4, served_model_name="org/embed"), rerank_info(4, served_model_name="org/rr")]
    )
    assert catalog.resolve("org/rr").kind is ModelKind.RERANKER
    assert catalog.resolve("embed").kind is ModelKind.EMBEDDING
    assert catalog.names() == ["embed", "rerank", "org/embed", "org/rr"]
    assert catalog.of_kind(ModelKind.RERANKER) == ["rerank"]
    assert catalog.of_kind(ModelKind.EMBEDDING) == ["embed"]


# ---- errors and wire ----------------------------------------------------------------------


def test_a_refused_pair_is_renumbered_to_the_callers_documents():
    message = "in ensemble 'rerank', the document of pair 3 is empty; send at least one ..."
    exc = InferenceServerException(msg=message, status="StatusCode.INVALID_ARGUMENT")
    error = upstream_error(exc, offset=64, size=64)
    assert error.kind is ErrorKind.INVALID_INPUT and error.index == 67
    assert error.message == message.replace("pair 3", "pair 67")


def test_float32_values_reads_the_scores_little_endian():
    scores = np.array([0.5, -1.25, 3e-8], "<f4")
    assert float32_values(scores.tobytes(), 3).tolist() == scores.tolist()
    with pytest.raises(ValueError, match="an FP32 output of 8 bytes does not hold 3 values"):
        float32_values(scores.tobytes()[:8], 3)


def test_rank_is_score_descending_ties_by_lower_index():
    scores = np.array([0.2, 0.9, 0.2, 0.5, 0.9], np.float32)
    assert rank(scores).tolist() == [1, 4, 3, 0, 2]
    assert rank(scores, 2).tolist() == [1, 4]
    assert rank(scores, 99).tolist() == [1, 4, 3, 0, 2]
    assert rank(np.array([np.nan, 0.1], np.float32)).tolist() == [1, 0]


def test_pair_queries_repeats_one_query_or_takes_one_per_document():
    assert pair_queries([b"q"], 3) == [b"q", b"q", b"q"]
    assert pair_queries([b"a", b"b"], 2) == [b"a", b"b"]
    with pytest.raises(ValueError, match="2 queries for 3 documents: send 1 or 3"):
        pair_queries([b"a", b"b"], 3)


# ---- score_pairs --------------------------------------------------------------------------


class PairPool:
    """A pool stand-in serving a reranker: score = document length, tokens = 10 per pair."""

    def __init__(self, fail: BaseException | None = None, fail_on_piece: int | None = None):
        self.calls: list[tuple[str, list[bytes], list[bytes], dict]] = []
        self.fail = fail
        self.fail_on_piece = fail_on_piece

    async def infer(self, model, inputs, outputs, parameters=None):
        queries, documents = list(inputs["QUERY"]), list(inputs["DOCUMENT"])
        self.calls.append((model, queries, documents, dict(parameters or {})))
        if self.fail is not None and self.fail_on_piece == len(self.calls) - 1:
            raise self.fail
        scores = np.array([len(d) for d in documents], "<f4")
        counts = np.full(len(documents), 10, "<i4")
        return {"SCORE": scores.tobytes(), "NUM_TOKENS": counts.tobytes()}


def test_pairs_go_in_pieces_of_max_batch_size_and_come_back_in_input_order():
    pool = PairPool()
    documents = [b"x" * n for n in (3, 1, 4, 1, 5, 9, 2, 6, 5, 3)]
    options = PairOptions(truncation="only_second", raw_scores=True)
    result = asyncio.run(score_pairs(pool, rerank_info(4), [b"q"], documents, options))
    assert result.scores.dtype == np.float32 and result.num_tokens.dtype == np.int32
    assert result.scores.tolist() == [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    assert result.num_tokens.tolist() == [10] * 10
    assert sorted(len(c[2]) for c in pool.calls) == [2, 4, 4]
    assert all(c[1] == [b"q"] * len(c[2]) for c in pool.calls)  # the query on every row
    assert {str(c[3]) for c in pool.calls} == {"{'truncation': 'only_second', 'raw_scores': True}"}
    assert {c[0] for c in pool.calls} == {"rerank"}


def test_a_pair_refused_in_a_later_piece_is_named_by_its_index_in_the_documents():
    refused = InferenceServerException(
        msg="the document of pair 1 is empty; send at least one non-blank character",
        status="StatusCode.INVALID_ARGUMENT",
    )
    pool = PairPool(refused, fail_on_piece=0)
    info = rerank_info(4)
    with pytest.raises(TransportError) as caught:
        asyncio.run(score_pairs(pool, info, [b"q"], [b"d"] * 4, None))
    assert caught.value.index == 1
    pool = PairPool(refused, fail_on_piece=1)  # pieces start in order: the second is [4, 8)
    with pytest.raises(TransportError) as caught:
        asyncio.run(score_pairs(pool, info, [b"q"], [b"d"] * 8, None))
    assert caught.value.index == 5 and "pair 5" in caught.value.message


def test_pairs_over_the_token_budget_fail_and_name_the_field():
    pool = PairPool()
    budget = TokenBudget(25, max_tokens_per_text=512, field="documents")
    with pytest.raises(TransportError) as caught:
        asyncio.run(score_pairs(pool, rerank_info(2), [b"q"], [b"d"] * 6, None, budget))
    assert caught.value.kind is ErrorKind.OVER_BUDGET and caught.value.field == "documents"
    assert "at most 25 tokens" in caught.value.message


def test_no_documents_is_no_call():
    pool = PairPool()
    result = asyncio.run(score_pairs(pool, rerank_info(4), [b"q"], [], None))
    assert result.scores.shape == (0,) and pool.calls == []
