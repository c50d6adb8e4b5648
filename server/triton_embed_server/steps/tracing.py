"""The steps' own spans: tokenization and the engine call, under Triton's span of the step.

Triton 2.51's Python backend hands each request's trace to the step:
``request.trace().get_context()`` is ``'{"traceparent": "00-<trace>-<span>-01"}'`` when the
request is traced, the span being Triton's span of this step for that request (measured:
the ``tokenizer`` step's context names the ``tokenizer`` span's id), and ``None`` when it
is not. A step whose server was started with an OTLP endpoint
(:data:`~triton_embed_server.run.trace_args.STEP_ENDPOINT_ENV` in its environment, set by
the launcher and ``scripts/serve.sh`` with Triton's own trace flags) makes, after the
batch's work, one span per traced request of it: ``tokenize`` on the tokenizer steps
(``tokenizer``, ``pair_tokenizer``), ``engine`` on the engine steps (``embedder``, the
scorer, the sparse and the token encoder: one frame,
:class:`~triton_embed_server.steps.adapters.engine_step.EngineStepModel`), from the work's
start to its end (the batch's: the requests
of one ``execute`` call share one tokenizer or engine call), with the batch's size as
attributes, exported over OTLP/HTTP by a batch span processor in the stub.

Without the variable none of this exists (:func:`step_tracing` returns ``None``; the
adapters check it once per ``execute`` call).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from triton_embed_server.run.trace_args import STEP_ENDPOINT_ENV, otlp_tracer_provider

#: The ``service.name`` of the steps' spans (Triton's own spans carry the same).
SERVICE_NAME = "triton-embed-server"


class StepTracing:
    """One step instance's tracer provider and its OTLP/HTTP exporter.

    Args:
        endpoint: the OTLP/HTTP URL.
        step: the step's name (``tokenizer``, ``embedder``), the ``triton_embed.step``
            attribute.
        exporter: the span exporter (default: OTLP/HTTP protobuf to ``endpoint``).
    """

    def __init__(self, endpoint: str, step: str, exporter: Any = None):
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.step = step
        self.provider = otlp_tracer_provider(endpoint, SERVICE_NAME, exporter)
        self.tracer = self.provider.get_tracer("triton_embed_server.steps")
        self._propagator = TraceContextTextMapPropagator()

    def record(
        self,
        name: str,
        requests: Iterable[Any],
        start_ns: int,
        end_ns: int,
        attributes: dict[str, int],
    ) -> int:
        """One span ``name`` per traced request, ``start_ns`` to ``end_ns``.

        Args:
            name: ``tokenize`` or ``engine``.
            requests: the batch's requests (``pb_utils.InferenceRequest``: ``trace()``).
            start_ns: the work's start, ``time.time_ns()`` (ns since the epoch).
            end_ns: its end, likewise.
            attributes: the batch's figures (``requests``, ``texts``, ``tokens``), the
                attributes ``triton_embed.batch_<name>``.

        Returns:
            The spans made (the requests that were traced).
        """
        made = 0
        for request in requests:
            context = request.trace().get_context()
            if not context:
                continue
            parent = self._propagator.extract(json.loads(context))
            span = self.tracer.start_span(
                name,
                context=parent,
                start_time=start_ns,
                attributes={
                    "triton_embed.step": self.step,
                    **{f"triton_embed.batch_{k}": v for k, v in attributes.items()},
                },
            )
            span.end(end_time=end_ns)
            made += 1
        return made

    def shutdown(self) -> None:
        """Export the spans still buffered, then stop the exporter."""
        self.provider.shutdown()


def step_tracing(step: str) -> StepTracing | None:
    """The step's tracing when its server exports traces; ``None`` (nothing created) else."""
    endpoint = os.environ.get(STEP_ENDPOINT_ENV)
    return StepTracing(endpoint, step) if endpoint else None
