"""Triton Python-backend adapter of the ``tokenizer`` step: TEXT -> TOKEN_IDS, NUM_TOKENS.

Decodes tensors, calls :class:`triton_embed_server.steps.tokenization.TextTokenizer`, encodes
tensors. All logic lives in the importable ``triton_embed_server`` package.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils
from triton_embed import codec

from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.errors import EmbedServingError, to_triton_error
from triton_embed_server.steps.metrics import StepMetrics
from triton_embed_server.steps.tokenization import (
    TextRequest,
    TextTokenizer,
    parse_request_options,
)
from triton_embed_server.steps.tracing import step_tracing


class TritonPythonModel:
    """One tokenizer per model instance, built once in ``initialize``."""

    def initialize(self, args):
        """Parse the model config and load the fast tokenizer from the model folder."""
        self.config = TokenizerConfig.from_args(args)
        self.tokenizer = TextTokenizer(self.config)
        self.metrics = StepMetrics(pb_utils, "tokenizer", args["model_instance_name"])
        self.tracing = step_tracing("tokenizer")
        pb_utils.Logger.log_info(
            f"tokenizer {args['model_instance_name']}: {self.config.model_path.name}, "
            f"max_length={self.config.max_length}, truncation={self.config.truncation.value}, "
            f"max_request_tokens={self.config.max_request_tokens}, kind={self.config.kind}"
        )

    def execute(self, requests):
        """Tokenize every request of the batch in one call; errors stay per request.

        No ``request.is_cancelled()`` here: it is one round trip to the Triton process,
        about what tokenizing a short request costs, and Triton already drops a request
        cancelled in this step's queue and checks again before the ensemble's next step.
        """
        self.metrics.ensure_started()  # not in initialize (StepMetrics.start says why)
        text_requests, option_errors = [], {}
        for r, request in enumerate(requests):
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            try:
                options = parse_request_options(
                    json.loads(request.parameters() or "{}"), self.config.kind
                )
            except EmbedServingError as exc:
                option_errors[r] = exc
                text_requests.append(TextRequest(texts=[]))  # answered with the error below
                continue
            text_requests.append(TextRequest(texts=[bytes(t) for t in texts], options=options))
        t0, start_ns = time.perf_counter(), time.time_ns()
        results = self.tokenizer.tokenize_requests(text_requests)
        seconds = time.perf_counter() - t0
        results = [option_errors.get(r, res) for r, res in enumerate(results)]
        responses, batch_texts, batch_tokens = [], 0, 0
        for result in results:
            if isinstance(result, Exception):
                self.metrics.failure(result)
                responses.append(
                    pb_utils.InferenceResponse(error=to_triton_error(result, pb_utils))
                )
                continue
            batch_texts += len(result.token_ids)
            batch_tokens += sum(result.num_tokens)
            self.metrics.success(
                texts=len(result.token_ids),
                tokens=sum(result.num_tokens),
                truncated=sum(
                    k < n for k, n in zip(result.num_tokens, result.num_input_tokens, strict=True)
                ),
            )
            token_ids = codec.encode_token_ids(result.token_ids).reshape(-1, 1)
            num_tokens = np.array(result.num_tokens, dtype=np.int32).reshape(-1, 1)
            windows = codec.encode_windows(result.windows).reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("TOKEN_IDS", token_ids),
                        pb_utils.Tensor("NUM_TOKENS", num_tokens),
                        pb_utils.Tensor("WINDOWS", windows),
                    ]
                )
            )
        self.metrics.execute_done(seconds, batch_texts, batch_tokens)
        if self.tracing is not None:
            figures = {"requests": len(requests), "texts": batch_texts, "tokens": batch_tokens}
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
