"""Triton Python-backend adapter of a multi-vector model's engine step: TOKEN_IDS -> vectors.

Each model instance (an ``instance_group`` copy, its own stub process) owns one in-process
vLLM pooling engine (:class:`~triton_embed_server.steps.vllm_multivector.TokenEmbeddingEngine`;
with the queries of a model that leaves the ``[MASK]`` expansion out as keys on its
``transformers`` encoder, :mod:`~triton_embed_server.steps.masked_queries`).
All texts of all requests of an ``execute`` call go to the engine in one call; each text's
``[rows, dim]`` float32 matrix is one ``TOKEN_EMBEDDINGS`` element
(:func:`triton_embed.codec.encode_token_matrices`) and its row count the text's
``NUM_TOKENS``: the tokens read, less a document's skipped punctuation rows
(:meth:`~triton_embed_server.models.multivector_spec.MultiVectorSpec.kept_rows`). A request
with bad token IDs or options, over the step's token budget or over the response cap
(``max_response_bytes``: ``4 x rows x dim`` over its texts) fails alone, before any engine
work; a request cancelled by its client before the engine call is answered ``CANCELLED``
(:class:`~triton_embed_server.steps.adapters.engine_step.EngineStepModel`).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from triton_embed import codec
from triton_embed.multivector_options import MultiVectorOptions

from triton_embed_server.steps.adapters.engine_step import EngineStepModel
from triton_embed_server.steps.batching import split
from triton_embed_server.steps.errors import InvalidArgumentError
from triton_embed_server.steps.multivector_config import TokenEncoderConfig
from triton_embed_server.steps.token_ids import decode_request_token_ids
from triton_embed_server.steps.token_matrices import check_response_size
from triton_embed_server.steps.vllm_multivector import TokenEmbeddingEngine

#: What the start log line adds for a model whose reference leaves the [MASK] tokens out as keys.
_MASKS_LEFT_OUT = (
    " (queries embedded by transformers on the same weights, the [MASK] expansion left out "
    "as keys as the reference does; documents on vLLM; docs/sparse.md)"
)


class TritonPythonModel(EngineStepModel):
    """One vLLM engine per model instance, built once in ``initialize``."""

    step = "token_encoder"
    config_class = TokenEncoderConfig
    work = "encoded"

    def start_engine(self, config):
        """The instance's :class:`TokenEmbeddingEngine`."""
        return TokenEmbeddingEngine(config)

    def describe(self) -> str:
        """Model, layout, dimension, dtype and budgets, for the start log line."""
        spec, c = self.config.spec, self.config
        return (
            f"{c.model_path.name}, {spec.architecture}, layout={spec.layout.value}, "
            f"dim={spec.dim}, normalize={spec.normalize}, query_length={spec.query_length}, "
            f"attend_expansion={spec.attend_expansion}{_MASKS_LEFT_OUT * spec.masks_expansion}, "
            f"dtype={c.dtype}, max_length={c.max_length}, "
            f"max_request_tokens={c.max_request_tokens}, "
            f"max_response_bytes={c.max_response_bytes}"
        )

    def decode(self, request):
        """One request's token IDs and ``input_type``, validated, within the response cap.

        Raises:
            EmbedServingError: bad token IDs, an unknown option or a bad value, or a response
                over ``max_response_bytes``.
        """
        try:
            opts = MultiVectorOptions.from_parameters(json.loads(request.parameters() or "{}"))
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
        spec, side = self.config.spec, opts.side
        kept = [spec.kept_rows(x, side) for x in ids]
        rows = [len(x) if k is None else int(k.sum()) for x, k in zip(ids, kept, strict=True)]
        check_response_size(rows, spec.dim, self.config.max_response_bytes)
        return ids, side

    def engine_call(self, decoded):
        """Every valid text's token vectors, one engine call; ``(matrices, texts)``."""
        flat = [ids for request_ids, _ in decoded for ids in request_ids]
        sides = [side for request_ids, side in decoded for _ in request_ids]
        return self.engine.embed(flat, sides), len(flat)

    def respond(self, matrices, decoded):
        """Per request ``TOKEN_EMBEDDINGS`` (float32 ``[rows, dim]`` each) and ``NUM_TOKENS``."""
        out = []
        for request_matrices in split(matrices, [len(ids) for ids, _ in decoded]):
            elements = codec.encode_token_matrices(request_matrices).reshape(-1, 1)
            rows = np.array([[len(m)] for m in request_matrices], dtype=np.int32)
            tensors = [
                pb_utils.Tensor("TOKEN_EMBEDDINGS", elements),
                pb_utils.Tensor("NUM_TOKENS", rows),
            ]
            out.append((len(request_matrices), tensors))
        return out
