from __future__ import annotations

from types import SimpleNamespace

from triton_embed.serving.errors import EmptyTextError, EngineError
from triton_embed.serving.metrics import FAILURE_REASONS, StepMetrics, failure_reason
from triton_embed.serving.supervisor import option_value, server_arguments, stub_model_name


def test_stub_model_name_reads_the_model_folder():
    cmd = ["/x/backends/python/triton_python_backend_stub", "/repo/model_repository/embedder/1/model.py",
           "triton_python_backend_shm_region_1", "1048576", "1048576", "123", "/x", "336", "embedder_0_1", "DEFAULT"]
    assert stub_model_name(cmd) == "embedder"
    assert stub_model_name(["/usr/bin/python", "x.py"]) is None
    assert stub_model_name([]) is None


def test_option_value_last_wins_and_equals_form():
    args = ["--http-port", "1", "--grpc-port=5", "--http-port=9"]
    assert option_value(args, "--http-port", "8000") == "9"
    assert option_value(args, "--grpc-port", "8001") == "5"
    assert option_value(args, "--metrics-port", "8002") == "8002"


def test_server_arguments_adds_explicit_model_control_unless_given():
    assert server_arguments(["--model-repository", "r"]) == [
        "--model-repository", "r", "--model-control-mode", "explicit", "--load-model", "*"]
    assert server_arguments(["--model-control-mode=poll"]) == ["--model-control-mode=poll"]


class FakeMetric:
    def __init__(self, labels):
        self.labels, self.value = labels, 0

    def increment(self, n):
        self.value += n


class FakeFamily:
    COUNTER = "counter"
    created: list = []

    def __init__(self, name, description, kind):
        self.name, self.metrics = name, []
        FakeFamily.created.append(self)

    def Metric(self, labels):  # noqa: N802 - pb_utils' name
        m = FakeMetric(labels)
        self.metrics.append(m)
        return m


def test_step_metrics_count_successes_and_failures_by_reason():
    FakeFamily.created = []
    metrics = StepMetrics(SimpleNamespace(MetricFamily=FakeFamily), "tokenizer", "tokenizer_0_0")
    metrics.success(texts=3, tokens=40, truncated=1)
    metrics.failure(EmptyTextError("x"))
    metrics.failure(EngineError("y"))
    metrics.failure(RuntimeError("z"))
    by_name = {f.name: f for f in FakeFamily.created}
    assert by_name["triton_embed_requests_succeeded_total"].metrics[0].value == 1
    assert by_name["triton_embed_texts_total"].metrics[0].value == 3
    assert by_name["triton_embed_tokens_total"].metrics[0].value == 40
    assert by_name["triton_embed_texts_truncated_total"].metrics[0].value == 1
    failed = {m.labels["reason"]: m.value for m in by_name["triton_embed_requests_failed_total"].metrics}
    assert set(failed) == set(FAILURE_REASONS)
    assert failed == {**{r: 0 for r in FAILURE_REASONS}, "empty": 1, "engine_error": 1, "internal": 1}
    assert by_name["triton_embed_texts_total"].metrics[0].labels == {"model": "tokenizer", "instance": "tokenizer_0_0"}
    assert failure_reason(ValueError()) == "internal"
