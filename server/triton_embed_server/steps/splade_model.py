"""vLLM's SPLADE model, loading the checkpoints ``transformers`` 5 saves and pooling every token.

vLLM 0.32 registers ``BertSpladeSparseEmbeddingModel`` (``model_executor/models/bert.py``): a
BERT encoder whose ``embed`` pooler (``SPLADESparsePooler``) runs the MLM head on each text's
hidden states and returns ``max`` (or ``sum``) over its tokens of ``log1p(relu(logits))``,
one float32 ``[vocab_size]`` vector per text. Served as it is, it differs from
sentence-transformers' ``SparseEncoder`` (``MLMTransformer`` + ``SpladePooling``) in two ways:

* **the MLM decoder's weights**: its loader reads the decoder only from
  ``cls.predictions.decoder.weight`` / ``.bias``, which ``transformers`` 5 does not save
  (the decoder weight is tied to the word embeddings and its bias is saved once, as
  ``cls.predictions.bias``): vLLM then refuses to load ("Following weights were not
  initialized from checkpoint: mlm_head.decoder.weight, mlm_head.decoder.bias").
  :meth:`SpladeForMaskedLM.load_weights` renames the bias and ties the weight, as vLLM's own
  ``BertForMaskedLM`` loader does;
* **special tokens**: the pooler leaves ``[CLS]`` and ``[SEP]`` out when the model's
  ``config.json`` names ``cls_token_id`` / ``sep_token_id``, where ``SpladePooling`` pools
  every token that is not padding. :class:`SpladeForMaskedLM` pools every token.

The pooling strategy comes from the model's ``hf_config`` key ``splade_pooling`` (``max``
or ``sum``), which the engine sets with ``hf_overrides``
(:mod:`triton_embed_server.steps.vllm_sparse`). Imported only inside the engine step's
process, after vLLM: this module subclasses vLLM's classes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.config import PoolerConfig
from vllm.model_executor.layers.pooler import DispatchPooler, Pooler
from vllm.model_executor.models.bert import BertSpladeSparseEmbeddingModel, SPLADESparsePooler

#: The architecture name this model is registered under in vLLM's model registry.
ARCHITECTURE = "TritonEmbedSpladeForMaskedLM"
#: The ``hf_config`` key of the pooling strategy (``max`` or ``sum``).
POOLING_KEY = "splade_pooling"
# transformers 5 saves the MLM decoder's bias here (the decoder's own is tied to it).
_SAVED_BIAS = "cls.predictions.bias"
_DECODER_BIAS = "cls.predictions.decoder.bias"


class SpladeForMaskedLM(BertSpladeSparseEmbeddingModel):
    """``BertSpladeSparseEmbeddingModel`` that pools every token and loads tied MLM heads."""

    def _build_pooler(self, pooler_config: PoolerConfig) -> Pooler:
        built = super()._build_pooler(pooler_config)  # also builds the MLM head when missing
        return DispatchPooler(
            {
                "token_embed": built.poolers_by_task["token_embed"],
                "embed": SPLADESparsePooler(
                    mlm_head=self.mlm_head,
                    cls_token_id=None,
                    sep_token_id=None,
                    pooling=getattr(self.model.config, POOLING_KEY, "max"),
                    remove_cls_sep=False,
                ),
            }
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load a ``BertForMaskedLM`` checkpoint; the decoder bias renamed, its weight tied.

        Returns:
            The names of the parameters loaded (vLLM checks that every one is).
        """
        weights = list(weights)
        names = {name.removeprefix("bert.").removeprefix("model.") for name, _ in weights}
        if _DECODER_BIAS not in names:
            weights = [(_DECODER_BIAS if n == _SAVED_BIAS else n, w) for n, w in weights]
        loaded = super().load_weights(weights)
        if "mlm_head.decoder.weight" not in loaded:
            word = self.model.embeddings.word_embeddings.weight
            decoder = self.mlm_head.decoder.weight
            with torch.no_grad():
                decoder.copy_(word[: decoder.shape[0]])
            loaded.add("mlm_head.decoder.weight")
        return loaded
