"""Ablation model: one step, raw strings tokenized by vLLM, JSON or bytes output.

Benchmark only (perf/ablations/README.md). Reuses the product's engine and placement so the
only differences from the ``embed`` ensemble are the ones being measured.
"""

import locale

locale.setlocale(locale.LC_ALL, "C.UTF-8")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402
from triton_embed import codec  # noqa: E402
from triton_embed_server import engine as engine_mod  # noqa: E402
from triton_embed_server import placement as placement_mod  # noqa: E402
from triton_embed_server.batching import flatten, split  # noqa: E402
from triton_embed_server.config import EmbedderConfig, model_parameters  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        self.config = EmbedderConfig.from_model_config(
            model_config, Path(args["model_repository"]).parent
        )
        self.json_output = model_parameters(model_config).get("output_format", "json") == "json"
        name = args["model_instance_name"]
        placement_mod.place_instance(
            self.config, args.get("model_instance_kind", "CPU"), engine_mod.instance_index(name), 0
        )
        self.engine = engine_mod.PoolingEngine(self.config)

    def execute(self, requests):
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
