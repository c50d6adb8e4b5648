"""The serving steps' metrics with a stand-in for pb_utils.MetricFamily: counters, histograms,
the throughput window, the cost formula, NUMA counters and the placement gauge."""

from __future__ import annotations

import math
import shutil
from types import SimpleNamespace

import pytest
from triton_embed_server.steps.errors import EmptyTextError, EngineError
from triton_embed_server.steps.metrics import (
    FAILURE_REASONS,
    NUMA_EVENTS,
    SECONDS_BUCKETS,
    InstanceReporter,
    StepMetrics,
    ThroughputWindow,
    cost_per_million_tokens,
    failure_reason,
    read_numastat,
)


class FakeMetric:
    def __init__(self, labels, buckets):
        self.labels, self.buckets, self.value, self.observed = labels, buckets, 0, []

    def increment(self, n):
        assert n >= 0, "counters only go up"
        self.value += n

    def set(self, v):
        self.value = v

    def observe(self, v):
        self.observed.append(v)


class FakeFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, name, description, kind):
        self.name, self.kind, self.metrics = name, kind, []
        CREATED.append(self)

    def Metric(self, labels, buckets=None):  # noqa: N802 - pb_utils' name
        assert (buckets is not None) == (self.kind == "histogram"), "buckets exactly for histograms"
        m = FakeMetric(labels, buckets)
        self.metrics.append(m)
        return m


CREATED: list[FakeFamily] = []
PB = SimpleNamespace(MetricFamily=FakeFamily)


def families():
    return {f.name: f for f in CREATED}


@pytest.fixture(autouse=True)
def fresh():
    CREATED.clear()


def test_step_metrics_count_successes_and_failures_by_reason():
    metrics = StepMetrics(PB, "tokenizer", "tokenizer_0_0")
    metrics.success(texts=3, tokens=40, truncated=1)
    metrics.failure(EmptyTextError("x"))
    metrics.failure(EngineError("y"))
    metrics.failure(RuntimeError("z"))
    by_name = families()
    # nothing reaches Triton until the flush (each update is a round trip to the server)
    assert by_name["triton_embed_requests_succeeded_total"].metrics[0].value == 0
    metrics.flush()
    assert by_name["triton_embed_requests_succeeded_total"].metrics[0].value == 1
    assert by_name["triton_embed_texts_total"].metrics[0].value == 3
    assert by_name["triton_embed_tokens_total"].metrics[0].value == 40
    assert by_name["triton_embed_texts_truncated_total"].metrics[0].value == 1
    failed = {
        m.labels["reason"]: m.value for m in by_name["triton_embed_requests_failed_total"].metrics
    }
    assert failed == {
        **{r: 0 for r in FAILURE_REASONS},
        "empty": 1,
        "engine_error": 1,
        "internal": 1,
    }
    # `instance` is Prometheus' scrape-target label: ours is model_instance
    assert by_name["triton_embed_texts_total"].metrics[0].labels == {
        "model": "tokenizer",
        "model_instance": "tokenizer_0_0",
    }
    assert failure_reason(ValueError()) == "internal"


def test_execute_histograms_observe_time_texts_and_tokens():
    metrics = StepMetrics(PB, "embedder", "embedder_0_1")
    metrics.execute_done(0.012, texts=16, tokens=800)
    metrics.execute_done(0.003, texts=0, tokens=0)  # every request failed: time only
    metrics.flush()
    by_name = families()
    assert by_name["triton_embed_execute_seconds"].kind == "histogram"
    assert by_name["triton_embed_execute_seconds"].metrics[0].observed == [0.012, 0.003]
    assert by_name["triton_embed_execute_seconds"].metrics[0].buckets == SECONDS_BUCKETS
    assert by_name["triton_embed_batch_texts"].metrics[0].observed == [16]
    assert by_name["triton_embed_batch_tokens"].metrics[0].observed == [800]


def test_cost_per_million_tokens_formula():
    # $3.60/h at 1,000 tokens/s = 3.6M tokens/h -> $1 per million tokens
    assert cost_per_million_tokens(3.6, 1000.0) == pytest.approx(1.0)
    # $0.50/h at 7,330 tokens/s (26.388M tokens/h) -> $0.018948 per million tokens
    assert cost_per_million_tokens(0.5, 7330.0) == pytest.approx(0.018948, rel=1e-4)
    assert math.isnan(cost_per_million_tokens(3.6, 0.0))


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_throughput_window_slides():
    clock = Clock()
    window = ThroughputWindow(10.0, clock)
    clock.t += 2
    window.add(400)
    assert window.rate() == pytest.approx(200.0)  # 400 tokens over the 2 s so far
    clock.t += 8
    window.add(600)
    assert window.rate() == pytest.approx(100.0)  # 1000 over the full 10 s window
    clock.t += 5
    assert window.rate() == pytest.approx(60.0)  # the first 400 fell out of the window
    clock.t += 10
    assert window.rate() == 0.0
    with pytest.raises(ValueError, match="window_s must be > 0"):
        ThroughputWindow(0)


def fake_node_root(tmp_path, values):
    for node, counters in values.items():
        folder = tmp_path / f"node{node}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "numastat").write_text("".join(f"{k} {v}\n" for k, v in counters.items()))
    return tmp_path


def test_read_numastat_parses_the_kernel_file(tmp_path):
    root = fake_node_root(tmp_path, {0: {e: i * 10 for i, e in enumerate(NUMA_EVENTS)}})
    assert read_numastat(0, root) == {e: i * 10 for i, e in enumerate(NUMA_EVENTS)}
    with pytest.raises(OSError):
        read_numastat(3, root)


