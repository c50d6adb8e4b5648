"""The hybrid engine (steps.vllm_hybrid, steps.hybrid_heads) against FlagEmbedding's formulas.

A seeded BGE-M3-style folder (:mod:`tests.bgem3_factory`) is added with ``repository add``;
the tokenizer step's IDs of the texts go to an in-process vLLM engine built from the hybrid
encoder's config, as the step runs it, and the heads run on its hidden states. The reference
is FlagEmbedding's arithmetic with ``transformers`` on the same weights and the same texts
(:func:`tests.bgem3_factory.bge_m3_reference`): the token IDs must be equal, and

* dense: ``rtol`` 1e-4, ``atol`` 1e-5 per value (unit vectors, values up to ~0.3);
* sparse: the same token IDs, weights within ``rtol`` 1e-4, ``atol`` 1e-5 (weights of a
  few units); a weight within 1e-5 of 0 may be kept by one side only (none is here);
* ColBERT: ``[tokens - 1, 128]``, ``rtol`` 1e-4, ``atol`` 1e-5, unit rows.

Both run float32 on CPU and differ only in the order of floating-point sums inside the
encoder (other kernels, other batch shapes: the reference pads its batch).
"""

from __future__ import annotations

import numpy as np
import pytest
from triton_embed.hybrid_options import HybridOptions
from triton_embed_server.models import repository as gen
from triton_embed_server.models.instance_group import read_config_pbtxt
from triton_embed_server.models.repository import ModelOptions
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.hybrid_config import HybridEncoderConfig
from triton_embed_server.steps.hybrid_heads import HybridHeads
from triton_embed_server.steps.sparse_vectors import keep
from triton_embed_server.steps.tokenization import TextRequest, TextTokenizer

from tests.bgem3_factory import COLBERT_DIM, bge_m3_reference, make_bge_m3
from tests.model_factory import HIDDEN_SIZE, fortune_texts

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RTOL = 1e-4
ATOL = 1e-5


@pytest.fixture
def vllm_env(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_NO_USAGE_STATS", "1")


def texts():
    return [
        *fortune_texts(4, seed=81),
        " ".join(fortune_texts(12, seed=82)),  # truncated to 128 tokens
        "Grüße aus Köln — 東京? naïve café",  # unknown pieces: <unk>, left out of sparse
    ]


def test_three_heads_are_flagembeddings(tmp_path, vllm_env):
    from triton_embed_server.steps.vllm_hybrid import HybridEngine

    folder = make_bge_m3(tmp_path / "bge-m3")
    repo = tmp_path / "repo"
    gen.add_model(repo, ModelOptions(name="m", model=str(folder), instances=1))
    tok_config = read_config_pbtxt(repo / "m_tokenizer" / "config.pbtxt")
    tokenizer = TextTokenizer(TokenizerConfig.from_model_config(tok_config, repo))
    sample = texts()
    opts = HybridOptions().text_options()
    (result,) = tokenizer.tokenize_requests([TextRequest([t.encode() for t in sample], opts)])
    want = bge_m3_reference(folder, sample)
    assert [list(x) for x in result.token_ids] == want.token_ids
    engine_config = read_config_pbtxt(repo / "m_hybrid_encoder" / "config.pbtxt")
    engine_config["parameters"]["numa_placement"] = {"string_value": "off"}
    engine = HybridEngine(HybridEncoderConfig.from_model_config(engine_config, repo))
    try:
        states = engine.hidden_states(result.token_ids)
    finally:
        engine.close()
        del engine
    config = HybridEncoderConfig.from_model_config(engine_config, repo)
    heads = HybridHeads(config.model_path, config.spec)
    dense = heads.dense(states)
    assert dense.dtype == np.float32 and dense.shape == (len(sample), HIDDEN_SIZE)
    np.testing.assert_allclose(dense, want.dense, rtol=RTOL, atol=ATOL)
    unk_seen = False
    for h, ids, w_sparse, w_colbert in zip(
        states, result.token_ids, want.sparse, want.colbert, strict=True
    ):
        indices, values = heads.sparse(h, ids)
        assert indices.dtype == np.int32 and values.dtype == np.float32
        assert list(indices) == sorted(w_sparse), "the same non-zero set"
        np.testing.assert_allclose(values, [w_sparse[i] for i in sorted(w_sparse)],
                                   rtol=RTOL, atol=ATOL)  # fmt: skip
        assert not set(indices) & {0, 1, 2, 3}
        unk_seen |= 3 in ids
        colbert = heads.colbert(h)
        assert colbert.shape == (len(ids) - 1, COLBERT_DIM) == w_colbert.shape
        np.testing.assert_allclose(colbert, w_colbert, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(np.linalg.norm(colbert, axis=1), 1.0, rtol=1e-5)
        # top_k and threshold cut the weights as a sparse model's: the 3 largest above 0.5.
        top_i, top_v = keep(indices, values, 3, 0.5)
        above = [i for i in w_sparse if w_sparse[i] > 0.5]
        assert list(top_i) == sorted(sorted(above, key=lambda i: (-w_sparse[i], i))[:3])
        np.testing.assert_allclose(top_v, [w_sparse[i] for i in top_i], rtol=RTOL, atol=ATOL)
    assert unk_seen, "a text with <unk> tokens"
