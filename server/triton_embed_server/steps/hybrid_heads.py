"""BGE-M3's three heads on a text's last hidden states: dense, sparse, ColBERT.

Plain torch, no Triton, no vLLM: the hybrid engine step runs the encoder once (vLLM's
``token_embed`` task, the unnormalized last hidden states) and calls :class:`HybridHeads`
for the heads a request asks for. Float32 matmuls on the step's CPU threads. The formulas
are FlagEmbedding's (``BGEM3Model._dense_embedding``, ``_sparse_embedding``,
``_colbert_embedding`` and ``BGEM3FlagModel``'s post-processing), restated in
:mod:`triton_embed_server.models.hybrid_spec`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from triton_embed_server.models.hybrid_spec import COLBERT_FILE, SPARSE_FILE, HybridSpec


class HybridHeads:
    """The ``colbert_linear`` and ``sparse_linear`` heads of one model, loaded once.

    Args:
        folder: the model folder holding :data:`~triton_embed_server.models.hybrid_spec.
            COLBERT_FILE` and ``SPARSE_FILE``.
        spec: the model's facts (dimensions, the token IDs the sparse output skips).
    """

    def __init__(self, folder: Path, spec: HybridSpec):
        import torch

        def linear(file: str) -> tuple[torch.Tensor, torch.Tensor]:
            state = torch.load(Path(folder) / file, map_location="cpu", weights_only=True)
            return state["weight"].float().contiguous(), state["bias"].float().contiguous()

        self.spec = spec
        self._colbert_w, self._colbert_b = linear(COLBERT_FILE)
        self._sparse_w, self._sparse_b = linear(SPARSE_FILE)
        self._skipped = torch.tensor(spec.skipped_token_ids, dtype=torch.int64)

    def dense(self, hidden: Sequence[np.ndarray]) -> np.ndarray:
        """The dense vectors: each text's first (CLS) hidden state, L2-normalized.

        Args:
            hidden: per text float32 ``[tokens, dim]`` last hidden states.

        Returns:
            float32 ``[n, dim]``, unit rows.
        """
        import torch

        if not hidden:
            return np.zeros((0, self.spec.dim), dtype=np.float32)
        cls = torch.from_numpy(np.stack([np.asarray(h[0], dtype=np.float32) for h in hidden]))
        return torch.nn.functional.normalize(cls, dim=-1).numpy()

    def sparse(self, hidden: np.ndarray, token_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """One text's lexical weights: per token ID the largest ``relu(sparse_linear(h))``.

        Args:
            hidden: float32 ``[tokens, dim]`` last hidden states.
            token_ids: the text's ``tokens`` token IDs.

        Returns:
            ``(indices, values)``: int32 ``[k]`` ascending token IDs (the skipped special
            tokens left out, weights > 0 only) and float32 ``[k]`` weights.
        """
        import torch

        h = torch.from_numpy(np.asarray(hidden, dtype=np.float32))
        weights = torch.relu(h @ self._sparse_w.T + self._sparse_b)[:, 0]
        ids = torch.as_tensor(list(token_ids), dtype=torch.int64)
        keep = (weights > 0) & ~torch.isin(ids, self._skipped)
        ids, weights = ids[keep], weights[keep]
        unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        best = torch.zeros(unique.shape[0], dtype=torch.float32)
        best = best.scatter_reduce(0, inverse, weights, reduce="amax", include_self=False)
        return unique.numpy().astype(np.int32), best.numpy()

    def colbert(self, hidden: np.ndarray) -> np.ndarray:
        """One text's ColBERT vectors: ``colbert_linear(h[1:])``, each row L2-normalized.

        Args:
            hidden: float32 ``[tokens, dim]`` last hidden states.

        Returns:
            float32 ``[tokens - 1, colbert_dim]`` (the CLS token left out), unit rows.
        """
        import torch

        h = torch.from_numpy(np.asarray(hidden, dtype=np.float32)[1:])
        vectors = h @ self._colbert_w.T + self._colbert_b
        return np.ascontiguousarray(torch.nn.functional.normalize(vectors, dim=-1).numpy())
