"""Triton Python-backend adapter of a reranker's pair tokenizer step.

QUERY, DOCUMENT (BYTES ``[n, 1]``) -> TOKEN_IDS (BYTES: little-endian int32 per pair),
SEGMENT_START (INT32 ``[n, 1]``), NUM_TOKENS (INT32 ``[n, 1]``). Decodes tensors, calls
:class:`triton_embed_server.steps.pair_tokenization.PairTokenizer`, encodes tensors.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils
from triton_embed import codec
from triton_embed.rerank_options import PairOptions

from triton_embed_server.steps.errors import (
    EmbedServingError,
    InvalidArgumentError,
    to_triton_error,
)
from triton_embed_server.steps.metrics import StepMetrics
from triton_embed_server.steps.pair_tokenization import PairRequest, PairTokenizer
from triton_embed_server.steps.rerank_config import PairTokenizerConfig
from triton_embed_server.steps.tracing import step_tracing


def _column(request, name):
    return [
        bytes(x) for x in pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)
    ]


class TritonPythonModel:
    """One pair tokenizer per model instance, built once in ``initialize``."""

    def initialize(self, args):
        """Parse the model config and load the fast tokenizer from the model folder."""
        self.config = PairTokenizerConfig.from_args(args)
        self.tokenizer = PairTokenizer(self.config)
        self.metrics = StepMetrics(pb_utils, "pair_tokenizer", args["model_instance_name"])
        self.tracing = step_tracing("pair_tokenizer")
        spec = self.config.spec
        pb_utils.Logger.log_info(
            f"pair tokenizer {args['model_instance_name']}: {self.config.model_path.name}, "
            f"family={spec.family.value}, segments={spec.segments}, "
            f"max_length={self.config.max_length}, "
            f"max_request_tokens={self.config.max_request_tokens}"
        )

    def execute(self, requests):
        """Tokenize every pair of the batch in one call; errors stay per request."""
        self.metrics.ensure_started()  # not in initialize (StepMetrics.start says why)
        pair_requests, errors = [], {}
        for r, request in enumerate(requests):
            try:
                options = PairOptions.from_parameters(json.loads(request.parameters() or "{}"))
            except ValueError as exc:
                errors[r] = InvalidArgumentError(str(exc))
                pair_requests.append(PairRequest([], []))
                continue
            pair_requests.append(
                PairRequest(_column(request, "QUERY"), _column(request, "DOCUMENT"), options)
            )
        t0, start_ns = time.perf_counter(), time.time_ns()
        results = self.tokenizer.tokenize_requests(pair_requests)
        seconds = time.perf_counter() - t0
        responses, batch_pairs, batch_tokens = [], 0, 0
        for r, result in enumerate(results):
            result = errors.get(r, result)
            if isinstance(result, EmbedServingError):
                self.metrics.failure(result)
                responses.append(
                    pb_utils.InferenceResponse(error=to_triton_error(result, pb_utils))
                )
                continue
            tokens = sum(result.num_tokens)
            batch_pairs += len(result.token_ids)
            batch_tokens += tokens
            self.metrics.success(
                texts=len(result.token_ids),
                tokens=tokens,
                truncated=sum(
                    k < n for k, n in zip(result.num_tokens, result.num_input_tokens, strict=True)
                ),
            )
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor(
                            "TOKEN_IDS", codec.encode_token_ids(result.token_ids).reshape(-1, 1)
                        ),
                        pb_utils.Tensor(
                            "SEGMENT_START",
                            np.array(result.segment_starts, dtype=np.int32).reshape(-1, 1),
                        ),
                        pb_utils.Tensor(
                            "NUM_TOKENS", np.array(result.num_tokens, dtype=np.int32).reshape(-1, 1)
                        ),
                    ]
                )
            )
        self.metrics.execute_done(seconds, batch_pairs, batch_tokens)
        if self.tracing is not None:
            figures = {"requests": len(requests), "pairs": batch_pairs, "tokens": batch_tokens}
            self.tracing.record("tokenize", requests, start_ns, time.time_ns(), figures)
        return responses

    def finalize(self):
        """Free the metric families while the stub can still reach Triton.

        Freeing them at interpreter exit crashes the Triton 2.51 Python-backend stub.
        """
        self.metrics.stop()
        self.metrics = None
        if self.tracing is not None:
            self.tracing.shutdown()
