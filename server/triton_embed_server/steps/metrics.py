"""Custom Prometheus metrics of the serving steps, served on Triton's metrics endpoint.

Triton 2.51's own counters cannot be used to count bad requests: a Python-backend model that
answers a request with an error is counted in ``nv_inference_request_success`` of that model
(triton-inference-server/server issues #7713, #8521), and the ensemble counts each failed
request twice in ``nv_inference_request_failure`` (``curl <metrics port>/metrics`` after one
bad request shows both). These families count outcomes as this product defines them.

Every family has the labels ``model`` (``tokenizer`` or ``embedder``) and ``model_instance``
(Triton's instance name, e.g. ``embedder_0_1``; not ``instance``, which Prometheus sets to
the scrape target).

Per request (both steps):

* ``triton_embed_requests_succeeded_total``, ``triton_embed_requests_failed_total{reason}``
  (``reason``: ``empty``, ``invalid_utf8``, ``too_long``, ``invalid_input``,
  ``invalid_token_ids``, ``too_much_work``, ``cancelled``, ``engine_error``, ``queue_full``,
  ``queue_timeout``, ``unloading``, ``internal``)
* ``triton_embed_texts_total``, ``triton_embed_tokens_total`` (tokens kept, special tokens
  included), ``triton_embed_texts_truncated_total`` (tokenizer only)

Per ``execute`` call (both steps), histograms:

* ``triton_embed_execute_seconds``: tokenization time on the tokenizer, engine time on the
  embedder (:data:`SECONDS_BUCKETS`)
* ``triton_embed_batch_texts``, ``triton_embed_batch_tokens``: texts and tokens of the
  successful requests of the call (:data:`TEXTS_BUCKETS`, :data:`TOKENS_BUCKETS`)

Per embedder instance (:class:`InstanceReporter`):

* ``triton_embed_tokens_per_second``: tokens embedded over the last ``cost_window_s`` seconds
  (:class:`ThroughputWindow`)
* ``triton_embed_hourly_price_usd``: this instance's share of the configured price
  (``hourly_price_usd / count``), exported only when a price is configured
* ``triton_embed_cost_per_million_tokens_usd``: :func:`cost_per_million_tokens` of the two
  above; NaN while the instance embedded nothing in the window
* ``triton_embed_numa_pages_total{numa_node, event}``: increments of
  ``/sys/devices/system/node/node<N>/numastat`` (pages; ``event`` in :data:`NUMA_EVENTS`) of
  the node(s) the instance runs on, counted from the instance's start
* ``triton_embed_instance_placement{numa_node, cpus, gpu}`` = 1: where the instance runs

Every update of a Python-backend metric is a blocking round trip from the stub to the
server process. Profiled under load (``perf/stub_profile.py``), the per-request increments
took a third of the tokenizer stub's samples, so ``execute`` only adds to in-process totals
and a background thread sends them every :data:`REPORT_INTERVAL_S` seconds: scraped values
are at most that much behind.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from pathlib import Path
from typing import Any

from triton_embed_server.host.topology import SYSFS_NODE_ROOT as NUMA_ROOT
from triton_embed_server.steps.errors import EmbedServingError

FAILURE_REASONS = (
    "empty", "invalid_utf8", "too_long", "invalid_input", "invalid_token_ids", "too_much_work",
    "cancelled", "engine_error", "queue_full", "queue_timeout", "unloading", "internal",
)  # fmt: skip
# Histogram upper bounds. Seconds: 0.5 ms (one short text, tokenizer) to 10 s (a full batch of
# 256 long texts on 2 CPU cores). Texts: powers of 2 up to max_batch_size 256. Tokens: up to
# max_num_batched_tokens 16384 and beyond (a batch of 256 x 256 tokens is 65536).
SECONDS_BUCKETS = [
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
]
TEXTS_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
TOKENS_BUCKETS = [16, 64, 256, 1024, 4096, 16384, 65536]
NUMA_EVENTS = (
    "numa_hit",
    "numa_miss",
    "numa_foreign",
    "interleave_hit",
    "local_node",
    "other_node",
)
REPORT_INTERVAL_S = 1.0


def failure_reason(exc: BaseException) -> str:
    """The ``reason`` label of an exception (``internal`` for foreign ones)."""
    return exc.reason if isinstance(exc, EmbedServingError) else "internal"


def cost_per_million_tokens(hourly_price_usd: float, tokens_per_s: float) -> float:
    """USD per million tokens at a price per hour and a throughput.

    ``cost = hourly_price_usd * 1e6 / (3600 * tokens_per_s)``; NaN when ``tokens_per_s`` is 0
    (no throughput, no defined cost per token).
    """
    if tokens_per_s <= 0:
        return math.nan
    return hourly_price_usd * 1e6 / (3600.0 * tokens_per_s)


class ThroughputWindow:
    """Tokens per second over a sliding window of ``window_s`` seconds.

    Thread-safe: :meth:`add` is called by ``execute``, :meth:`rate` by the reporter thread.
    Until ``window_s`` has passed since the window was created, the rate is over the time
    elapsed so far.
    """

    def __init__(self, window_s: float, clock=time.monotonic):
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._clock = clock
        self._start = clock()
        self._events: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def add(self, tokens: int) -> None:
        """Record ``tokens`` processed now."""
        with self._lock:
            self._events.append((self._clock(), tokens))

    def rate(self) -> float:
        """Tokens per second over the window ending now."""
        now = self._clock()
        with self._lock:
            while self._events and self._events[0][0] <= now - self.window_s:
                self._events.popleft()
            total = sum(n for _, n in self._events)
        span = min(self.window_s, now - self._start)
        return total / span if span > 0 else 0.0


def read_numastat(node: int, root: Path = NUMA_ROOT) -> dict[str, int]:
    """One NUMA node's allocation counters (pages since boot) from ``nodeN/numastat``.

    Raises:
        OSError: the file does not exist (no NUMA support in this kernel or container).
    """
    counters = {}
    for line in (root / f"node{node}" / "numastat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key in NUMA_EVENTS and value.strip().isdigit():
            counters[key] = int(value)
    return counters


class StepMetrics:
    """The metrics of one model instance.

    Args:
        pb_utils: the stub's ``triton_python_backend_utils`` (or a stand-in with
            ``MetricFamily``).
        model: ``model`` label.
        instance: ``model_instance`` label.
    """

    def __init__(
        self, pb_utils: Any, model: str, instance: str, interval_s: float = REPORT_INTERVAL_S
    ):
        family = pb_utils.MetricFamily
        self._family_cls = family
        self.labels = {"model": model, "model_instance": instance}
        self._families: list[Any] = []  # keep them alive as long as their metrics

        failed = self.family(
            "triton_embed_requests_failed_total", "Requests answered with an error, by reason"
        )
        self.succeeded = self.metric(
            "triton_embed_requests_succeeded_total", "Requests answered with outputs"
        )
        self.failed = {
            r: failed.Metric(labels={**self.labels, "reason": r}) for r in FAILURE_REASONS
        }
        self.texts = self.metric("triton_embed_texts_total", "Texts of successful requests")
        self.tokens = self.metric(
            "triton_embed_tokens_total",
            "Tokens kept of successful requests (special tokens included)",
        )
        self.truncated = self.metric(
            "triton_embed_texts_truncated_total", "Texts cut to the token budget"
        )
        self.execute_seconds = self.metric(
            "triton_embed_execute_seconds",
            "Seconds per execute call (tokenizer: tokenization; embedder: engine)",
            kind="HISTOGRAM",
            buckets=SECONDS_BUCKETS,
        )
        self.batch_texts = self.metric(
            "triton_embed_batch_texts",
            "Texts per execute call",
            kind="HISTOGRAM",
            buckets=TEXTS_BUCKETS,
        )
        self.batch_tokens = self.metric(
            "triton_embed_batch_tokens",
            "Tokens per execute call",
            kind="HISTOGRAM",
            buckets=TOKENS_BUCKETS,
        )
        self.interval_s = interval_s
        self._lock = threading.Lock()
        # pending increments by key (stub metric objects are not used as dict keys)
        self._counters = {
            "succeeded": self.succeeded,
            "texts": self.texts,
            "tokens": self.tokens,
            "truncated": self.truncated,
            **{f"failed:{r}": m for r, m in self.failed.items()},
        }
        self._counts: collections.Counter[str] = collections.Counter()
        self._observed: list[tuple[Any, float]] = []
        self._hooks: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="triton-embed-metrics", daemon=True)
        self._started = False

    def family(self, name: str, description: str, kind: str = "COUNTER") -> Any:
        """Create (and keep alive) a ``MetricFamily`` of ``kind`` (COUNTER, GAUGE, HISTOGRAM)."""
        fam = self._family_cls(
            name=name, description=description, kind=getattr(self._family_cls, kind)
        )
        self._families.append(fam)
        return fam

    def metric(
        self,
        name: str,
        description: str,
        kind: str = "COUNTER",
        labels: dict | None = None,
        buckets: list | None = None,
    ) -> Any:
        """One metric of a new family, labelled with this instance's labels plus ``labels``."""
        fam = self.family(name, description, kind)
        labels = {**self.labels, **(labels or {})}
        return fam.Metric(labels=labels, buckets=buckets) if buckets else fam.Metric(labels=labels)

    def success(self, texts: int = 0, tokens: int = 0, truncated: int = 0) -> None:
        """Count one successful request (sent at the next flush)."""
        with self._lock:
            self._counts.update(
                {"succeeded": 1, "texts": texts, "tokens": tokens, "truncated": truncated}
            )

    def failure(self, exc: BaseException) -> None:
        """Count one failed request under its reason (sent at the next flush)."""
        with self._lock:
            self._counts[f"failed:{failure_reason(exc)}"] += 1

    def execute_done(self, seconds: float, texts: int, tokens: int) -> None:
        """Observe one execute call: its step time and the texts/tokens it answered."""
        with self._lock:
            self._observed.append((self.execute_seconds, seconds))
            if texts:
                self._observed += [(self.batch_texts, texts), (self.batch_tokens, tokens)]

    def every_flush(self, hook) -> None:
        """Also call ``hook()`` after each flush (gauges that are refreshed periodically)."""
        self._hooks.append(hook)

    def flush(self) -> None:
        """Send the pending increments and observations to Triton."""
        with self._lock:
            counts, self._counts = self._counts, collections.Counter()
            observed, self._observed = self._observed, []
        for key, n in counts.items():
            if n > 0:
                self._counters[key].increment(n)
        for metric, value in observed:
            metric.observe(value)

    def start(self) -> StepMetrics:
        """Start the thread that flushes every ``interval_s`` seconds and runs the hooks.

        Call it from ``execute`` (:meth:`ensure_started`), never from ``initialize``: a metric
        call from another thread while the stub's ``initialize`` reply is still on its way
        to tritonserver can hang the model's load for ever (seen: the load stalled after
        every stub had logged the end of its ``initialize``, and the stuck stub was inside
        ``Metric::SendSetValueRequest``; python_backend r24.10 waits for the reply with no
        deadline). The first ``execute`` comes after the load is complete.
        """
        self._thread.start()
        return self

    def ensure_started(self) -> None:
        """:meth:`start` once (cheap to call at the top of every ``execute``)."""
        if not self._started:
            self._started = True
            self.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
                for hook in self._hooks:
                    hook()
            except Exception:  # noqa: BLE001 - a metrics hiccup must never stop serving
                pass

    def stop(self) -> None:
        """Stop the thread, send what is pending and let go of the thread and the hooks.

        Call it from the model's ``finalize``: the thread (its target is a bound method of
        this object) and the hooks (bound methods of the :class:`InstanceReporter`) hold
        reference cycles, so without this the families would be freed by the garbage
        collector at interpreter exit, after the stub's link to Triton is gone, which
        crashes the Triton 2.51 stub (``Metric::SaveToSharedMemory`` in
        ``~MetricFamily``: "Segfault encountered" in the log at every shutdown).
        """
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)
        self.flush()
        self._thread = None
        self._hooks.clear()


