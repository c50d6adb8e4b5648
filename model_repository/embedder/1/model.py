"""Triton Python-backend adapter of the ``embedder`` step: TOKEN_IDS -> EMBEDDING.

Each model instance (an ``instance_group`` copy, its own stub process) owns one in-process
vLLM pooling engine. All requests of an ``execute`` call go to the engine in one call and
the vectors are split back per request; a request with bad token IDs fails alone.
"""

import locale

# The stub's embedded interpreter starts with an ASCII locale; torch/vLLM read UTF-8 files
# at import time (README, troubleshooting).
locale.setlocale(locale.LC_ALL, "C.UTF-8")

import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402
from triton_embed import codec  # noqa: E402
from triton_embed_server.batching import flatten, split  # noqa: E402
from triton_embed_server.config import EmbedderConfig  # noqa: E402
from triton_embed_server.doctor import host_plan  # noqa: E402
from triton_embed_server.engine import PoolingEngine  # noqa: E402
from triton_embed_server.errors import EmbedServingError, to_triton_error  # noqa: E402
from triton_embed_server.metrics import InstanceReporter, StepMetrics  # noqa: E402
from triton_embed_server.placement.apply import apply_placement  # noqa: E402
from triton_embed_server.placement.plan import decide_placement, instance_index  # noqa: E402
from triton_embed_server.token_ids import decode_request_token_ids  # noqa: E402


class TritonPythonModel:
    """One vLLM engine per model instance, built once in ``initialize``."""

    def initialize(self, args):
        """Parse the config, place this replica (NUMA node, CPUs, GPU), start its engine."""
        model_config = json.loads(args["model_config"])
        repository_dir = Path(args["model_repository"]).parent
        self.config = EmbedderConfig.from_model_config(model_config, repository_dir)
        name = args["model_instance_name"]
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
        self.metrics = StepMetrics(pb_utils, "embedder", name)
        self.reporter = InstanceReporter(
            self.metrics,
            list(placement.numa_nodes),
            placement.labels(),
            hourly_price_usd=self.config.hourly_price_usd / self.config.instances_per_device,
            window_s=self.config.cost_window_s,
        )
        self.metrics.start()
        pb_utils.Logger.log_info(
            f"embedder {name}: {self.config.model_path.name}, dim={self.engine.dim}, "
            f"max_length={self.config.max_length}, {placement.describe()}, "
            f"env={placement.env or 'vLLM default'}"
        )

    def execute(self, requests):
        """Validate per request, embed all valid texts in one engine call, split back."""
        responses = [None] * len(requests)
        valid, token_ids = [], []
        for r, request in enumerate(requests):
            payloads = (
                pb_utils.get_input_tensor_by_name(request, "TOKEN_IDS").as_numpy().reshape(-1)
            )
            try:
                ids = decode_request_token_ids(
                    [bytes(p) for p in payloads], self.engine.vocab_size, self.config.max_length
                )
            except EmbedServingError as exc:
                self.metrics.failure(exc)
                responses[r] = pb_utils.InferenceResponse(error=to_triton_error(exc, pb_utils))
                continue
            valid.append(r)
            token_ids.append(ids)
        flat, counts = flatten(token_ids)
        t0 = time.perf_counter()
        try:
            per_request = split(self.engine.embed(flat), counts)
        except EmbedServingError as exc:
            self.metrics.execute_done(time.perf_counter() - t0, 0, 0)
            error = to_triton_error(exc, pb_utils)
            for r in valid:
                self.metrics.failure(exc)
                responses[r] = pb_utils.InferenceResponse(error=error)
            return responses
        per_request_tokens = [sum(len(x) for x in ids) for ids in token_ids]
        tokens = sum(per_request_tokens)
        self.metrics.execute_done(time.perf_counter() - t0, len(flat), tokens)
        self.reporter.add_tokens(tokens)
        for r, vectors, ids, n_tokens in zip(
            valid, per_request, token_ids, per_request_tokens, strict=True
        ):
            self.metrics.success(texts=len(ids), tokens=n_tokens)
            tensor = pb_utils.Tensor("EMBEDDING", codec.encode_embeddings(vectors).reshape(-1, 1))
            responses[r] = pb_utils.InferenceResponse(output_tensors=[tensor])
        return responses

    def finalize(self):
        """Free the metric families while the stub can still reach Triton.

        Freeing them at interpreter exit crashes the Triton 2.51 stub.
        """
        self.metrics.stop()
        self.reporter = self.metrics = None
