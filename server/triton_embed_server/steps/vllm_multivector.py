"""Where a multi-vector model's engine is called: one in-process vLLM pooling engine per instance.

The engine is fed token IDs only (``TokensPrompt``; the tokenizer step put the markers and
the query's mask tokens in) and runs vLLM's ``token_embed`` pooling task: per text, one
vector per token, float32 ``[tokens, dim]``.

* A Stanford ``HF_ColBERT`` checkpoint is vLLM's own ``ColBERTModel``
  (``model_executor/models/colbert.py``): the BERT encoder, the checkpoint's ``linear``
  projection, then L2 normalization per token (the pooler's activation).
* A PyLate folder is served by its transformer's architecture (``BertModel``...), whose
  ``token_embed`` pooler loads the PyLate ``Dense`` projection from ``1_Dense``
  (``_load_st_projector``) and normalizes the same way.
* Hidden states (``--kind multivector`` on a dense model): the same pooler with nothing to
  project; the activation is off (``PoolingParams(use_activation=False)``), so the vectors
  are the last hidden states as they are, as TEI's ``/embed_all`` returns them.

The engine checks that the vectors have the spec's ``dim`` values: a projection vLLM failed to
load (it logs and goes on without one) would otherwise give hidden-size vectors.

A ColBERT model whose reference leaves a query's ``[MASK]`` expansion out as attention keys
(:attr:`~triton_embed_server.models.multivector_spec.MultiVectorSpec.masks_expansion`) has
its **queries** embedded by :class:`~triton_embed_server.steps.masked_queries.
MaskedQueryEncoder` (``transformers`` on the same weights, then this engine's own head);
its documents, and every text of the other models, go to vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from triton_embed_server.models.multivector_spec import Layout, MultiVectorSpec
from triton_embed_server.steps.errors import EngineError
from triton_embed_server.steps.multivector_config import TokenEncoderConfig
from triton_embed_server.steps.vllm_engine import LEGACY_KV_ENV


def multivector_llm_kwargs(config: TokenEncoderConfig) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM``: the engine's; a PyLate folder's length allowed.

    PyLate saves its transformer's ``max_seq_length`` one below the document length (it
    inserts the marker after tokenizing), and vLLM refuses a ``max_model_len`` above a
    folder's ``max_seq_length`` unless ``hf_config.model_max_length`` allows it: the override
    states the document length, which the marker brings back. An ``hf_overrides`` in the
    step's ``engine_args`` wins.
    """
    kwargs = config.llm_kwargs()
    if config.spec is not None and config.spec.layout is Layout.PYLATE:
        kwargs.setdefault("hf_overrides", {"model_max_length": config.max_length})
    return kwargs


