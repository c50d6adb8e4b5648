"""The gateway's own Prometheus metrics, in their own registry, served at ``GET /metrics``.

Families (docs/operations.md, "Metric catalogue"):

* ``triton_embed_gateway_requests_total{route, model, status}``: answered requests; ``route``
  is the path (``/v1/embeddings``, ``/embed``, ...), ``model`` the ensemble name the request
  resolved to ("" before a model was known: bad JSON, refused key, unknown model),
  ``status`` the HTTP status (``499``, nginx's "client closed request": the client went
  away before its answer; ``route=""``: refused before its path was read, 408 or 431,
  :mod:`~triton_embed_server.gateway.protocol`);
* ``triton_embed_gateway_request_duration_seconds{route}``: histogram of the time from the
  request's arrival to its answer;
* ``triton_embed_gateway_inputs_total{route, model}``: inputs of the answered requests
  (200): texts (or token-ID lists) of an embedding route, query-document pairs of a rerank
  or score route (``/v1/rerank``, ``/v2/rerank``, ``/rerank``, ``/score``);
* ``triton_embed_gateway_tokens_total{route, model}``: their tokens, the sum of the
  ensemble's ``NUM_TOKENS`` (what ``usage`` reports);
* ``triton_embed_gateway_in_flight``: requests in the gateway now (what ``--max-in-flight``
  bounds);
* ``triton_embed_gateway_upstream_up{upstream}``: 1 while an upstream (``ip:port``) is
  ready and used, 0 while it is taken out;
* ``triton_embed_gateway_upstream_retries_total``: upstream calls sent again to another
  upstream after the first one failed (unreachable, or its queue full);
* ``triton_embed_gateway_tenant_requests_total{tenant, status}``: answered requests of a
  tenant (``tenant=""``: no key or an unknown one, 401);
* ``triton_embed_gateway_tenant_texts_total{tenant}``, ``..._tenant_tokens_total{tenant}``:
  texts (or pairs) and tokens it was served (answered 200);
* ``triton_embed_gateway_tenant_cost_usd_total{tenant}``: their cost
  (``usd_per_million_tokens`` of the tenants file);
* ``triton_embed_gateway_tenant_refusals_total{tenant, reason}``: requests refused for the
  tenant's own limits or rights: ``unauthorized`` (401), ``model_not_allowed`` (403),
  ``rate_limited`` (429 over its token rate), ``overloaded`` (429 of the gateway or server);
* ``triton_embed_gateway_tenant_errors_total{tenant, status}``: its requests answered 5xx;
* ``triton_embed_gateway_merged_requests``: histogram of requests per upstream call of
  request merging (``--merge-in-flight``; 1: a request sent alone,
  :mod:`~triton_embed_server.gateway.merging`).

:class:`GatewayMetrics` is also the upstream pool's observer
(:class:`triton_embed.transport.observer.PoolObserver`), which the gateway passes in.

With ``--workers N`` the workers count in prometheus_client's multiprocess mode: the parent
sets :data:`MULTIPROC_ENV` to the workers' private shared folder before they start (the
library chooses where values live when it is imported), each worker writes its values to
its own files there, and ``/metrics`` of any worker renders all of them
(``MultiProcessCollector``): counters and histograms summed over every worker that ever
ran, ``in_flight`` summed over the live ones (``livesum``; the files of a dead worker's
live gauges are removed, ``mark_process_dead``, at the next scrape). ``upstream_up`` is no
sum: every worker checks every upstream itself (every 2 s), and the scrape shows the view
of the worker that answers it (a collector of this module, so that an upstream DNS no
longer returns leaves no series, which multiprocess files cannot forget). The
``*_created`` series are not served in either mode. With one worker nothing of this applies.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
#: Request duration buckets, seconds: one short request is a few ms, 2,048 texts seconds.
DURATION_BUCKETS_S = (
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Requests per merged call: up to the ensemble's max_batch_size (64) single-text requests.
MERGED_REQUESTS_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: The refusals counted by status alone (429 by its cause: :meth:`count_refusal`).
REFUSAL_REASONS = {401: "unauthorized", 403: "model_not_allowed"}
_KINDS = {COUNTER: Counter, GAUGE: Gauge, HISTOGRAM: Histogram}
#: prometheus_client's multiprocess folder variable (read when the library is imported).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: A live gauge's file in the multiprocess folder: ``gauge_live<mode>_<pid>.db``.
_LIVE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db$")


class ProcessGauge:
    """A gauge whose values are this process's alone, in every mode: a collector.

    For a value each worker knows for itself and that no sum or extreme of workers would
    mean (``upstream_up``); unlike a multiprocess-mode gauge, a series can be removed.
    ``labels(...).set(v)`` and ``remove(...)`` as a ``prometheus_client`` Gauge.

    Args:
        name: the family's name.
        documentation: its help text.
        labelnames: its label names.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]):
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}

    def labels(self, *values: str) -> _ProcessGaugeChild:
        """The series of these label values."""
        return _ProcessGaugeChild(self.values, tuple(str(v) for v in values))

    def remove(self, *values: str) -> None:
        """Drop the series of these label values.

        Raises:
            KeyError: there is none.
        """
        del self.values[tuple(str(v) for v in values)]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The family, for a registry."""
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, value in sorted(self.values.items()):
            family.add_metric(values, value)
        yield family


class _ProcessGaugeChild:
    def __init__(self, values: dict[tuple[str, ...], float], key: tuple[str, ...]):
        self.values, self.key = values, key

    def set(self, value: float) -> None:
        self.values[self.key] = float(value)


def reap_dead_workers(folder: str) -> list[int]:
    """Remove the live-gauge files of processes that no longer run (``mark_process_dead``).

    Returns:
        The pids whose files were removed.
    """
    dead = set()
    for path in glob.glob(os.path.join(folder, "gauge_live*_*.db")):
        match = _LIVE_FILE.search(os.path.basename(path))
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            dead.add(pid)
        except PermissionError:
            pass
    for pid in dead:
        multiprocess.mark_process_dead(pid, folder)
    return sorted(dead)


def metric(
    name: str,
    documentation: str,
    labels: Sequence[str] = (),
    *,
    kind: str,
    registry: CollectorRegistry,
    per_process: bool = False,
    **options: Any,
) -> Any:
    """Create one family in ``registry``: a ``prometheus_client`` Counter, Gauge or Histogram.

    Args:
        name: the family's full name (a counter's ``_total`` included).
        documentation: its help text.
        labels: its label names.
        kind: :data:`COUNTER`, :data:`GAUGE` or :data:`HISTOGRAM`.
        registry: where it is registered.
        per_process: a gauge of this process's own values in every mode
            (:class:`ProcessGauge`), not summed over ``--workers``.
        **options: passed on (``buckets=`` of a histogram, ``multiprocess_mode=`` of a gauge).
    """
    if per_process:
        if kind != GAUGE:
            raise ValueError(f"{name}: only a gauge can be per process, not a {kind}")
        gauge = ProcessGauge(name, documentation, labels)
        registry.register(gauge)
        return gauge
    return _KINDS[kind](name, documentation, labels, registry=registry, **options)


class GatewayMetrics:
    """The gateway's families in a registry of their own; the upstream pool's observer.

    Implements :class:`triton_embed.transport.observer.PoolObserver`: the pool reports
    upstreams in and out (``upstream_up``) and calls sent again (``retries``).

    Attributes:
        registry: the ``CollectorRegistry`` of this process's families (what ``/metrics``
            renders with one worker).
        multiproc_dir: the workers' multiprocess folder (:data:`MULTIPROC_ENV`), or ``None``.
    """

    def __init__(self) -> None:
        disable_created_metrics()  # no *_created series: the gateway is a process of its own
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiproc_dir = os.environ.get(MULTIPROC_ENV)

        def family(name: str, documentation: str, *labels: str, kind: str, **options: Any) -> Any:
            return metric(name, documentation, labels, kind=kind, registry=self.registry, **options)

        self.requests = family(
            "triton_embed_gateway_requests_total",
            "Requests answered by the gateway, by route, resolved model and HTTP status.",
            *("route", "model", "status"),
            kind="counter",
        )
        self.duration = family(
            "triton_embed_gateway_request_duration_seconds",
            "Seconds from a request's arrival at the gateway to its answer.",
            "route",
            kind="histogram",
            buckets=DURATION_BUCKETS_S,
        )
        self.inputs = family(
            "triton_embed_gateway_inputs_total",
            "Inputs of answered requests: texts embedded, or query-document pairs scored.",
            *("route", "model"),
            kind="counter",
        )
        self.tokens = family(
            "triton_embed_gateway_tokens_total",
            "Tokens of answered requests (the sum of NUM_TOKENS, as usage reports it).",
            *("route", "model"),
            kind="counter",
        )
        self.in_flight = family(
            "triton_embed_gateway_in_flight",
            "Requests in the gateway now.",
            kind="gauge",
            multiprocess_mode="livesum",
        )
        self.upstream_up = family(
            "triton_embed_gateway_upstream_up",
            "1 while the upstream (ip:port) is ready and used, 0 while it is taken out (with "
            "--workers N: as the worker answering the scrape sees it; each checks every 2 s).",
            "upstream",
            kind="gauge",
            per_process=True,
        )
        self.retries = family(
            "triton_embed_gateway_upstream_retries_total",
            "Upstream calls sent again to another upstream after the first one failed.",
            kind="counter",
        )
        self.tenant_requests = family(
            "triton_embed_gateway_tenant_requests_total",
            "Requests answered by the gateway, by tenant and HTTP status.",
            *("tenant", "status"),
            kind="counter",
        )
        self.tenant_texts = family(
            "triton_embed_gateway_tenant_texts_total",
            "Texts (or query-document pairs) served to a tenant.",
            "tenant",
            kind="counter",
        )
        self.tenant_tokens = family(
            "triton_embed_gateway_tenant_tokens_total",
            "Tokens served to a tenant (the sum of NUM_TOKENS).",
            "tenant",
            kind="counter",
        )
        self.tenant_cost = family(
            "triton_embed_gateway_tenant_cost_usd_total",
            "USD cost of the tokens served to a tenant (usd_per_million_tokens).",
            "tenant",
            kind="counter",
        )
        self.tenant_refusals = family(
            "triton_embed_gateway_tenant_refusals_total",
            "Requests of a tenant refused, by reason.",
            *("tenant", "reason"),
            kind="counter",
        )
        self.tenant_errors = family(
            "triton_embed_gateway_tenant_errors_total",
            "Requests of a tenant answered with a server error (5xx), by status.",
            *("tenant", "status"),
            kind="counter",
        )
        self.merged_requests = family(
            "triton_embed_gateway_merged_requests",
            "Requests per upstream call of the ensemble made by request merging (1: alone).",
            kind="histogram",
            buckets=MERGED_REQUESTS_BUCKETS,
        )

    def observe_tenant(
        self, tenant: str, status: int, texts: int, tokens: int, usd_per_million_tokens: float
    ) -> None:
        """Count one answered request of ``tenant``, and what it was served when 200."""
        self.tenant_requests.labels(tenant, str(status)).inc()
        if status == 200 and (texts or tokens):
            self.tenant_texts.labels(tenant).inc(texts)
            self.tenant_tokens.labels(tenant).inc(tokens)
            self.tenant_cost.labels(tenant).inc(tokens * usd_per_million_tokens / 1e6)
        reason = REFUSAL_REASONS.get(status)
        if reason is not None:
            self.tenant_refusals.labels(tenant, reason).inc()
        if status >= 500:
            self.tenant_errors.labels(tenant, str(status)).inc()

    def count_refusal(self, tenant: str, reason: str) -> None:
        """Count a refusal of ``tenant``'s request for ``reason`` (a 429's cause)."""
        self.tenant_refusals.labels(tenant, reason).inc()

    def observe(
        self, route: str, model: str, status: int, seconds: float, inputs: int = 0, tokens: int = 0
    ) -> None:
        """Count one answered request, and the inputs and tokens it had served (if any)."""
        self.requests.labels(route, model, str(status)).inc()
        self.duration.labels(route).observe(seconds)
        if inputs:
            self.inputs.labels(route, model).inc(inputs)
            self.tokens.labels(route, model).inc(tokens)

    def set_upstream(self, upstream: str, up: bool) -> None:
        """Record whether ``upstream`` is in use."""
        self.upstream_up.labels(upstream).set(1 if up else 0)

    def count_retry(self) -> None:
        """Count one upstream call sent again to another upstream."""
        self.retries.inc()

    def forget_upstream(self, upstream: str) -> None:
        """Drop the series of an upstream that DNS no longer returns."""
        try:
            self.upstream_up.remove(upstream)
        except KeyError:
            pass

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type: every worker's with ``--workers N``."""
        if self.multiproc_dir is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        reap_dead_workers(self.multiproc_dir)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, self.multiproc_dir)
        registry.register(self.upstream_up)
        return generate_latest(registry), CONTENT_TYPE_LATEST
