"""Where a sparse model's engine is called: one in-process vLLM pooling engine per instance.

The engine is fed token IDs only (``TokensPrompt``); the tokenizer step tokenized the texts.
It runs vLLM's SPLADE model (``BertSpladeSparseEmbeddingModel``) as
:class:`~triton_embed_server.steps.splade_model.SpladeForMaskedLM`, registered in vLLM's
model registry and selected with ``hf_overrides`` (the folder's ``config.json`` says
``BertForMaskedLM``, which vLLM serves as per-token logits), and returns per text its
full-vocabulary weights, ``pool over tokens of log1p(relu(MLM logits))``: float32
``[vocab_size]``, as sentence-transformers' ``SpladePooling`` computes them. The engine step
keeps the entries a request asks for (:mod:`triton_embed_server.steps.sparse_vectors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from triton_embed_server.steps.errors import EngineError
from triton_embed_server.steps.sparse_config import SparseEncoderConfig
from triton_embed_server.steps.vllm_engine import LEGACY_KV_ENV


def sparse_llm_kwargs(config: SparseEncoderConfig) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM``: the engine's, serving the folder as SPLADE.

    ``hf_overrides`` names :data:`~triton_embed_server.steps.splade_model.ARCHITECTURE`
    and its pooling strategy (``splade_pooling``: ``max`` or ``sum``); an ``hf_overrides``
    in the step's ``engine_args`` wins.
    """
    from triton_embed_server.steps.splade_model import ARCHITECTURE, POOLING_KEY

    kwargs = config.llm_kwargs()
    pooling = config.spec.pooling if config.spec is not None else "max"
    kwargs.setdefault("hf_overrides", {"architectures": [ARCHITECTURE], POOLING_KEY: pooling})
    return kwargs


class SparseEngine:
    """A vLLM ``LLM`` with the pooling runner, weighting the vocabulary for token-ID texts."""

    def __init__(self, config: SparseEncoderConfig):
        import os

        from vllm import LLM, ModelRegistry, PoolingParams

        from triton_embed_server.steps.splade_model import ARCHITECTURE, SpladeForMaskedLM

        legacy = os.environ.get(LEGACY_KV_ENV, "")
        if legacy:  # vllm/platforms/cpu.py: it would replace kv_cache_memory_bytes silently
            raise EngineError(
                f"{LEGACY_KV_ENV}={legacy[:20]!r} is set and would override the step's "
                "kv_cache_bytes parameter; unset it and set kv_cache_bytes in the model config"
            )
        self.config = config
        ModelRegistry.register_model(ARCHITECTURE, SpladeForMaskedLM)
        self._llm = LLM(**sparse_llm_kwargs(config))
        self._raw = PoolingParams(use_activation=False)
        model_config = self._llm.llm_engine.model_config
        self.vocab_size = int(model_config.get_vocab_size())

    def close(self) -> None:
        """Shut the engine down now (not left to the garbage collector)."""
        self._llm.llm_engine.engine_core.shutdown()

    def weights(self, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Full-vocabulary SPLADE weights of pre-tokenized texts, in one engine call.

        Args:
            token_ids: ``n`` texts' token IDs, already validated.

        Returns:
            float32 ``[n, vocab_size]``, every value >= 0.

        Raises:
            EngineError: the engine failed or returned a wrong number or shape of vectors.
        """
        if not token_ids:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        import torch
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in token_ids]
        try:
            outputs = self._llm.encode(
                prompts, pooling_params=self._raw, use_tqdm=False, pooling_task="embed"
            )
        except Exception as exc:  # the engine's own failure, reported per request
            raise EngineError(f"the sparse engine failed: {type(exc).__name__}: {exc}") from exc
        if len(outputs) != len(prompts):
            raise EngineError(
                f"the engine returned {len(outputs)} vectors for {len(prompts)} texts"
            )
        out = torch.stack([o.outputs.data.reshape(-1) for o in outputs]).float().numpy()
        if out.shape[1] != self.vocab_size:
            raise EngineError(
                f"the engine returned vectors of {out.shape[1]} values; the vocabulary has "
                f"{self.vocab_size}"
            )
        return out
