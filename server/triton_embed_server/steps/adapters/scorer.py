"""Triton Python-backend adapter of a reranker's scorer step: TOKEN_IDS (+ SEGMENT_START) -> SCORE.

Each model instance (an ``instance_group`` copy, its own stub process) owns one in-process
vLLM pooling engine (:class:`~triton_embed_server.steps.vllm_scorer.ScoringEngine`). All
pairs of all requests of an ``execute`` call go to the engine in one call; the logits are
split back per request and activated unless the request asks for ``raw_scores``. A request
with bad token IDs, segment starts or options, or over the step's token budget, fails
alone; a request cancelled by its client before the engine call is answered ``CANCELLED``
(:class:`~triton_embed_server.steps.adapters.engine_step.EngineStepModel`).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from triton_embed.rerank_options import PairOptions

from triton_embed_server.steps.adapters.engine_step import EngineStepModel
from triton_embed_server.steps.batching import split
from triton_embed_server.steps.errors import InvalidArgumentError
from triton_embed_server.steps.rerank_config import ScorerConfig
from triton_embed_server.steps.token_ids import decode_pair_token_ids
from triton_embed_server.steps.vllm_scorer import ScoringEngine, activate


class TritonPythonModel(EngineStepModel):
    """One vLLM engine per model instance, built once in ``initialize``."""

    step = "scorer"
    config_class = ScorerConfig
    work = "scored"

    def start_engine(self, config):
        """The instance's :class:`ScoringEngine`."""
        return ScoringEngine(config)

    def describe(self) -> str:
        """Model, family, activation, dtype and budget, for the start log line."""
        spec, c = self.config.spec, self.config
        return (
            f"{c.model_path.name}, {spec.architecture}, family={spec.family.value}, "
            f"activation={spec.activation.value}, dtype={c.dtype}, max_length={c.max_length}"
        )

    def decode(self, request):
        """One request's pairs' token IDs, segment starts and options, validated.

        Raises:
            EmbedServingError: bad token IDs or segment starts, or an unknown option.
        """
        try:
            opts = PairOptions.from_parameters(json.loads(request.parameters() or "{}"))
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        payloads = pb_utils.get_input_tensor_by_name(request, "TOKEN_IDS").as_numpy().reshape(-1)
        start_tensor = pb_utils.get_input_tensor_by_name(request, "SEGMENT_START")
        segment_starts = None if start_tensor is None else start_tensor.as_numpy().reshape(-1)
        ids, starts = decode_pair_token_ids(
            [bytes(p) for p in payloads],
            segment_starts,
            self.engine.vocab_size,
            self.config.max_length,
            self.config.max_request_tokens,
        )
        return ids, starts, opts

    def cut(self, decoded, start, end):
        """Pairs ``start:end`` of a decoded request: their token IDs and document starts."""
        ids, starts, opts = decoded
        return ids[start:end], starts[start:end], opts

    def engine_call(self, decoded):
        """Every valid pair's raw logit, one engine call; ``(logits, pairs)``."""
        flat_ids = [ids for request_ids, _, _ in decoded for ids in request_ids]
        flat_starts = [k for _, starts, _ in decoded for k in starts]
        return self.engine.score(flat_ids, flat_starts), len(flat_ids)

    def respond(self, logits, decoded):
        """Per request its ``SCORE`` (activated unless ``raw_scores``), float32 ``[n, 1]``."""
        activation = self.config.spec.activation
        out = []
        for request_logits, (_, _, opts) in zip(
            split(logits, [len(ids) for ids, _, _ in decoded]), decoded, strict=True
        ):
            scores = np.asarray(request_logits, dtype=np.float32)
            if not opts.raw_scores:
                scores = activate(scores, activation)
            tensor = pb_utils.Tensor("SCORE", scores.astype("<f4").reshape(-1, 1))
            out.append((len(scores), [tensor]))
        return out