def test_read_numastat_of_this_machine():
    from triton_embed_server.steps.metrics import NUMA_ROOT

    if not (NUMA_ROOT / "node0" / "numastat").exists():
        pytest.skip("this kernel exposes no NUMA statistics")
    counters = read_numastat(0)
    assert set(counters) == set(NUMA_EVENTS) and counters["numa_hit"] > 0


def test_instance_reporter_gauges_cost_and_numa_increments(tmp_path):
    base = {e: 100 for e in NUMA_EVENTS}
    root = fake_node_root(tmp_path, {0: base})
    step = StepMetrics(PB, "embedder", "embedder_0_0")
    reporter = InstanceReporter(
        step,
        [0, 5],
        {"numa_node": "0", "cpus": "0", "gpu": "none"},
        hourly_price_usd=1.8,
        window_s=60,
        numa_root=root,
    )
    by_name = families()
    placement = by_name["triton_embed_instance_placement"].metrics[0]
    assert placement.value == 1 and placement.labels == {
        "model": "embedder",
        "model_instance": "embedder_0_0",
        "numa_node": "0",
        "cpus": "0",
        "gpu": "none",
    }
    assert by_name["triton_embed_hourly_price_usd"].metrics[0].value == 1.8
    # node 5 has no numastat file: skipped, not a crash
    assert {
        (m.labels["numa_node"], m.labels["event"])
        for m in by_name["triton_embed_numa_pages_total"].metrics
    } == {("0", e) for e in NUMA_EVENTS}
    reporter.refresh()
    assert math.isnan(by_name["triton_embed_cost_per_million_tokens_usd"].metrics[0].value)
    reporter.window._start -= 59.0  # the window is full
    reporter.add_tokens(60_000)  # 1,000 tokens/s over 60 s
    fake_node_root(tmp_path, {0: {**base, "numa_hit": 150, "numa_miss": 107}})
    reporter.refresh()
    assert by_name["triton_embed_tokens_per_second"].metrics[0].value == pytest.approx(
        1000, rel=0.02
    )
    assert by_name["triton_embed_cost_per_million_tokens_usd"].metrics[0].value == pytest.approx(
        0.5, rel=0.02
    )
    pages = {m.labels["event"]: m.value for m in by_name["triton_embed_numa_pages_total"].metrics}
    assert pages == {**{e: 0 for e in NUMA_EVENTS}, "numa_hit": 50, "numa_miss": 7}


def test_instance_reporter_without_price_exports_no_cost(tmp_path):
    step = StepMetrics(PB, "embedder", "embedder_0_0")
    InstanceReporter(
        step, [], {"numa_node": "unknown", "cpus": "0-1", "gpu": "none"}, numa_root=tmp_path
    )
    assert "triton_embed_cost_per_million_tokens_usd" not in families()
    assert "triton_embed_hourly_price_usd" not in families()


def test_flush_thread_sends_counts_runs_hooks_and_flushes_on_stop(tmp_path):
    import time

    step = StepMetrics(PB, "embedder", "embedder_0_0", interval_s=0.05)
    InstanceReporter(
        step, [], {"numa_node": "0", "cpus": "0", "gpu": "none"}, window_s=1, numa_root=tmp_path
    )
    step.start()
    step.success(texts=2, tokens=10)
    time.sleep(0.3)
    by_name = families()
    assert by_name["triton_embed_tokens_total"].metrics[0].value == 10
    step.success(texts=1, tokens=5)
    thread = step._thread
    step.stop()  # the remainder is sent at stop; the thread and hooks are let go
    assert not thread.is_alive() and step._thread is None and step._hooks == []
    assert by_name["triton_embed_tokens_total"].metrics[0].value == 15
    assert by_name["triton_embed_requests_succeeded_total"].metrics[0].value == 2


def test_no_flush_thread_runs_until_the_first_execute_and_then_exactly_one():
    # A metric call from a second thread during initialize can hang Triton 2.51's load
    # (StepMetrics.start): the thread starts with the first execute, once.
    import threading

    before = {t.ident for t in threading.enumerate()}
    step = StepMetrics(PB, "tokenizer", "tokenizer_0_0", interval_s=60)
    assert not step._thread.is_alive()
    assert {t.ident for t in threading.enumerate()} == before
    step.ensure_started()
    step.ensure_started()
    started = [t for t in threading.enumerate() if t.ident not in before]
    assert [t.name for t in started] == ["triton-embed-metrics"]
    step.stop()
    assert not started[0].is_alive() and step._thread is None


def test_failed_counts_batch_per_flush():
    step = StepMetrics(PB, "tokenizer", "tokenizer_0_0")
    for _ in range(3):
        step.failure(EmptyTextError("x"))
    step.flush()
    step.flush()  # nothing new: no increment of 0
    failed = {
        m.labels["reason"]: m.value
        for m in families()["triton_embed_requests_failed_total"].metrics
    }
    assert failed["empty"] == 3 and sum(failed.values()) == 3


def test_missing_numa_root_reports_no_numa_counters(tmp_path):
    shutil.rmtree(tmp_path)  # a kernel without NUMA statistics
    step = StepMetrics(PB, "embedder", "embedder_0_0")
    InstanceReporter(
        step, [0], {"numa_node": "0", "cpus": "0", "gpu": "none"}, numa_root=tmp_path
    ).refresh()
    assert families()["triton_embed_numa_pages_total"].metrics == []
    assert families()["triton_embed_instance_placement"].metrics[0].value == 1
