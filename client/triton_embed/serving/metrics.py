"""Custom Prometheus metrics of the serving steps, served on Triton's metrics endpoint.

Triton 2.51's own counters cannot be used to count bad requests: a Python-backend model that
answers a request with an error is counted in ``nv_inference_request_success`` of that model,
and the ensemble counts each failed request twice in ``nv_inference_request_failure``
(both seen here). These families count outcomes as this product defines them.

Families (all COUNTERs; labels ``model`` and ``instance``, plus ``reason`` for failures):

* ``triton_embed_requests_succeeded_total``
* ``triton_embed_requests_failed_total``: ``reason`` is the error's ``reason``
  (``empty``, ``invalid_utf8``, ``too_long``, ``invalid_input``, ``invalid_token_ids``,
  ``engine_error``, ``internal``)
* ``triton_embed_texts_total``, ``triton_embed_tokens_total`` (tokens kept, special tokens
  included), ``triton_embed_texts_truncated_total``
"""

from __future__ import annotations

from typing import Any

from triton_embed.serving.errors import EmbedServingError

FAILURE_REASONS = (
    "empty", "invalid_utf8", "too_long", "invalid_input", "invalid_token_ids", "engine_error",
    "internal",
)  # fmt: skip


def failure_reason(exc: BaseException) -> str:
    """The ``reason`` label of an exception (``internal`` for foreign ones)."""
    return exc.reason if isinstance(exc, EmbedServingError) else "internal"


class StepMetrics:
    """The counters of one model instance.

    Args:
        pb_utils: the stub's ``triton_python_backend_utils`` (or a stand-in with
            ``MetricFamily``) .
        model: model name label.
        instance: instance name label.
    """

    def __init__(self, pb_utils: Any, model: str, instance: str):
        family = pb_utils.MetricFamily
        labels = {"model": model, "instance": instance}

        def counter(name: str, description: str):
            return family(name=name, description=description, kind=family.COUNTER)

        succeeded = counter("triton_embed_requests_succeeded_total", "Requests answered with outputs")
        failed = counter("triton_embed_requests_failed_total", "Requests answered with an error, by reason")
        texts = counter("triton_embed_texts_total", "Texts of successful requests")
        tokens = counter("triton_embed_tokens_total", "Tokens kept of successful requests (special tokens included)")
        truncated = counter("triton_embed_texts_truncated_total", "Texts cut to the token budget")
        self._families = (succeeded, failed, texts, tokens, truncated)  # keep them alive
        self.succeeded = succeeded.Metric(labels=labels)
        self.failed = {r: failed.Metric(labels={**labels, "reason": r}) for r in FAILURE_REASONS}
        self.texts = texts.Metric(labels=labels)
        self.tokens = tokens.Metric(labels=labels)
        self.truncated = truncated.Metric(labels=labels)

    def success(self, texts: int = 0, tokens: int = 0, truncated: int = 0) -> None:
        """Count one successful request."""
        self.succeeded.increment(1)
        if texts:
            self.texts.increment(texts)
        if tokens:
            self.tokens.increment(tokens)
        if truncated:
            self.truncated.increment(truncated)

    def failure(self, exc: BaseException) -> None:
        """Count one failed request under its reason."""
        self.failed[failure_reason(exc)].increment(1)
