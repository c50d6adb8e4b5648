"""The sparse engine (``steps.vllm_sparse``) on token IDs against ``SparseEncoder.encode``.

The tokenizer step's IDs go to an in-process vLLM engine built from the sparse encoder's
config, as the step runs it; its full-vocabulary weights are compared with
sentence-transformers' ``SparseEncoder.encode`` on the same weights (dense output): max and
sum pooling, the plain ``*ForMaskedLM`` checkpoint, a prompt, a truncated text.

Tolerance: ``rtol`` 1e-4 and ``atol`` 5e-5 on each weight. Both run float32 on CPU and
differ only in the order of floating-point sums inside the encoder (other kernels, other
batch shapes): measured on this model, 6 texts, the largest difference was 1.3e-5 on a weight
of 0.068 (a logit moved by 1.3e-5; ``log1p(relu(x))`` has slope at most 1, so no weight moves
more than its logit). ``atol`` is four times that; ``rtol`` covers the largest weights. The
non-zero sets must be equal: the texts' reference weights hold no value in ``(0, 1e-4]``
(checked), so no entry sits within the tolerance of zero.
"""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
from triton_embed.options import RequestOptions
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.sparse_config import SparseEncoderConfig
from triton_embed_server.steps.tokenization import TextRequest, TextTokenizer

from tests.model_factory import fortune_texts
from tests.sparse_factory import make_plain_splade, make_splade, splade_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RTOL = 1e-4
ATOL = 5e-5
#: No reference weight of the test texts is this close to zero: equal non-zero sets are
#: then a property of the two computations, not of rounding.
EDGE = 1e-4


@pytest.fixture
def vllm_env(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_NO_USAGE_STATS", "1")


def model_config(folder, kind, **more):
    values = {"model_path": str(folder), "numa_placement": "off", **more}
    if kind == "sparse":
        values["kind"] = "sparse"
    return {
        "max_batch_size": 64,
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {k: {"string_value": v} for k, v in values.items()},
    }


def texts_to_encode():
    return [
        *fortune_texts(6, seed=41),
        " ".join(fortune_texts(20, seed=42)),  # over 128 tokens: truncated
        "Grüße aus Köln — 東京? naïve café, señor ∑x² 🚀",
    ]


def encode(folder, texts, input_type=None, **more):
    """The engine's weights of ``texts`` (float32 [n, vocab]) and the IDs it was given."""
    from triton_embed_server.steps.vllm_sparse import SparseEngine

    tokenizer = TextTokenizer(TokenizerConfig.from_model_config(model_config(folder, "sparse")))
    (tokenized,) = tokenizer.tokenize_requests(
        [TextRequest([t.encode() for t in texts], RequestOptions(input_type=input_type))]
    )
    engine = SparseEngine(SparseEncoderConfig.from_model_config(model_config(folder, "", **more)))
    try:
        return engine.weights(tokenized.token_ids), tokenized.token_ids
    finally:
        engine.close()
        del engine
        gc.collect()


def assert_like_reference(got, want):
    assert got.shape == want.shape and got.dtype == np.float32
    assert not ((want > 0) & (want <= EDGE)).any()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    for row_got, row_want in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.flatnonzero(row_got), np.flatnonzero(row_want))
    nonzero = (want > 0).sum(axis=1)
    assert (nonzero > 10).all() and (nonzero < want.shape[1] / 2).all()  # sparse, not empty


def test_max_pooling_with_a_prompt_is_sparse_encoders(tmp_path, vllm_env):
    folder = make_splade(tmp_path / "splade")
    texts = texts_to_encode()
    got, ids = encode(folder, texts)
    assert max(len(i) for i in ids) == 128
    assert_like_reference(got, splade_reference(folder, texts))
    got_query, _ = encode(folder, texts[:3], input_type="query")
    assert_like_reference(got_query, splade_reference(folder, texts[:3], prompt_name="query"))
    assert np.abs(got_query - got[:3]).max() > 1e-2  # the prompt changes the vectors


def test_sum_pooling_is_sparse_encoders(tmp_path, vllm_env):
    folder = make_splade(tmp_path / "splade-sum", pooling="sum", seed=1)
    texts = texts_to_encode()[:4]
    got, _ = encode(folder, texts)
    assert_like_reference(got, splade_reference(folder, texts))


def test_a_plain_checkpoint_is_served_as_splade_max(tmp_path, vllm_env):
    """The plain ``BertForMaskedLM`` folder: the same weights as the SparseEncoder folder."""
    base = tmp_path / "splade"
    folder = make_splade(base, seed=2)
    plain = make_plain_splade(tmp_path / "plain", seed=2)
    texts = texts_to_encode()[:4]
    got, _ = encode(plain, texts, max_length="128")
    assert_like_reference(got, splade_reference(folder, texts))
    assert json.loads((plain / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
