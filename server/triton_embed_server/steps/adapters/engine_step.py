"""What the engine steps' Triton adapters share: placement, the engine's start, the batch's frame.

An engine step (the ``embedder``, a reranker's ``scorer``) owns one in-process vLLM engine
per model instance. :class:`EngineStepModel` does the part both do alike: ``initialize``
parses the step's config, places the replica (NUMA node, CPUs, GPU) before vLLM and torch
start their threads, starts the engine and the metrics; ``execute`` decodes each request
(a cancelled or bad one is answered alone), runs the engine once on the batch (an engine
failure answers every valid request), counts the work, and leaves the step's own outputs
to the subclass (:meth:`EngineStepModel.engine_call` and :meth:`EngineStepModel.respond`).
"""

import time

import triton_python_backend_utils as pb_utils

from triton_embed_server.host.doctor import host_plan
from triton_embed_server.host.placement.apply import apply_placement
from triton_embed_server.host.placement.instance import decide_placement, instance_index
from triton_embed_server.steps.errors import CancelledError, EmbedServingError, to_triton_error
from triton_embed_server.steps.metrics import InstanceReporter, StepMetrics
from triton_embed_server.steps.tracing import step_tracing


class EngineStepModel:
    """The frame of an engine step's ``TritonPythonModel``.

    A subclass sets :attr:`step` (the ``model`` metric label and the log's name),
    :attr:`config_class`, :attr:`work` (the verb of the cancelled-request message) and
    implements :meth:`start_engine`, :meth:`describe`, :meth:`decode`,
    :meth:`engine_call` and :meth:`respond`.
    """

    step = ""
    config_class: type = object
    work = "run"

    def initialize(self, args):
        """Parse the config, place this replica (NUMA node, CPUs, GPU), start its engine."""
        self.config = self.config_class.from_args(args)
        name = args["model_instance_name"]
        if self.config.dtype_note:  # a precision these CPUs do not run well
            pb_utils.Logger.log_warn(f"{self.step} {name}: {self.config.dtype_note}")
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
        self.engine = self.start_engine(self.config)
        self.metrics = StepMetrics(pb_utils, self.step, name)
        self.tracing = step_tracing(self.step)
        self.reporter = InstanceReporter(
            self.metrics,
            list(placement.numa_nodes),
            placement.labels(),
            hourly_price_usd=self.config.hourly_price_usd / self.config.instances_per_device,
            window_s=self.config.cost_window_s,
        )
        pb_utils.Logger.log_info(
            f"{self.step} {name}: {self.describe()}, {placement.describe()}, "
            f"env={placement.env or 'vLLM default'}"
        )

    def execute(self, requests):
        """Decode per request, run the engine once on every valid request, answer each."""
        self.metrics.ensure_started()  # not in initialize (StepMetrics.start says why)
        responses = [None] * len(requests)
        valid, decoded = [], []
        for r, request in enumerate(requests):
            try:
                if request.is_cancelled():
                    raise CancelledError(f"the request was cancelled before it was {self.work}")
                decoded.append(self.decode(request))
            except EmbedServingError as exc:
                self.metrics.failure(exc)
                responses[r] = pb_utils.InferenceResponse(error=to_triton_error(exc, pb_utils))
                continue
            valid.append(r)
        t0, start_ns = time.perf_counter(), time.time_ns()
        try:
            output, items = self.engine_call(decoded)
        except EmbedServingError as exc:
            self.metrics.execute_done(time.perf_counter() - t0, 0, 0)
            error = to_triton_error(exc, pb_utils)
            for r in valid:
                self.metrics.failure(exc)
                responses[r] = pb_utils.InferenceResponse(error=error)
            return responses
        per_request_tokens = [sum(len(x) for x in d[0]) for d in decoded]
        tokens = sum(per_request_tokens)
        self.metrics.execute_done(time.perf_counter() - t0, items, tokens)
        self.reporter.add_tokens(tokens)
        if self.tracing is not None:
            figures = {"requests": len(valid), "items": items, "tokens": tokens}
            traced = [requests[r] for r in valid]
            self.tracing.record("engine", traced, start_ns, time.time_ns(), figures)
        for r, answered, n_tokens in zip(
            valid, self.respond(output, decoded), per_request_tokens, strict=True
        ):
            texts, tensors = answered
            self.metrics.success(texts=texts, tokens=n_tokens)
            responses[r] = pb_utils.InferenceResponse(output_tensors=tensors)
        return responses

    def start_engine(self, config):
        """The step's engine, built from its config."""
        raise NotImplementedError

    def describe(self) -> str:
        """The step's facts for its start log line (model, dtype, limits)."""
        raise NotImplementedError

    def decode(self, request) -> tuple:
        """One request's inputs, validated: a tuple whose first item is its token-ID lists.

        Raises:
            EmbedServingError: the request fails alone.
        """
        raise NotImplementedError

    def engine_call(self, decoded: list) -> tuple:
        """``(output, items)``: the engine run once on every valid request's inputs.

        Raises:
            EmbedServingError: the engine failed (every valid request is answered with it).
        """
        raise NotImplementedError

    def respond(self, output, decoded: list) -> list:
        """Per valid request, ``(texts or pairs answered, output tensors)``, in order."""
        raise NotImplementedError

    def finalize(self):
        """Free the metric families while the stub can still reach Triton.

        Freeing them at interpreter exit crashes the Triton 2.51 stub.
        """
        self.metrics.stop()
        self.reporter = self.metrics = None
        if self.tracing is not None:
            self.tracing.shutdown()
