"""Where a hybrid (BGE-M3) model's engine is called: one forward pass, then the asked heads.

The encoder runs once per text in an in-process vLLM pooling engine (vLLM's ``token_embed``
task of the plain encoder, ``XLMRobertaModel`` served as ``RobertaEmbeddingModel``, the
activation off: the unnormalized last hidden states, float32 ``[tokens, hidden]``), exactly
as the multi-vector kind's hidden-state layout
(:class:`~triton_embed_server.steps.vllm_multivector.TokenEmbeddingEngine`). The three heads
(:class:`~triton_embed_server.steps.hybrid_heads.HybridHeads`, loaded once) then run in
torch on those states, only those a request asks for.

Not vLLM's own ``BgeM3EmbeddingModel``: its dense and sparse heads share one pooling task
(``embed&token_classify``) but ColBERT is another (``token_embed``), so all three outputs of
a text would take two engine calls (two forward passes); its sparse task returns one weight
per token, not per token ID, and leaves the PAD and UNK tokens in.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from triton_embed_server.models.multivector_spec import Layout, MultiVectorSpec
from triton_embed_server.steps.hybrid_config import HybridEncoderConfig
from triton_embed_server.steps.hybrid_heads import HybridHeads


def hidden_state_spec(config: HybridEncoderConfig) -> MultiVectorSpec:
    """The multi-vector spec of the encoder's hidden states (no projection, not normalized)."""
    spec = config.spec
    return MultiVectorSpec(
        layout=Layout.HIDDEN,
        architecture=spec.architecture,
        dim=spec.dim,
        normalize=False,
        max_length=spec.max_length,
    )


class HybridEngine:
    """A vLLM encoder engine giving last hidden states, and the model's heads.

    Attributes:
        heads: the dense, sparse and ColBERT heads (:class:`HybridHeads`).
        vocab_size: the engine's vocabulary (token IDs must be below it).
    """

    def __init__(self, config: HybridEncoderConfig):
        from triton_embed_server.steps.vllm_multivector import TokenEmbeddingEngine

        self.config = config
        self.heads = HybridHeads(config.model_path, config.spec)
        self._encoder = TokenEmbeddingEngine(config, spec=hidden_state_spec(config))
        self.vocab_size = self._encoder.vocab_size

    def close(self) -> None:
        """Shut the engine down now (not left to the garbage collector)."""
        self._encoder.close()

    def hidden_states(self, token_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Last hidden states of pre-tokenized texts, in one engine call.

        Args:
            token_ids: ``n`` texts' token IDs, already validated.

        Returns:
            Per text float32 ``[len(token_ids[i]), dim]``.

        Raises:
            EngineError: the engine failed, or returned a wrong number of texts or rows.
        """
        return self._encoder.embed(token_ids)
