"""Where the engine is called: one in-process vLLM pooling engine per ``embedder`` instance.

The engine is fed token IDs only (``TokensPrompt``), never raw strings; tokenization is the
tokenizer step's job. Pooling and normalization are the model's own sentence-transformers
configuration (``modules.json``, ``1_Pooling/config.json``), which vLLM reads. The inputs are
checked before they get here (:mod:`triton_embed_server.token_ids`), and the instance is
placed before vLLM is imported (:mod:`triton_embed_server.placement`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from triton_embed_server.config import EmbedderConfig
from triton_embed_server.errors import EngineError


class PoolingEngine:
    """A vLLM ``LLM`` with the pooling runner, embedding batches of token-ID sequences."""

    def __init__(self, config: EmbedderConfig):
        from vllm import LLM

        self.config = config
        self._llm = LLM(**config.llm_kwargs())
        model_config = self._llm.llm_engine.model_config
        self.vocab_size = int(model_config.get_vocab_size())
        self.dim = int(model_config.get_hidden_size())

    def embed(self, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Embed pre-tokenized texts in one engine call.

        Args:
            token_ids: ``n`` sequences of token IDs, already validated.

        Returns:
            float32 ``[n, dim]``, pooled and normalized as the model's
            sentence-transformers config says (mean pooling, L2 norm for all-MiniLM-L6-v2).

        Raises:
            EngineError: the engine failed or returned a wrong number of vectors.
        """
        if not token_ids:
            return np.zeros((0, self.dim), dtype=np.float32)
        from vllm.inputs import TokensPrompt

        return self._encode([TokensPrompt(prompt_token_ids=list(ids)) for ids in token_ids])

    def _encode(self, prompts: list) -> np.ndarray:
        """One ``LLM.encode`` call over vLLM prompts, stacked into float32 ``[n, dim]``."""
        try:
            # encode(pooling_task="embed") is what LLM.embed calls; it keeps each vector as a
            # tensor instead of converting it to a Python list.
            outputs = self._llm.encode(prompts, use_tqdm=False, pooling_task="embed")
        except Exception as exc:  # the engine's own failure, reported per request
            raise EngineError(f"the embedding engine failed: {type(exc).__name__}: {exc}") from exc
        if len(outputs) != len(prompts):
            raise EngineError(
                f"the engine returned {len(outputs)} vectors for {len(prompts)} texts"
            )
        import torch

        return torch.stack([o.outputs.data for o in outputs]).to(torch.float32).numpy()
