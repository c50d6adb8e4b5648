"""What the engine steps' Triton adapters share: placement, the engine's start, the queue.

An engine step (the ``embedder``, a reranker's ``scorer``, the sparse, token and hybrid
encoders) owns one in-process vLLM engine per model instance. :class:`EngineStepModel` does
the part they do alike: ``initialize`` parses the step's config, places the replica (NUMA
node, CPUs, GPU) before vLLM and torch start their threads, starts the engine, the metrics
and the instance's :class:`~triton_embed_server.steps.engine_queue.EngineQueue`; ``execute``
decodes each request (a cancelled or bad one is answered alone, at once) and hands the rest
to the queue, which runs the engine calls (interactive requests first, batch-class work in
short calls: that module's docstring) and answers each request through its response sender
(an engine failure answers the requests of that call). The step's own inputs and outputs
are the subclass's (:meth:`EngineStepModel.decode`, :meth:`EngineStepModel.engine_call`,
:meth:`EngineStepModel.respond`, and :meth:`EngineStepModel.cut` where a request's texts
may be split between calls).
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils
from triton_embed.priority import CLASS_PARAMETER, Priority

from triton_embed_server.host.doctor import host_plan
from triton_embed_server.host.placement.apply import apply_placement
from triton_embed_server.host.placement.instance import decide_placement, instance_index
from triton_embed_server.steps.engine_queue import EngineQueue, Job, Part, QueueSettings
from triton_embed_server.steps.errors import (
    CancelledError,
    EmbedServingError,
    InvalidArgumentError,
    to_triton_error,
)
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
        settings = QueueSettings.from_model_config(
            json.loads(args["model_config"]),
            self.config.batch_call_tokens,
            self.config.interactive_window_s,
        )
        self.queue = EngineQueue(self, settings, name=f"{name}-queue")
        pb_utils.Logger.log_info(
            f"{self.step} {name}: {self.describe()}, {placement.describe()}, "
            f"env={placement.env or 'vLLM default'}, batch_call_tokens="
            f"{settings.batch_call_tokens}, interactive_window_s={settings.interactive_window_s:g}"
        )

    def execute(self, requests):
        """Decode each request, queue the valid ones; every answer goes by response sender.

        Returns ``None`` once the interactive requests are answered and the batch-class ones
        are queued (:meth:`EngineQueue.submit`).
        """
        self.metrics.ensure_started()  # not in initialize (StepMetrics.start says why)
        jobs = []
        for request in requests:
            try:
                if request.is_cancelled():
                    raise CancelledError(f"the request was cancelled before it was {self.work}")
                batch = request_class(request) is Priority.BATCH
                decoded = self.decode(request)
            except EmbedServingError as exc:
                self.answer(Job(request, None, False, ()), None, exc)
                continue
            tokens = [len(x) for x in decoded[0]]
            jobs.append(Job(request, decoded, batch, tokens, cuttable=self.cuttable))
        self.queue.submit(jobs)
        return None

    def run_call(self, parts: list[Part]) -> list:
        """One engine call on ``parts`` (:class:`~triton_embed_server.steps.engine_queue.Runner`).

        Returns:
            per part ``((texts answered, output tensors), tokens)``.

        Raises:
            EmbedServingError: the engine failed.
        """
        decoded = [
            job.decoded if (start, end) == (0, job.texts) else self.cut(job.decoded, start, end)
            for job, start, end in parts
        ]
        t0, start_ns = time.perf_counter(), time.time_ns()
        try:
            output, items = self.engine_call(decoded)
        except EmbedServingError:
            self.metrics.execute_done(time.perf_counter() - t0, 0, 0)
            raise
        per_part_tokens = [sum(job.text_tokens[start:end]) for job, start, end in parts]
        tokens = sum(per_part_tokens)
        self.metrics.execute_done(time.perf_counter() - t0, items, tokens)
        self.reporter.add_tokens(tokens)
        if self.tracing is not None:
            requests = list({id(job): job.request for job, _, _ in parts}.values())
            figures = {"requests": len(requests), "items": items, "tokens": tokens}
            self.tracing.record("engine", requests, start_ns, time.time_ns(), figures)
        return list(zip(self.respond(output, decoded), per_part_tokens, strict=True))

    def answer(self, job: Job, results: list | None, error: BaseException | None) -> None:
        """Send ``job``'s response: its parts' outputs joined along the first axis, or ``error``."""
        if error is not None:
            self.metrics.failure(error)
            response = pb_utils.InferenceResponse(error=to_triton_error(error, pb_utils))
        else:
            texts = sum(answered[0] for answered, _ in results)
            tokens = sum(n for _, n in results)
            self.metrics.success(texts=texts, tokens=tokens)
            response = pb_utils.InferenceResponse(
                output_tensors=join_tensors([answered[1] for answered, _ in results])
            )
        job.request.get_response_sender().send(
            response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        )

    def cancelled(self, job: Job) -> bool:
        """Whether the client of ``job`` cancelled it."""
        return job.request.is_cancelled()

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

    #: Whether a request's texts may be split between engine calls (:meth:`cut`).
    cuttable = True

    def cut(self, decoded: tuple, start: int, end: int) -> tuple:
        """The part of a decoded request of its texts ``start:end``.

        This one slices the first item (the token-ID lists) and keeps the others, which must
        then be per request; a step with more per-text items slices them too. The outputs of
        :meth:`respond` are per text along the first axis: the parts' tensors are joined.
        """
        return (decoded[0][start:end], *decoded[1:])

    def finalize(self):
        """Free the metric families while the stub can still reach Triton.

        Freeing them at interpreter exit crashes the Triton 2.51 stub. The queue stops first:
        what waits in it is answered ``UNAVAILABLE``.
        """
        self.queue.close()
        self.metrics.stop()
        self.reporter = self.metrics = None
        if self.tracing is not None:
            self.tracing.shutdown()


def request_class(request) -> Priority:
    """A request's class, from its ``priority_class`` parameter (absent: interactive).

    Raises:
        InvalidArgumentError: a value that is not a class (names it and the classes).
    """
    try:
        value = json.loads(request.parameters() or "{}").get(CLASS_PARAMETER)
        return Priority.INTERACTIVE if value is None else Priority.parse(value, CLASS_PARAMETER)
    except ValueError as exc:
        raise InvalidArgumentError(f"request parameter {exc}") from None


def join_tensors(parts: list[list]) -> list:
    """One request's output tensors from its parts' (joined along the first axis, in order)."""
    if len(parts) == 1:
        return parts[0]
    return [
        pb_utils.Tensor(tensors[0].name(), np.concatenate([t.as_numpy() for t in tensors]))
        for tensors in zip(*parts, strict=True)
    ]
