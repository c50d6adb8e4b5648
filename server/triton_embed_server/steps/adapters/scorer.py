"""Triton Python-backend adapter of a reranker's scorer step: TOKEN_IDS (+ SEGMENT_START) -> SCORE.

Each model instance (an ``instance_group`` copy, its own stub process) owns one in-process
vLLM pooling engine (:class:`~triton_embed_server.steps.vllm_scorer.ScoringEngine`). All
pairs of all requests of an ``execute`` call go to the engine in one call; the logits are
split back per request and activated unless the request asks for ``raw_scores``. A request
with bad token IDs, segment starts or options, or over the step's token budget, fails
alone; a request cancelled by its client before the engine call is answered ``CANCELLED``.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils
from triton_embed.rerank_options import PairOptions

from triton_embed_server.host.doctor import host_plan
from triton_embed_server.host.placement.apply import apply_placement
from triton_embed_server.host.placement.instance import decide_placement, instance_index
from triton_embed_server.steps.batching import split
from triton_embed_server.steps.errors import (
    CancelledError,
    EmbedServingError,
    InvalidArgumentError,
    to_triton_error,
)
from triton_embed_server.steps.metrics import InstanceReporter, StepMetrics
from triton_embed_server.steps.rerank_config import ScorerConfig
from triton_embed_server.steps.token_ids import decode_pair_token_ids
from triton_embed_server.steps.vllm_scorer import ScoringEngine, activate


class TritonPythonModel:
    """One vLLM engine per model instance, built once in ``initialize``."""

    def initialize(self, args):
        """Parse the config, place this replica (NUMA node, CPUs, GPU), start its engine."""
        self.config = ScorerConfig.from_args(args)
        name = args["model_instance_name"]
        if self.config.dtype_note:
            pb_utils.Logger.log_warn(f"scorer {name}: {self.config.dtype_note}")
        placement = decide_placement(
            self.config,
            args.get("model_instance_kind", "CPU"),
            instance_index(name),
            int(args.get("model_instance_device_id", 0) or 0),
            auto_plan=host_plan,
        )
        placement = apply_placement(placement)
        self.engine = ScoringEngine(self.config)
        self.metrics = StepMetrics(pb_utils, "scorer", name)
        self.reporter = InstanceReporter(
            self.metrics,
            list(placement.numa_nodes),
            placement.labels(),
            hourly_price_usd=self.config.hourly_price_usd / self.config.instances_per_device,
            window_s=self.config.cost_window_s,
        )
        spec = self.config.spec
        pb_utils.Logger.log_info(
            f"scorer {name}: {self.config.model_path.name}, {spec.architecture}, "
            f"family={spec.family.value}, activation={spec.activation.value}, "
            f"dtype={self.config.dtype}, max_length={self.config.max_length}, "
            f"{placement.describe()}, env={placement.env or 'vLLM default'}"
        )

    def execute(self, requests):
        """Validate per request, score all valid pairs in one engine call, split back."""
        self.metrics.ensure_started()  # not in initialize (StepMetrics.start says why)
        responses = [None] * len(requests)
        valid, token_ids, starts, options = [], [], [], []
        for r, request in enumerate(requests):
            try:
                if request.is_cancelled():
                    raise CancelledError("the request was cancelled before it was scored")
                ids, segment_starts, opts = self._decode(request)
            except EmbedServingError as exc:
                self.metrics.failure(exc)
                responses[r] = pb_utils.InferenceResponse(error=to_triton_error(exc, pb_utils))
                continue
            valid.append(r)
            token_ids.append(ids)
            starts.append(segment_starts)
            options.append(opts)
        flat_ids = [ids for request_ids in token_ids for ids in request_ids]
        flat_starts = [k for request_starts in starts for k in request_starts]
        t0 = time.perf_counter()
        try:
            logits = self.engine.score(flat_ids, flat_starts)
        except EmbedServingError as exc:
            self.metrics.execute_done(time.perf_counter() - t0, 0, 0)
            error = to_triton_error(exc, pb_utils)
            for r in valid:
                self.metrics.failure(exc)
                responses[r] = pb_utils.InferenceResponse(error=error)
            return responses
        per_request_tokens = [sum(len(x) for x in ids) for ids in token_ids]
        tokens = sum(per_request_tokens)
        self.metrics.execute_done(time.perf_counter() - t0, len(flat_ids), tokens)
        self.reporter.add_tokens(tokens)
        activation = self.config.spec.activation
        for r, request_logits, opts, n_tokens in zip(
            valid, split(logits, [len(ids) for ids in token_ids]), options, per_request_tokens,
            strict=True,
        ):  # fmt: skip
            scores = np.asarray(request_logits, dtype=np.float32)
            if not opts.raw_scores:
                scores = activate(scores, activation)
            self.metrics.success(texts=len(scores), tokens=n_tokens)
            tensor = pb_utils.Tensor("SCORE", scores.astype("<f4").reshape(-1, 1))
            responses[r] = pb_utils.InferenceResponse(output_tensors=[tensor])
        return responses

    def _decode(self, request):
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

    def finalize(self):
        """Free the metric families while the stub can still reach Triton.

        Freeing them at interpreter exit crashes the Triton 2.51 stub.
        """
        self.metrics.stop()
        self.reporter = self.metrics = None
