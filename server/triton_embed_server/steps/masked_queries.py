"""Where a ColBERT query is embedded with its ``[MASK]`` expansion left out as attention keys.

Both references run a query with an attention mask that leaves the ``[MASK]`` tokens of query
augmentation out as **keys** when the model says so (PyLate's ``attend_to_expansion_tokens``,
Stanford's ``attend_to_mask_tokens``, both false by default): every position is still a
query of attention and every row is served, so a ``[MASK]`` row is the encoder's reading of
the real tokens, not of itself or of the other masks
(:meth:`~triton_embed_server.models.multivector_spec.MultiVectorSpec.query_key_mask`).
vLLM 0.32's encoder attention has no per-token mask (each token attends to every token of
its sequence), and no vLLM call gives those rows.

So a token engine whose spec
:attr:`~triton_embed_server.models.multivector_spec.MultiVectorSpec.masks_expansion` embeds
its **queries** here (documents stay on vLLM): the same weights, loaded once per instance by
``transformers``' ``AutoModel`` (the checkpoint's encoder: a Stanford checkpoint's ``bert.``
prefix is stripped and its ``linear`` left to the head), one forward pass with the
reference's attention mask, then the engine's own vLLM token-embedding head (the projection
and the L2 normalization per token the documents get: the same module, taken from the
engine's model).

dtype: vLLM's resolved ``model_config.dtype``, so a query's rows and a document's come from
the same precision (float32 on CPU, as ``repository add`` writes this kind; float16, bfloat16
or float32 on GPU), except float16 on CPU, which runs float32 (torch has no fast float16
matrix kernels on CPU). Device: the engine model's. Work: queries go in forward passes of at
most ``max_num_batched_tokens`` token positions (the engine's own step budget), each pass
padded to its longest query (the padding left out as keys, its rows dropped); a query is
``query_length`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from triton_embed_server.models.multivector_spec import MultiVectorSpec
from triton_embed_server.steps.errors import EngineError

#: What a start error says to do when the query encoder cannot be built.
_WAY_OUT = (
    "the model leaves its queries' [MASK] expansion out as attention keys, which vLLM cannot; "
    "fix the folder, or set the token encoder's parameter attend_expansion to true to embed "
    "its queries on vLLM with the expansion attended (they then differ from the reference's; "
    "docs/sparse.md)"
)


def token_head(model: Any) -> tuple[Any, Any]:
    """The ``token_embed`` head of a vLLM pooling model and the model's device.

    Run inside the engine (``LLM.apply_model``): the pooler is the model's ``pooler``, or
    its ``token_embed`` entry when it dispatches by task; the head is its ``head``
    (``TokenEmbeddingPoolerHead``: head dtype, projector, normalization).

    Returns:
        ``(head, device)``; ``head`` is ``None`` when the model has no such pooler.
    """
    pooler = getattr(model, "pooler", None)
    pooler = getattr(pooler, "poolers_by_task", {}).get("token_embed", pooler)
    head = getattr(pooler, "head", None)
    return (head if hasattr(head, "forward_chunk") else None), next(model.parameters()).device


def query_passes(lengths: Sequence[int], budget_tokens: int) -> list[list[int]]:
    """Texts grouped into forward passes of at most ``budget_tokens`` padded positions.

    Args:
        lengths: each query's token count.
        budget_tokens: the most ``texts x longest`` one pass may hold; a text longer than
            it gets a pass of its own.

    Returns:
        Lists of indices into ``lengths``, in order, every index once.
    """
    passes: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(width, n) > budget_tokens:
            passes.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, n)
    if current:
        passes.append(current)
    return passes


class MaskedQueryEncoder:
    """A ``transformers`` encoder of the engine's weights for a model's queries (docstring).

    Attributes:
        texts: queries embedded here since the start (what the tests read to see which path
            ran).
        dtype: the torch dtype the encoder runs.
    """

    def __init__(
        self,
        path: Path,
        spec: MultiVectorSpec,
        head: Any,
        params: Any,
        device: Any,
        dtype: Any,
        budget_tokens: int,
        trust_remote_code: bool = False,
    ):
        """Load the encoder (once per model instance).

        Args:
            path: the model folder.
            spec: the model's facts (its mask token).
            head: the engine's vLLM token-embedding head (:func:`token_head`).
            params: the engine's ``PoolingParams`` (normalization on).
            device: the engine model's torch device.
            dtype: the engine's torch dtype (float16 on CPU runs float32).
            budget_tokens: the most token positions of one forward pass.
            trust_remote_code: the engine's (``transformers`` runs the folder's code only
                where vLLM was allowed to).

        Raises:
            EngineError: ``transformers`` cannot build the encoder from the folder, or the
                checkpoint lacks some of its weights (names them).
        """
        import torch
        from transformers import AutoModel

        if dtype == torch.float16 and torch.device(device).type == "cpu":
            dtype = torch.float32
        try:
            model, info = AutoModel.from_pretrained(
                str(path),
                dtype=dtype,
                output_loading_info=True,
                trust_remote_code=trust_remote_code,
            )
        except Exception as exc:  # the folder is the one vLLM loaded: name what failed
            raise EngineError(
                f"{path}: transformers could not load the encoder of the model's queries "
                f"({type(exc).__name__}: {exc}); {_WAY_OUT}"
            ) from exc
        missing = [k for k in info.get("missing_keys", ()) if not k.startswith("pooler.")]
        if missing:
            raise EngineError(
                f"{path}: the checkpoint has no {', '.join(sorted(missing)[:5])} for the "
                f"encoder of the model's queries ({len(missing)} weights missing); {_WAY_OUT}"
            )
        self.model = model.to(device).eval()
        self.spec, self.head, self.params = spec, head, params
        self.device, self.dtype, self.budget_tokens = device, dtype, budget_tokens
        self.texts = 0

    def embed(self, token_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Queries' token vectors with the reference's attention mask.

        Args:
            token_ids: ``n`` queries' token IDs, already validated (markers and ``[MASK]``
                expansion in).

        Returns:
            Per query float32 ``[tokens, dim]``, one row per token, each as the engine's
            head makes it (projected, L2-normalized).

        Raises:
            EngineError: the forward pass or the head failed.
        """
        out: list[np.ndarray] = [np.empty((0, 0), np.float32)] * len(token_ids)
        try:
            for chunk in query_passes([len(x) for x in token_ids], self.budget_tokens):
                for i, matrix in zip(chunk, self._pass([token_ids[i] for i in chunk]), strict=True):
                    out[i] = matrix
        except Exception as exc:  # the forward pass's own failure, reported per request
            raise EngineError(f"the query encoder failed: {type(exc).__name__}: {exc}") from exc
        self.texts += len(token_ids)
        return out

    def _pass(self, token_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One forward pass over queries padded to the longest; per query float32 rows."""
        import torch

        width = max(len(x) for x in token_ids)
        ids = torch.zeros((len(token_ids), width), dtype=torch.long)
        keys = torch.zeros((len(token_ids), width), dtype=torch.long)  # padding: no key
        for row, text in enumerate(token_ids):
            ids[row, : len(text)] = torch.as_tensor(list(text), dtype=torch.long)
            keys[row, : len(text)] = torch.from_numpy(self.spec.query_key_mask(text))
        with torch.inference_mode():
            hidden = self.model(
                input_ids=ids.to(self.device), attention_mask=keys.to(self.device)
            ).last_hidden_state
            rows = [
                self.head.forward_chunk(hidden[row, : len(text)], self.params)
                for row, text in enumerate(token_ids)
            ]
        return [np.ascontiguousarray(r.to("cpu").float().numpy()) for r in rows]
