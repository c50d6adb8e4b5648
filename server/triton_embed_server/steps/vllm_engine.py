"""Where the engine is called: one in-process vLLM pooling engine per ``embedder`` instance.

The engine is fed token IDs only (``TokensPrompt``), never raw strings; tokenization is the
tokenizer step's job. The pooling is the model's (its config's spec,
:mod:`triton_embed_server.models.spec`), given to vLLM explicitly
(``PoolerConfig.seq_pooling_type``) so that a folder without sentence-transformers files
pools as its ``repository add`` said; vLLM returns the pooled
vectors *un-normalized* (``PoolingParams(use_activation=False)``) and
:mod:`triton_embed_server.steps.vectors` normalizes, averages windows and cuts dimensions. A model
whose pooling leaves the prompt out (``include_prompt: false``) is built for per-token
output instead (``PoolerConfig(task="token_embed")``: one vLLM engine serves one pooling
task) and pooled here, with the prompt's tokens masked as sentence-transformers masks them.
Each
engine's KV cache is the ``kv_cache_bytes`` of its config
(:mod:`triton_embed_server.steps.kv_cache`),
passed as ``kv_cache_memory_bytes``, never a share of the host's RAM. The
inputs are checked before they get here (:mod:`triton_embed_server.steps.token_ids`), and the
instance is placed before vLLM is imported (:mod:`triton_embed_server.host.placement`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from triton_embed_server.steps.config import EmbedderConfig
from triton_embed_server.steps.errors import EngineError
from triton_embed_server.steps.vectors import pool_tokens

#: vLLM's legacy whole-GiB KV-cache size of the CPU backend; it overrides
#: ``kv_cache_memory_bytes`` (:mod:`triton_embed_server.steps.kv_cache`), so it must be unset.
LEGACY_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"


class PoolingEngine:
    """A vLLM ``LLM`` with the pooling runner, embedding batches of token-ID sequences."""

    def __init__(self, config: EmbedderConfig):
        from vllm import LLM, PoolingParams
        from vllm.config import PoolerConfig

        self.config = config
        self.spec = config.spec
        kwargs = config.llm_kwargs()
        legacy = os.environ.get(LEGACY_KV_ENV, "")
        if legacy:  # vllm/platforms/cpu.py: it would replace kv_cache_memory_bytes silently
            raise EngineError(
                f"{LEGACY_KV_ENV}={legacy[:20]!r} is set and would override the embedder's "
                f"kv_cache_bytes parameter ({kwargs.get('kv_cache_memory_bytes')} bytes); "
                "unset it and set kv_cache_bytes in the model config instead"
            )
        self.per_token = not self.spec.prompting.include_prompt
        pooler = (
            PoolerConfig(task="token_embed")
            if self.per_token
            else PoolerConfig(seq_pooling_type=self.spec.pooling.vllm)
        )
        kwargs.setdefault("pooler_config", pooler)
        self._llm = LLM(**kwargs)
        self._raw = PoolingParams(use_activation=False)
        model_config = self._llm.llm_engine.model_config
        self.vocab_size = int(model_config.get_vocab_size())
        self.dim = int(model_config.get_hidden_size())
        if self.dim != self.spec.dimension:  # a model_path edited without its spec
            raise EngineError(
                f"the model's vectors have {self.dim} values, but the parameter dimension says "
                f"{self.spec.dimension}; set the embedder's spec parameters for this model "
                "(triton-embed repository add writes them) or leave them empty"
            )

    def embed(
        self, token_ids: Sequence[Sequence[int]], skips: Sequence[int] | None = None
    ) -> np.ndarray:
        """Pool pre-tokenized sequences in one engine call (two when some skip tokens).

        Args:
            token_ids: ``n`` sequences of token IDs (windows), already validated.
            skips: per sequence, leading tokens pooling leaves out (the prompt, for a model
                whose ``include_prompt`` is false: :attr:`per_token` engines only; other
                engines pool whole sequences in vLLM's pooler and ignore it).

        Returns:
            float32 ``[n, dim]``, pooled as the model pools, not normalized.

        Raises:
            EngineError: the engine failed or returned a wrong number of vectors.
        """
        out = np.zeros((len(token_ids), self.dim), dtype=np.float32)
        if not token_ids:
            return out
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in token_ids]
        if not self.per_token:
            return self._stack(self._encode(prompts, "embed"))
        skips = list(skips) if skips is not None else [0] * len(token_ids)
        for i, data in enumerate(self._encode(prompts, "token_embed")):
            tokens = data.to("cpu").float().numpy()
            out[i] = pool_tokens(tokens, self.spec.pooling, min(skips[i], len(tokens) - 1))
        return out

    def _encode(self, prompts: list, task: str) -> list:
        """One ``LLM.encode`` call; the per-prompt output tensors, un-normalized."""
        try:
            # encode(pooling_task="embed") is what LLM.embed calls; it keeps each vector as a
            # tensor instead of converting it to a Python list.
            outputs = self._llm.encode(
                prompts, pooling_params=self._raw, use_tqdm=False, pooling_task=task
            )
        except Exception as exc:  # the engine's own failure, reported per request
            raise EngineError(f"the embedding engine failed: {type(exc).__name__}: {exc}") from exc
        if len(outputs) != len(prompts):
            raise EngineError(
                f"the engine returned {len(outputs)} vectors for {len(prompts)} texts"
            )
        return [o.outputs.data for o in outputs]

    @staticmethod
    def _stack(tensors: list) -> np.ndarray:
        import torch

        return torch.stack(tensors).to(torch.float32).numpy()
