"""The token engine (``steps.vllm_multivector``) on token IDs against ``transformers``.

The tokenizer step's IDs (markers, truncation and a query's ``[MASK]`` augmentation, checked
against each reference library in ``test_multivector_repository.py``) go to an in-process
vLLM engine built from the token encoder's config, as the step runs it; each text's
``[tokens, dim]`` matrix is compared with ``transformers``' last hidden states of the same
IDs, projected by the ColBERT projection and L2-normalized per token (Stanford's
``HF_ColBERT`` and PyLate's layout), or as they are (hidden states, ``--kind multivector``).
A document's rows of punctuation tokens are left out as each reference leaves them out
(``reference_skiplist``: Stanford's ``mask_punctuation``, PyLate's ``skiplist_words``); a
query keeps every row, and the hidden states skip none.

Each ColBERT layout is tested twice: attending to a query's ``[MASK]`` expansion
(``attend_to_mask_tokens`` / ``attend_to_expansion_tokens`` true: every text on vLLM, the
reference attends to every position) and not (``-masked``, both libraries' default: the
queries go to the engine's ``transformers`` query encoder, the reference runs with the
attention mask its tokenizer makes, 0 on the expansion; ``reference_inputs``). The test reads
which path ran from the engine (``masked_queries`` and its count of queries), and checks
that the mask matters: the unmasked reference is far from the served query rows.

Tolerance: ``rtol`` 1e-4 and ``atol`` 1e-5 per value. Both run float32 on CPU and differ only
in the order of floating-point sums inside the encoder (other kernels, other batch shapes);
a normalized ColBERT row has values up to ~0.5, the hidden states up to ~5, so ``rtol``
covers the large values and ``atol`` the small ones.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from triton_embed.multivector_options import MultiVectorOptions
from triton_embed_server.models import repository as gen
from triton_embed_server.models.instance_group import read_config_pbtxt
from triton_embed_server.models.repository import ModelOptions
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.multivector_config import TokenEncoderConfig
from triton_embed_server.steps.tokenization import TextRequest, TextTokenizer

from tests.colbert_factory import (
    COLBERT_DIM,
    make_pylate_colbert,
    make_stanford_colbert,
    reference_inputs,
    reference_skiplist,
    reference_vectors,
)
from tests.model_factory import HIDDEN_SIZE, fortune_texts, make_mean_encoder

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
        *fortune_texts(4, seed=71),
        " ".join(fortune_texts(12, seed=72)),  # truncated
        "Grüße aus Köln — 東京? naïve café",
        "?!... ;-)",  # punctuation only: a document keeps [CLS], its marker and [SEP]
    ]


@pytest.mark.parametrize(
    "which", ["stanford", "pylate", "dense", "stanford-masked", "pylate-masked"]
)
def test_token_vectors_are_the_references(tmp_path, vllm_env, which):
    from triton_embed_server.steps.vllm_multivector import TokenEmbeddingEngine

    makers = {
        "stanford": make_stanford_colbert,
        "pylate": make_pylate_colbert,
        "dense": make_mean_encoder,
        "stanford-masked": partial(make_stanford_colbert, attend_to_mask_tokens=False),
        "pylate-masked": partial(make_pylate_colbert, attend_to_expansion_tokens=False),
    }
    masked = which.endswith("-masked")
    folder = makers[which](tmp_path / which)
    repo = tmp_path / "repo"
    kind = "multivector" if which == "dense" else ""
    gen.add_model(repo, ModelOptions(name="m", model=str(folder), kind=kind, instances=1))
    tok_config = read_config_pbtxt(repo / "m_tokenizer" / "config.pbtxt")
    tokenizer = TextTokenizer(TokenizerConfig.from_model_config(tok_config, repo))
    sample = texts()
    ids, sides, masks = [], [], []
    for side in ("query", "document"):
        opts = MultiVectorOptions(input_type=side).text_options()
        (result,) = tokenizer.tokenize_requests([TextRequest([t.encode() for t in sample], opts)])
        want_ids, want_masks = reference_inputs(folder, sample, side)
        assert result.token_ids == want_ids
        ids += result.token_ids
        sides += [side] * len(result.token_ids)
        masks += want_masks
    assert any(0 in m for m in masks) == masked  # the reference leaves the expansion out
    engine_config = read_config_pbtxt(repo / "m_token_encoder" / "config.pbtxt")
    engine_config["parameters"]["numa_placement"] = {"string_value": "off"}
    engine = TokenEmbeddingEngine(TokenEncoderConfig.from_model_config(engine_config, repo))
    try:
        got = engine.embed(ids, sides)
        on_torch = engine.masked_queries.texts if engine.masked_queries is not None else None
    finally:
        engine.close()
        del engine
    queries = sides.count("query")
    assert on_torch == (queries if masked else None)  # which path ran
    want = reference_vectors(folder, ids, sides, masks)
    skip = reference_skiplist(folder)
    assert bool(skip) == (which != "dense")
    dim = HIDDEN_SIZE if which == "dense" else COLBERT_DIM
    dropped = 0
    for text_ids, side, g, w in zip(ids, sides, got, want, strict=True):
        kept = len(text_ids) if side == "query" else sum(t not in skip for t in text_ids)
        dropped += len(text_ids) - kept
        assert g.dtype == np.float32 and g.shape == (kept, dim) == w.shape
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
        if which != "dense":
            np.testing.assert_allclose(np.linalg.norm(g, axis=1), 1.0, rtol=1e-5)
    if which != "dense":  # the punctuation-only document keeps [CLS], its marker and [SEP]
        assert dropped > 0 and got[-1].shape[0] == 3, got[-1].shape
    if masked:  # attending to the expansion gives other query rows: the mask is what matched
        unmasked = reference_vectors(folder, ids[:queries])
        far = max(float(np.abs(g - u).max()) for g, u in zip(got[:queries], unmasked, strict=True))
        assert far > 100 * ATOL, far
