"""Triton Python-backend adapter of a sparse model's engine step: TOKEN_IDS -> SPARSE.

Each model instance (an ``instance_group`` copy, its own stub process) owns one in-process
vLLM pooling engine (:class:`~triton_embed_server.steps.vllm_sparse.SparseEngine`). All
texts of all requests of an ``execute`` call go to the engine in one call; each text's
full-vocabulary weights are cut to the request's ``threshold`` and ``top_k``
(:func:`~triton_embed_server.steps.sparse_vectors.sparsify`) and encoded as one ``SPARSE``
element (:func:`triton_embed.codec.encode_sparse`). A request with bad token IDs or options,
or over the step's token budget, fails alone; a request cancelled by its client before the
engine call is answered ``CANCELLED``
(:class:`~triton_embed_server.steps.adapters.engine_step.EngineStepModel`).
"""

import json

import triton_python_backend_utils as pb_utils
from triton_embed import codec
from triton_embed.sparse_options import SparseOptions

from triton_embed_server.steps.adapters.engine_step import EngineStepModel
from triton_embed_server.steps.batching import split
from triton_embed_server.steps.errors import InvalidArgumentError
from triton_embed_server.steps.sparse_config import SparseEncoderConfig
from triton_embed_server.steps.sparse_vectors import sparsify_all
from triton_embed_server.steps.token_ids import decode_request_token_ids
from triton_embed_server.steps.vllm_sparse import SparseEngine


class TritonPythonModel(EngineStepModel):
    """One vLLM engine per model instance, built once in ``initialize``."""

    step = "sparse_encoder"
    config_class = SparseEncoderConfig
    work = "encoded"

    def start_engine(self, config):
        """The instance's :class:`SparseEngine`."""
        return SparseEngine(config)

    def describe(self) -> str:
        """Model, pooling, vocabulary, dtype and budgets, for the start log line."""
        spec, c = self.config.spec, self.config
        return (
            f"{c.model_path.name}, {spec.architecture}, pooling={spec.pooling}, "
            f"vocab_size={spec.vocab_size}, "
            f"dtype={c.dtype}, max_length={c.max_length}, "
            f"max_request_tokens={c.max_request_tokens}"
        )

    def decode(self, request):
        """One request's token IDs and options, validated.

        Raises:
            EmbedServingError: bad token IDs, an unknown option or a bad value.
        """
        try:
            opts = SparseOptions.from_parameters(json.loads(request.parameters() or "{}"))
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
        return ids, opts

    def engine_call(self, decoded):
        """Every valid text's full-vocabulary weights, one engine call; ``(weights, texts)``."""
        flat = [ids for request_ids, _ in decoded for ids in request_ids]
        return self.engine.weights(flat), len(flat)

    def respond(self, weights, decoded):
        """Per request its ``SPARSE`` elements (indices ascending, then weights)."""
        out = []
        for request_weights, (_, opts) in zip(
            split(weights, [len(ids) for ids, _ in decoded]), decoded, strict=True
        ):
            indices, values = sparsify_all(request_weights, opts.top_k, opts.threshold or 0.0)
            elements = codec.encode_sparse(indices, values).reshape(-1, 1)
            out.append((len(indices), [pb_utils.Tensor("SPARSE", elements)]))
        return out
