"""Triton Python-backend adapter of the ``embedder`` step: TOKEN_IDS (+ WINDOWS) -> EMBEDDING.

Each model instance (an ``instance_group`` copy, its own stub process) owns one in-process
vLLM pooling engine. All windows of all requests of an ``execute`` call go to the engine in
one call; the vectors are split back per request, normalized, averaged per text
(``truncation=CHUNK``), cut to the request's ``dimensions`` and encoded as its
``embedding_type``; ``normalize=false`` keeps the pooled vectors un-normalized. A request
with bad token IDs or options, or over the step's budget (``max_chunks`` windows per text,
``max_request_tokens`` per request), fails alone; a request cancelled by its client before
the engine call (``request.is_cancelled()``) is answered ``CANCELLED`` and not embedded
(:class:`~triton_embed_server.steps.adapters.engine_step.EngineStepModel`).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from triton_embed import codec
from triton_embed.options import DEFAULT_EMBEDDING_TYPE, RequestOptions

from triton_embed_server.steps.adapters.engine_step import EngineStepModel
from triton_embed_server.steps.batching import split
from triton_embed_server.steps.config import EmbedderConfig
from triton_embed_server.steps.errors import InvalidArgumentError
from triton_embed_server.steps.token_ids import decode_request_token_ids
from triton_embed_server.steps.vectors import cut_dimensions, text_vectors
from triton_embed_server.steps.vllm_engine import PoolingEngine


class TritonPythonModel(EngineStepModel):
    """One vLLM engine per model instance, built once in ``initialize``."""

    step = "embedder"
    config_class = EmbedderConfig
    work = "embedded"

    def start_engine(self, config):
        """The instance's :class:`PoolingEngine` (and the model's spec, from it)."""
        engine = PoolingEngine(config)
        self.spec = engine.spec
        return engine

    def describe(self) -> str:
        """Model, dtype, vectors and budgets, for the start log line."""
        c = self.config
        return (
            f"{c.model_path.name}, dtype={c.dtype}, dim={self.engine.dim}, "
            f"pooling={self.spec.pooling.value}, normalize={self.spec.normalize}, "
            f"max_length={c.max_length}, max_chunks={c.max_chunks}, "
            f"max_request_tokens={c.max_request_tokens}"
        )

    def decode(self, request):
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

    def cut(self, decoded, start, end):
        """Texts ``start:end`` of a decoded request: their token IDs and windows."""
        ids, windows, opts = decoded
        return ids[start:end], windows[start:end], opts

    def engine_call(self, decoded):
        """Every valid window, pooled in one engine call; ``(pooled, windows)``."""
        flat_windows, skips = [], []
        for ids, windows, _ in decoded:
            for text, per_text in zip(ids, windows, strict=True):
                start = 0
                for n, skip, _ in per_text:
                    flat_windows.append(text[start : start + n])
                    skips.append(skip)
                    start += n
        return self.engine.embed(flat_windows, skips), len(flat_windows)

    def respond(self, pooled, decoded):
        """Per request its ``EMBEDDING`` elements, in the request's ``embedding_type``."""
        window_counts = [sum(len(w) for w in windows) for _, windows, _ in decoded]
        out = []
        for pooled_windows, (_, text_windows, opts) in zip(
            split(pooled, window_counts), decoded, strict=True
        ):
            normalize = self.spec.normalize if opts.normalize is None else opts.normalize
            vectors = text_vectors(np.asarray(pooled_windows), text_windows, normalize)
            vectors = cut_dimensions(vectors, opts.dimensions, opts.normalize is not False)
            kind = opts.embedding_type or DEFAULT_EMBEDDING_TYPE
            tensor = pb_utils.Tensor(
                "EMBEDDING", codec.encode_typed_embeddings(vectors, kind).reshape(-1, 1)
            )
            out.append((len(text_windows), [tensor]))
        return out
