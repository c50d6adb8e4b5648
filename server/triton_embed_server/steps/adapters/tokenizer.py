"""Triton Python-backend adapter of the ``tokenizer`` step: TEXT -> TOKEN_IDS, NUM_TOKENS.

Decodes tensors, calls :class:`triton_embed_server.steps.tokenization.TextTokenizer`, encodes
tensors. A request that sends ``DECODE_IDS`` instead of ``TEXT`` is decoded back to text
(``DECODED``, :class:`triton_embed_server.steps.detokenization.TokenDecoder`, TEI's
``/decode``). All logic lives in the importable ``triton_embed_server`` package.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils
from triton_embed import codec
from triton_embed.decode_options import DECODE_INPUT, DECODE_OUTPUT, DecodeOptions

from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.detokenization import DecodeRequest, TokenDecoder
from triton_embed_server.steps.errors import (
    EmbedServingError,
    InvalidArgumentError,
    to_triton_error,
)
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
        self.decoder = TokenDecoder(
            self.tokenizer.backend, self.tokenizer.vocab_size, self.config.max_request_tokens
        )
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
        decoded = self._decode([r for r in requests if _input(r, DECODE_INPUT) is not None])
        text_requests, option_errors = [], {}
        for r, request in enumerate(requests):
            text = _input(request, "TEXT")
            if text is None or id(request) in decoded:
                if id(request) not in decoded:
                    option_errors[r] = InvalidArgumentError(
                        f"the request has neither TEXT (texts to tokenize) nor {DECODE_INPUT} "
                        "(token IDs to decode); send one of them"
                    )
                text_requests.append(TextRequest(texts=[]))  # answered below
                continue
            texts = text.as_numpy().reshape(-1)
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
        for request, result in zip(requests, results, strict=True):
            if id(request) in decoded:
                responses.append(decoded[id(request)])
                continue
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

    def _decode(self, requests) -> dict:
        """``{id(request): its response}`` of the requests that send ``DECODE_IDS``."""
        decode_requests, errors = [], {}
        for r, request in enumerate(requests):
            payloads = [bytes(p) for p in _input(request, DECODE_INPUT).as_numpy().reshape(-1)]
            try:
                parameters = json.loads(request.parameters() or "{}")
                options = DecodeOptions.from_parameters(parameters)
            except ValueError as exc:
                errors[r] = InvalidArgumentError(str(exc))
                options, payloads = DecodeOptions(), []  # answered with the error, not decoded
            decode_requests.append(DecodeRequest(payloads, options.skips_special_tokens))
        results = self.decoder.decode_requests(decode_requests)
        responses = {}
        for r, (request, result) in enumerate(zip(requests, results, strict=True)):
            result = errors.get(r, result)
            if isinstance(result, Exception):
                self.metrics.failure(result)
                response = pb_utils.InferenceResponse(error=to_triton_error(result, pb_utils))
            else:
                # a request answered; its texts and tokens are not tokenization's, not counted
                self.metrics.success()
                texts = np.empty((len(result), 1), dtype=object)  # object: NULs kept
                texts[:, 0] = [t.encode("utf-8") for t in result]
                response = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(DECODE_OUTPUT, texts)]
                )
            responses[id(request)] = response
        return responses

    def finalize(self):
        """Free the metric families while the stub can still reach Triton.

        Freeing them at interpreter exit crashes the Triton 2.51 Python-backend stub.
        """
        self.metrics.stop()
        self.metrics = None
        if self.tracing is not None:
            self.tracing.shutdown()


def _input(request, name: str):
    """The request's input tensor ``name``, or ``None`` when it was not sent (optional)."""
    return pb_utils.get_input_tensor_by_name(request, name)
