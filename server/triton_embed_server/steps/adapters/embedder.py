"""Triton Python-backend adapter of the ``embedder`` step: TOKEN_IDS (+ WINDOWS) -> EMBEDDING.

Each model instance (an ``instance_group`` copy, its own stub process) owns one in-process
vLLM pooling engine. All windows of all requests of an ``execute`` call go to the engine in
one call; the vectors are split back per request, normalized, averaged per text
(``truncation=CHUNK``), cut to the request's ``dimensions`` and encoded as its
``embedding_type``; ``normalize=false`` keeps the pooled vectors un-normalized. A request
with bad token IDs or options, or over the step's budget (``max_chunks`` windows per text,
``max_request_tokens`` per request), fails alone; a request cancelled by its client before
the engine call (``request.is_cancelled()``) is answered ``CANCELLED`` and not embedded.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils
from triton_embed import codec
from triton_embed.options import DEFAULT_EMBEDDING_TYPE, RequestOptions

from triton_embed_server.host.doctor import host_plan
from triton_embed_server.host.placement.apply import apply_placement
from triton_embed_server.host.placement.instance import decide_placement, instance_index
from triton_embed_server.steps.batching import split
from triton_embed_server.steps.config import EmbedderConfig
from triton_embed_server.steps.errors import (
    CancelledError,
    EmbedServingError,
    InvalidArgumentError,
    to_triton_error,
)
from triton_embed_server.steps.metrics import InstanceReporter, StepMetrics
from triton_embed_server.steps.token_ids import decode_request_token_ids
from triton_embed_server.steps.vectors import cut_dimensions, text_vectors
from triton_embed_server.steps.vllm_engine import PoolingEngine


class TritonPythonModel:
    """One vLLM engine per model instance, built once in ``initialize``."""

    def initialize(self, args):
        """Parse the config, place this replica (NUMA node, CPUs, GPU), start its engine."""
        self.config = EmbedderConfig.from_args(args)
        name = args["model_instance_name"]
        if self.config.dtype_note:  # bfloat16 asked for on CPUs without its instructions
            pb_utils.Logger.log_warn(f"embedder {name}: {self.config.dtype_note}")
        # Where this replica runs (numa_placement): decided once, applied before vLLM/torch
        # start their threads, which inherit the CPU and memory binding.
        placement = decide_placement(
            self.config,
            args.get("model_instance_kind", "CPU"),
            instance_index(name),
            int(args.get("model_instance_device_id", 0) or 0),
            auto_plan=host_plan,
        )
        placement = apply_placement(placement)
        self.engine = PoolingEngine(self.config)
        self.spec = self.engine.spec
        self.metrics = StepMetrics(pb_utils, "embedder", name)
        self.reporter = InstanceReporter(
            self.metrics,
            list(placement.numa_nodes),
            placement.labels(),
            hourly_price_usd=self.config.hourly_price_usd / self.config.instances_per_device,
            window_s=self.config.cost_window_s,
        )
        pb_utils.Logger.log_info(
            f"embedder {name}: {self.config.model_path.name}, dtype={self.config.dtype}, "
            f"dim={self.engine.dim}, "
            f"pooling={self.spec.pooling.value}, normalize={self.spec.normalize}, "
            f"max_length={self.config.max_length}, max_chunks={self.config.max_chunks}, "
            f"max_request_tokens={self.config.max_request_tokens}, {placement.describe()}, "
            f"env={placement.env or 'vLLM default'}"
        )

    def execute(self, requests):
        """Validate per request, embed all valid windows in one engine call, split back."""
        self.metrics.ensure_started()  # not in initialize (StepMetrics.start says why)
        responses = [None] * len(requests)
        valid, token_ids, windows, options = [], [], [], []
        for r, request in enumerate(requests):
            try:
                if request.is_cancelled():
                    raise CancelledError("the request was cancelled before it was embedded")
                ids, text_windows, opts = self._decode(request)
            except EmbedServingError as exc:
                self.metrics.failure(exc)
                responses[r] = pb_utils.InferenceResponse(error=to_triton_error(exc, pb_utils))
                continue
            valid.append(r)
            token_ids.append(ids)
            windows.append(text_windows)
            options.append(opts)
        flat_windows, skips = [], []
        for ids, text_windows in zip(token_ids, windows, strict=True):
            for text, per_text in zip(ids, text_windows, strict=True):
                start = 0
                for n, skip, _ in per_text:
                    flat_windows.append(text[start : start + n])
                    skips.append(skip)
                    start += n
        t0 = time.perf_counter()
        try:
            pooled = self.engine.embed(flat_windows, skips)
        except EmbedServingError as exc:
            self.metrics.execute_done(time.perf_counter() - t0, 0, 0)
            error = to_triton_error(exc, pb_utils)
            for r in valid:
                self.metrics.failure(exc)
                responses[r] = pb_utils.InferenceResponse(error=error)
            return responses
        per_request_tokens = [sum(len(x) for x in ids) for ids in token_ids]
        tokens = sum(per_request_tokens)
        self.metrics.execute_done(time.perf_counter() - t0, len(flat_windows), tokens)
        self.reporter.add_tokens(tokens)
        window_counts = [sum(len(w) for w in text_windows) for text_windows in windows]
        for r, pooled_windows, text_windows, opts, n_tokens in zip(
            valid, split(pooled, window_counts), windows, options, per_request_tokens, strict=True
        ):
            normalize = self.spec.normalize if opts.normalize is None else opts.normalize
            vectors = text_vectors(np.asarray(pooled_windows), text_windows, normalize)
            vectors = cut_dimensions(vectors, opts.dimensions, opts.normalize is not False)
            kind = opts.embedding_type or DEFAULT_EMBEDDING_TYPE
            self.metrics.success(texts=len(text_windows), tokens=n_tokens)
            tensor = pb_utils.Tensor(
                "EMBEDDING", codec.encode_typed_embeddings(vectors, kind).reshape(-1, 1)
            )
            responses[r] = pb_utils.InferenceResponse(output_tensors=[tensor])
        return responses

    def _decode(self, request):
        """One request's token IDs, windows and options, validated.

        Raises:
            EmbedServingError: bad token IDs or windows, or an option this model refuses.
        """
        try:  # parsed once, here: the tokenizer step reads the same parameters for its own
            opts = RequestOptions.from_parameters(json.loads(request.parameters() or "{}"))
            if opts.dimensions is not None:
                self.spec.dimensions.check(opts.dimensions)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        payloads = pb_utils.get_input_tensor_by_name(request, "TOKEN_IDS").as_numpy().reshape(-1)
        window_tensor = pb_utils.get_input_tensor_by_name(request, "WINDOWS")
        window_payloads = (
            None
            if window_tensor is None
            else [bytes(p) for p in window_tensor.as_numpy().reshape(-1)]
        )
        ids, windows = decode_request_token_ids(
            [bytes(p) for p in payloads],
            self.engine.vocab_size,
            self.config.max_length,
            window_payloads,
            max_chunks=self.config.max_chunks,
            max_request_tokens=self.config.max_request_tokens,
        )
        return ids, windows, opts

    def finalize(self):
        """Free the metric families while the stub can still reach Triton.

        Freeing them at interpreter exit crashes the Triton 2.51 stub.
        """
        self.metrics.stop()
        self.reporter = self.metrics = None
