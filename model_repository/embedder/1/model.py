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
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402

from triton_embed import codec  # noqa: E402
from triton_embed.serving import engine as engine_mod  # noqa: E402
from triton_embed.serving.batching import flatten, split  # noqa: E402
from triton_embed.serving.config import EmbedderConfig  # noqa: E402
from triton_embed.serving.errors import EmbedServingError, to_triton_error  # noqa: E402
from triton_embed.serving.metrics import StepMetrics  # noqa: E402


class TritonPythonModel:
    """One vLLM engine per model instance, built once in ``initialize``."""

    def initialize(self, args):
        """Parse the config, place this replica (CPUs or GPU), start its engine."""
        model_config = json.loads(args["model_config"])
        repository_dir = Path(args["model_repository"]).parent
        self.config = EmbedderConfig.from_model_config(model_config, repository_dir)
        name = args["model_instance_name"]
        env = engine_mod.engine_environment(
            self.config,
            index=engine_mod.instance_index(name),
            kind=args.get("model_instance_kind", "CPU"),
            device_id=int(args.get("model_instance_device_id", 0) or 0),
            cpus=sorted(os.sched_getaffinity(0)),
        )
        cpus = engine_mod.apply_placement(env)
        self.engine = engine_mod.PoolingEngine(self.config)
        self.metrics = StepMetrics(pb_utils, "embedder", name)
        pb_utils.Logger.log_info(
            f"embedder {name}: {self.config.model_path.name}, dim={self.engine.dim}, "
            f"max_length={self.config.max_length}, cpus={','.join(map(str, cpus))}, "
            f"env={env or 'vLLM default'}"
        )

    def execute(self, requests):
        """Validate per request, embed all valid texts in one engine call, split back."""
        responses = [None] * len(requests)
        valid, token_ids = [], []
        for r, request in enumerate(requests):
            payloads = pb_utils.get_input_tensor_by_name(request, "TOKEN_IDS").as_numpy().reshape(-1)
            try:
                ids = engine_mod.decode_request_token_ids(
                    [bytes(p) for p in payloads], self.engine.vocab_size, self.config.max_length
                )
            except EmbedServingError as exc:
                self.metrics.failure(exc)
                responses[r] = pb_utils.InferenceResponse(error=to_triton_error(exc, pb_utils))
                continue
            valid.append(r)
            token_ids.append(ids)
        flat, counts = flatten(token_ids)
        try:
            per_request = split(self.engine.embed(flat), counts)
        except EmbedServingError as exc:
            error = to_triton_error(exc, pb_utils)
            for r in valid:
                self.metrics.failure(exc)
                responses[r] = pb_utils.InferenceResponse(error=error)
            return responses
        for r, vectors, ids in zip(valid, per_request, token_ids):
            self.metrics.success(texts=len(ids), tokens=sum(len(x) for x in ids))
            tensor = pb_utils.Tensor("EMBEDDING", codec.encode_embeddings(vectors).reshape(-1, 1))
            responses[r] = pb_utils.InferenceResponse(output_tensors=[tensor])
        return responses

    def finalize(self):
        """Free the metric families while the stub can still reach Triton (freeing them at
        interpreter exit crashes the 2.51 stub)."""
        self.metrics = None