class TokenEmbeddingEngine:
    """A vLLM ``LLM`` with the pooling runner, one vector per token of token-ID texts."""

    def __init__(self, config: TokenEncoderConfig, spec: MultiVectorSpec | None = None):
        """Start the engine (one per model instance).

        Args:
            config: the step's config (its engine fields; its ``spec`` unless ``spec``).
            spec: the facts to serve instead of ``config.spec``: another kind's engine
                (the hybrid encoder) asks for the hidden-state layout of its encoder.

        Raises:
            EngineError: a legacy KV-cache variable is set, or the engine's vectors do not
                have the spec's ``dim`` values.
        """
        from vllm import LLM, PoolingParams
        from vllm.config import PoolerConfig

        legacy = os.environ.get(LEGACY_KV_ENV, "")
        if legacy:  # vllm/platforms/cpu.py: it would replace kv_cache_memory_bytes silently
            raise EngineError(
                f"{LEGACY_KV_ENV}={legacy[:20]!r} is set and would override the step's "
                "kv_cache_bytes parameter; unset it and set kv_cache_bytes in the model config"
            )
        self.config = config
        self.spec = spec or config.spec
        kwargs = multivector_llm_kwargs(config) if spec is None else config.llm_kwargs()
        kwargs.setdefault("pooler_config", PoolerConfig(task="token_embed"))
        self._llm = LLM(**kwargs)
        self._params = PoolingParams(use_activation=self.spec.normalize)
        model_config = self._llm.llm_engine.model_config
        self.vocab_size = int(model_config.get_vocab_size())
        self.dim = self.spec.dim
        #: The query encoder of a model that leaves the [MASK] expansion out as keys, or None.
        self.masked_queries = None
        probe = self.embed([[0, 0]])[0]
        if probe.shape[1] != self.dim:
            raise EngineError(
                f"the engine returned token vectors of {probe.shape[1]} values; the model's "
                f"spec says dim={self.dim} (a projection vLLM did not load?); check the "
                "model folder's projection weights"
            )
        if self.spec.masks_expansion:
            self.masked_queries = self._masked_queries(model_config)

    def _masked_queries(self, model_config: Any) -> Any:
        """The query encoder of a model that leaves the ``[MASK]`` expansion out as keys.

        Raises:
            EngineError: the engine's model has no ``token_embed`` head, or the encoder
                cannot be loaded (:class:`~triton_embed_server.steps.masked_queries.
                MaskedQueryEncoder`).
        """
        from triton_embed_server.steps.masked_queries import MaskedQueryEncoder, token_head

        head, device = self._llm.apply_model(token_head)[0]
        if head is None:
            raise EngineError(
                "the engine's model has no token_embed pooler head to project the queries "
                "with (vLLM's layout changed?); the model's queries need it"
            )
        return MaskedQueryEncoder(
            self.config.model_path,
            self.spec,
            head,
            self._params,
            device,
            model_config.dtype,
            self.config.max_num_batched_tokens,
            trust_remote_code=bool(model_config.trust_remote_code),
        )

    def close(self) -> None:
        """Shut the engine down now (not left to the garbage collector)."""
        self._llm.llm_engine.engine_core.shutdown()

    def embed(
        self, token_ids: Sequence[Sequence[int]], input_types: Sequence[str] | None = None
    ) -> list[np.ndarray]:
        """Token vectors of pre-tokenized texts, in one vLLM call (and one query encoder call).

        The queries of a model that leaves its ``[MASK]`` expansion out as keys go to
        :attr:`masked_queries` (the module docstring); every other text goes to vLLM.

        Args:
            token_ids: ``n`` texts' token IDs, already validated.
            input_types: per text ``query`` or ``document`` (``None``: all documents); a
                document leaves out the rows of the spec's ``skiplist`` tokens
                (:meth:`~triton_embed_server.models.multivector_spec.MultiVectorSpec.
                kept_rows`, ColBERT's punctuation).

        Returns:
            Per text float32 ``[rows, dim]``: L2-normalized rows for ColBERT, the last hidden
            states for the hidden-state layout; ``rows`` is ``len(token_ids[i])`` less a
            document's skipped tokens.

        Raises:
            EngineError: the engine failed, or returned a wrong number of texts or rows.
        """
        if not token_ids:
            return []
        sides = input_types if input_types is not None else ["document"] * len(token_ids)
        masked = [self.masked_queries is not None and side == "query" for side in sides]
        queries = [i for i, m in enumerate(masked) if m]
        rest = [i for i, m in enumerate(masked) if not m]
        matrices: list[Any] = [None] * len(token_ids)
        for i, matrix in zip(rest, self._vllm_rows([token_ids[i] for i in rest]), strict=True):
            matrices[i] = matrix
        if queries:
            found = self.masked_queries.embed([token_ids[i] for i in queries])
            for i, matrix in zip(queries, found, strict=True):
                matrices[i] = matrix
        out = []
        for ids, side, matrix in zip(token_ids, sides, matrices, strict=True):
            if matrix.ndim != 2 or matrix.shape[0] != len(ids):
                raise EngineError(
                    f"the engine returned {matrix.shape} token vectors for a text of "
                    f"{len(ids)} tokens"
                )
            kept = self.spec.kept_rows(ids, side)
            matrix = matrix if kept is None else matrix[kept]
            out.append(np.ascontiguousarray(matrix, dtype=np.float32))
        return out

    def _vllm_rows(self, token_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Per text float32 ``[tokens, dim]`` from one vLLM call (``[]`` for no texts).

        Raises:
            EngineError: the engine failed, or returned a wrong number of texts.
        """
        if not token_ids:
            return []
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in token_ids]
        try:
            outputs = self._llm.encode(
                prompts, pooling_params=self._params, use_tqdm=False, pooling_task="token_embed"
            )
        except Exception as exc:  # the engine's own failure, reported per request
            raise EngineError(f"the token engine failed: {type(exc).__name__}: {exc}") from exc
        if len(outputs) != len(prompts):
            raise EngineError(f"the engine returned {len(outputs)} texts for {len(prompts)}")
        return [output.outputs.data.to("cpu").float().numpy() for output in outputs]
