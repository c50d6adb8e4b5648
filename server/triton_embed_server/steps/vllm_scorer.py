"""Where a reranker's engine is called: one in-process vLLM pooling engine per scorer instance.

The engine is fed token IDs only (``TokensPrompt``); the pair tokenizer step tokenized the
pairs. vLLM runs the model's classifier (``pooling_task="classify"``) and returns the raw
logit of each pair (``PoolingParams(use_activation=False)``): the activation a client gets
by default is applied here (:func:`activate`), as ``CrossEncoder.predict`` applies it,
because vLLM reads it only from ``config.json``, which ``CrossEncoder.save`` leaves stale
(:mod:`triton_embed_server.models.reranker_spec`).

Segment ids: vLLM's pre-tokenized path drops ``TokensPrompt.token_type_ids`` (measured:
every pair of a BERT cross-encoder whose segment embeddings matter scored as if all its
tokens were segment 0). Its own text scoring path carries them instead as the index of the
first segment-1 token in ``PoolingParams.extra_kwargs["compressed_token_type_ids"]``
(vLLM 0.32 ``entrypoints/pooling/scoring/io_processor.py``), which the model runner turns
back into per-token segment ids (``v1/worker/gpu_model_runner.py``, ``_init_model_kwargs``,
inherited by the CPU runner). The scorer passes each pair's segment start the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from triton_embed_server.models.reranker_spec import Activation
from triton_embed_server.steps.errors import EngineError
from triton_embed_server.steps.rerank_config import ScorerConfig

#: The ``PoolingParams.extra_kwargs`` key vLLM's model runner reads segment ids from.
SEGMENT_KEY = "compressed_token_type_ids"


def activate(logits: np.ndarray, activation: Activation) -> np.ndarray:
    """The scores a client gets by default from raw logits.

    Args:
        logits: float32 ``[n]``.
        activation: the model's (:class:`Activation`).

    Returns:
        float32 ``[n]``: ``1 / (1 + exp(-x))`` for the sigmoid (computed without overflow),
        the logits for the identity.
    """
    logits = np.asarray(logits, dtype=np.float32)
    if activation is Activation.IDENTITY:
        return logits
    out = np.empty_like(logits)
    positive = logits >= 0
    out[positive] = 1.0 / (1.0 + np.exp(-logits[positive]))
    e = np.exp(logits[~positive])
    out[~positive] = e / (1.0 + e)
    return out


class ScoringEngine:
    """A vLLM ``LLM`` with the pooling runner, scoring batches of token-ID pairs."""

    def __init__(self, config: ScorerConfig):
        from vllm import LLM, PoolingParams

        self.config = config
        self._llm = LLM(**config.llm_kwargs())
        self._params = PoolingParams
        model_config = self._llm.llm_engine.model_config
        self.vocab_size = int(model_config.get_vocab_size())

    def close(self) -> None:
        """Shut the engine down now.

        Not left to the garbage collector, which can tear down the process-wide state of
        another engine started since.
        """
        self._llm.llm_engine.engine_core.shutdown()

    def score(
        self, token_ids: Sequence[Sequence[int]], segment_starts: Sequence[int]
    ) -> np.ndarray:
        """Raw logits of pre-tokenized pairs, in one engine call.

        Args:
            token_ids: ``n`` pairs' token IDs, already validated.
            segment_starts: per pair, the index of its first segment-1 token, or 0 for none.

        Returns:
            float32 ``[n]``, the model's logit per pair (no activation).

        Raises:
            EngineError: the engine failed or returned a wrong number of scores.
        """
        if not token_ids:
            return np.zeros(0, dtype=np.float32)
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in token_ids]
        params = [
            self._params(use_activation=False, extra_kwargs={SEGMENT_KEY: int(k)})
            if k
            else self._params(use_activation=False)
            for k in segment_starts
        ]
        try:
            outputs = self._llm.encode(
                prompts, pooling_params=params, use_tqdm=False, pooling_task="classify"
            )
        except Exception as exc:  # the engine's own failure, reported per request
            raise EngineError(f"the scoring engine failed: {type(exc).__name__}: {exc}") from exc
        if len(outputs) != len(prompts):
            raise EngineError(f"the engine returned {len(outputs)} scores for {len(prompts)} pairs")
        import torch

        return torch.stack([o.outputs.data.reshape(-1)[0] for o in outputs]).float().numpy()
