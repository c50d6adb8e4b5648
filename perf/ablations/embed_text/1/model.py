"""Ablation model: one step, raw strings tokenized by vLLM, JSON or bytes output.

Benchmark only (perf/ablations/README.md). Reuses the product's engine and placement so the
only differences from the ``embed`` ensemble are the ones being measured: the texts go to the
engine as strings, and vLLM tokenizes them inside the engine call (what a one-step server
does).
"""

import locale

locale.setlocale(locale.LC_ALL, "C.UTF-8")

import json  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402
from triton_embed import codec  # noqa: E402
from triton_embed_server.host.doctor import host_plan  # noqa: E402
from triton_embed_server.host.placement.apply import apply_placement  # noqa: E402
from triton_embed_server.host.placement.instance import (  # noqa: E402
    decide_placement,
    instance_index,
)
from triton_embed_server.steps.batching import flatten, split  # noqa: E402
from triton_embed_server.steps.config import EmbedderConfig, model_parameters  # noqa: E402
from triton_embed_server.steps.vectors import l2_normalize  # noqa: E402
from triton_embed_server.steps.vllm_engine import PoolingEngine  # noqa: E402


class TextEngine(PoolingEngine):
    """The product's engine, fed raw strings instead of token IDs."""

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Embed raw strings, tokenized by vLLM inside the engine call; float32 ``[n, dim]``."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._stack(self._encode(list(texts), "embed"))
        return l2_normalize(vectors) if self.spec.normalize else vectors


class TritonPythonModel:
    """One text-in engine per model instance."""

    def initialize(self, args):
        """Parse the config, place this replica, start its engine."""
        model_config = json.loads(args["model_config"])
        self.config = EmbedderConfig.from_model_config(
            model_config, Path(args["model_repository"]).parent
        )
        self.json_output = model_parameters(model_config).get("output_format", "json") == "json"
        name = args["model_instance_name"]
        apply_placement(
            decide_placement(
                self.config,
                args.get("model_instance_kind", "CPU"),
                instance_index(name),
                auto_plan=host_plan,
            )
        )
        self.engine = TextEngine(self.config)

    def execute(self, requests):
        """Embed every request's texts in one engine call; JSON or float32 bytes out."""
        texts = [
            [
                bytes(t).decode("utf-8", "replace")
                for t in pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy().reshape(-1)
            ]
            for r in requests
        ]
        flat, counts = flatten(texts)
        responses = []
        for vectors in split(self.engine.embed_texts(flat), counts):
            if self.json_output:
                out = np.array([json.dumps(v.tolist()).encode() for v in vectors], dtype=object)
            else:
                out = codec.encode_embeddings(vectors)
            tensor = pb_utils.Tensor("EMBEDDING", out.reshape(-1, 1))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