class InstanceReporter:
    """Placement, throughput, cost and NUMA metrics of one embedder instance.

    :meth:`add_tokens` is called from ``execute``; the gauges and the NUMA counters are
    refreshed after every flush of ``step`` (:meth:`StepMetrics.every_flush`).

    Args:
        step: the instance's :class:`StepMetrics` (its labels and families are reused).
        numa_nodes: nodes whose ``numastat`` this instance reports (those it runs on).
        placement: ``numa_node``, ``cpus`` and ``gpu`` label values of the placement gauge.
        hourly_price_usd: this instance's share of the host/GPU price; 0 = not configured
            (no price or cost gauges).
        window_s: the throughput window.
        numa_root: sysfs node folder (tests pass a copy).
    """

    def __init__(
        self,
        step: StepMetrics,
        numa_nodes: list[int],
        placement: dict[str, str],
        hourly_price_usd: float = 0.0,
        window_s: float = 60.0,
        numa_root: Path = NUMA_ROOT,
    ):
        self.window = ThroughputWindow(window_s)
        self.price = hourly_price_usd
        self.numa_root = numa_root
        step.metric(
            "triton_embed_instance_placement",
            "1 for where this instance runs",
            kind="GAUGE",
            labels=placement,
        ).set(1)
        self.tokens_per_s = step.metric(
            "triton_embed_tokens_per_second",
            f"Tokens embedded per second over the last {window_s:g} s",
            kind="GAUGE",
        )
        self.cost = self.hourly = None
        if hourly_price_usd > 0:
            self.hourly = step.metric(
                "triton_embed_hourly_price_usd",
                "This instance's share of the configured hourly price, USD",
                kind="GAUGE",
            )
            self.hourly.set(hourly_price_usd)
            self.cost = step.metric(
                "triton_embed_cost_per_million_tokens_usd",
                "hourly price share * 1e6 / (3600 * tokens per second)",
                kind="GAUGE",
            )
        pages = step.family(
            "triton_embed_numa_pages_total",
            "NUMA allocation events of the instance's node(s) since it started, pages",
        )
        self._numa: dict[tuple[int, str], Any] = {}
        self._numa_last: dict[tuple[int, str], int] = {}
        for node in numa_nodes:
            try:
                start = read_numastat(node, numa_root)
            except OSError:
                continue  # no NUMA statistics here: nothing to report for this node
            for event, value in start.items():
                key = (node, event)
                self._numa[key] = pages.Metric(
                    labels={**step.labels, "numa_node": str(node), "event": event}
                )
                self._numa_last[key] = value
        self.refresh()
        step.every_flush(self.refresh)

    def add_tokens(self, tokens: int) -> None:
        """Record tokens embedded now."""
        self.window.add(tokens)

    def refresh(self) -> None:
        """Set the gauges and add the NUMA counters' increments since the last refresh."""
        rate = self.window.rate()
        self.tokens_per_s.set(rate)
        if self.cost is not None:
            self.cost.set(cost_per_million_tokens(self.price, rate))
        for node in {n for n, _ in self._numa}:
            try:
                now = read_numastat(node, self.numa_root)
            except OSError:
                continue
            for event, value in now.items():
                key = (node, event)
                if key in self._numa and value > self._numa_last[key]:
                    self._numa[key].increment(value - self._numa_last[key])
                    self._numa_last[key] = value
