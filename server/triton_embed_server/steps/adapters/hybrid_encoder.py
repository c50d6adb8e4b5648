"""Triton Python-backend adapter of a hybrid (BGE-M3) model's engine step: TOKEN_IDS -> 3 heads.

Each model instance (an ``instance_group`` copy, its own stub process) owns one in-process
vLLM pooling engine and the model's heads
(:class:`~triton_embed_server.steps.vllm_hybrid.HybridEngine`). All texts of all requests
of an ``execute`` call go to the encoder in one call (one forward pass per text); then, per
request, only the heads its ``outputs`` parameter asks for run
(:mod:`triton_embed.hybrid_options`):

* ``EMBEDDING``: the dense vector, ``4 x dim`` bytes (:func:`triton_embed.codec.encode_embeddings`);
* ``SPARSE``: the lexical weights cut by ``threshold`` and ``top_k``, as a sparse model's
  (:func:`triton_embed.codec.encode_sparse`);
* ``TOKEN_EMBEDDINGS``: the ColBERT vectors, float32 ``[tokens - 1, colbert_dim]``
  (:func:`triton_embed.codec.encode_token_matrices`).

An output not asked for has one empty element per text. A request with bad token IDs or
options, over the step's token budget or (asking for ``colbert``) over the response cap
fails alone, before any engine work
(:class:`~triton_embed_server.steps.adapters.engine_step.EngineStepModel`).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from triton_embed import codec
from triton_embed.hybrid_options import HEAD_TENSORS, HybridOptions

from triton_embed_server.steps.adapters.engine_step import EngineStepModel
from triton_embed_server.steps.batching import split
from triton_embed_server.steps.errors import InvalidArgumentError
from triton_embed_server.steps.hybrid_config import HybridEncoderConfig
from triton_embed_server.steps.sparse_vectors import keep
from triton_embed_server.steps.token_ids import decode_request_token_ids
from triton_embed_server.steps.token_matrices import check_response_size
from triton_embed_server.steps.vllm_hybrid import HybridEngine


def _empty(n: int) -> np.ndarray:
    """``n`` empty BYTES elements ``[n, 1]`` (an output the request did not ask for)."""
    out = np.empty((n, 1), dtype=object)
    out[:] = b""
    return out


class TritonPythonModel(EngineStepModel):
    """One vLLM engine and the heads per model instance, built once in ``initialize``."""

    step = "hybrid_encoder"
    config_class = HybridEncoderConfig
    work = "encoded"

    def start_engine(self, config):
        """The instance's :class:`HybridEngine`."""
        return HybridEngine(config)

    def describe(self) -> str:
        """Model, dimensions, vocabulary, dtype and budgets, for the start log line."""
        spec, c = self.config.spec, self.config
        return (
            f"{c.model_path.name}, {spec.architecture}, dim={spec.dim}, "
            f"colbert_dim={spec.colbert_dim}, vocab_size={spec.vocab_size}, "
            f"skipped_token_ids={list(spec.skipped_token_ids)}, dtype={c.dtype}, "
            f"max_length={c.max_length}, max_request_tokens={c.max_request_tokens}, "
            f"max_response_bytes={c.max_response_bytes}"
        )

    def decode(self, request):
        """One request's token IDs and options, validated; ColBERT within the response cap.

        Raises:
            EmbedServingError: bad token IDs, an unknown option or a bad value, or ColBERT
                vectors over ``max_response_bytes``.
        """
        try:
            opts = HybridOptions.from_parameters(json.loads(request.parameters() or "{}"))
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        payloads = pb_utils.get_input_tensor_by_name(request, "TOKEN_IDS").as_numpy().reshape(-1)
        ids, _ = decode_request_token_ids(
            [bytes(p) for p in payloads],
            self.engine.vocab_size,
            self.config.max_length,
            max_chunks=1,
            max_request_tokens=self.config.max_request_tokens,
            step=self.step,
        )
        if "colbert" in opts.heads:
            rows = [len(x) - 1 for x in ids]  # ColBERT leaves the CLS token out
            spec, cap = self.config.spec, self.config.max_response_bytes
            check_response_size(rows, spec.colbert_dim, cap, "hybrid encoder", "ColBERT rows")
        return ids, opts

    def engine_call(self, decoded):
        """Every valid text's last hidden states, one engine call; ``(states, texts)``."""
        flat = [ids for request_ids, _ in decoded for ids in request_ids]
        return self.engine.hidden_states(flat), len(flat)

    def respond(self, states, decoded):
        """Per request its three outputs; the heads it did not ask for empty."""
        heads = self.engine.heads
        out = []
        for request_states, (ids, opts) in zip(
            split(states, [len(x) for x, _ in decoded]), decoded, strict=True
        ):
            n = len(ids)
            tensors = {name: _empty(n) for name in HEAD_TENSORS.values()}
            if "dense" in opts.heads:
                vectors = heads.dense(request_states)
                tensors["EMBEDDING"] = codec.encode_embeddings(vectors).reshape(-1, 1)
            if "sparse" in opts.heads:
                pairs = [
                    keep(*heads.sparse(h, t), opts.top_k, opts.threshold or 0.0)
                    for h, t in zip(request_states, ids, strict=True)
                ]
                elements = codec.encode_sparse([i for i, _ in pairs], [v for _, v in pairs])
                tensors["SPARSE"] = elements.reshape(-1, 1)
            if "colbert" in opts.heads:
                matrices = [heads.colbert(h) for h in request_states]
                tensors["TOKEN_EMBEDDINGS"] = codec.encode_token_matrices(matrices).reshape(-1, 1)
            out.append((n, [pb_utils.Tensor(k, v) for k, v in tensors.items()]))
        return out
