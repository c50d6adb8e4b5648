"""The scorer's engine (``steps.vllm_scorer``) on token IDs against the references, same weights.

The pair tokenizer's IDs and segment starts go to an in-process vLLM engine built from the
scorer's config, as the scorer step runs it; its scores are compared with sentence-transformers'
``CrossEncoder.predict`` (a BERT cross-encoder whose segment embeddings matter) and with the
Qwen3-Reranker model card's recipe (a decoder reranker), within 1e-4 (float32 on CPU).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from triton_embed.rerank_options import PairOptions
from triton_embed_server.models.reranker_spec import Activation
from triton_embed_server.steps.pair_tokenization import PairRequest, PairTokenizer
from triton_embed_server.steps.rerank_config import PairTokenizerConfig, ScorerConfig
from triton_embed_server.steps.vllm_scorer import ScoringEngine, activate

from tests.model_factory import fortune_texts
from tests.reranker_factory import (
    cross_encoder_scores,
    make_bert_cross_encoder,
    make_qwen3_reranker,
    qwen3_reference_scores,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ATOL = 1e-4


def model_config(folder, family, max_length, **more):
    values = {"model_path": str(folder), "family": family, "max_length": str(max_length)}
    values.update(more)
    return {
        "max_batch_size": 64,
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {k: {"string_value": v} for k, v in values.items()},
    }


def pairs_to_score():
    queries = fortune_texts(6, seed=21, max_chars=80)
    documents = fortune_texts(6, seed=22, max_chars=150)
    long_doc = " ".join(fortune_texts(20, seed=23))
    pairs = list(zip(queries, documents, strict=True))
    pairs += [(queries[0], long_doc), ("Grüße aus Köln — 東京?", "naïve café, señor ∑x² 🚀")]
    return pairs


@pytest.fixture
def vllm_env(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_NO_USAGE_STATS", "1")


def score(folder, family, max_length, pairs, **options):
    config = model_config(folder, family, max_length, numa_placement="off")
    tokenizer = PairTokenizer(PairTokenizerConfig.from_model_config(config))
    request = PairRequest(
        [q.encode() for q, _ in pairs], [d.encode() for _, d in pairs], PairOptions(**options)
    )
    (tokenized,) = tokenizer.tokenize_requests([request])
    engine = ScoringEngine(ScorerConfig.from_model_config(config))
    try:
        logits = engine.score(tokenized.token_ids, tokenized.segment_starts)
        unsegmented = engine.score(tokenized.token_ids, [0] * len(pairs))
    finally:
        engine.close()
        del engine
        gc.collect()
    return logits, unsegmented


def test_a_bert_cross_encoder_scores_as_crossencoder_predict(tmp_path, vllm_env):
    folder = make_bert_cross_encoder(tmp_path / "bert-ce")
    pairs = pairs_to_score()
    logits, unsegmented = score(folder, "cross_encoder", 128, pairs)
    want = cross_encoder_scores(folder, pairs)
    np.testing.assert_allclose(activate(logits, Activation.SIGMOID), want, rtol=0, atol=ATOL)
    np.testing.assert_allclose(logits, cross_encoder_scores(folder, pairs, raw=True), atol=ATOL)
    # the segment ids matter for this model: without them every score moves
    assert np.abs(activate(unsegmented, Activation.SIGMOID) - want).min() > 10 * ATOL


def test_a_decoder_reranker_scores_as_the_model_card(tmp_path, vllm_env):
    folder = make_qwen3_reranker(tmp_path / "qwen3-rr")
    pairs = pairs_to_score()
    logits, _ = score(folder, "decoder", 192, pairs)
    want = qwen3_reference_scores(folder, pairs, max_length=192)
    np.testing.assert_allclose(activate(logits, Activation.SIGMOID), want, rtol=0, atol=ATOL)
    assert want.std() > 1e-3  # the pairs get different scores: the comparison can fail


def test_activate_is_a_stable_sigmoid():
    x = np.array([-1000.0, -3.0, 0.0, 3.0, 1000.0], dtype=np.float32)
    got = activate(x, Activation.SIGMOID)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)
    assert np.isfinite(got).all()
    assert activate(x, Activation.IDENTITY) is not None
    np.testing.assert_array_equal(activate(x, Activation.IDENTITY), x)
