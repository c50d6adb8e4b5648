"""Does Triton 2.51's ensemble pass a request's priority to its steps? (a real tritonserver)

A two-step ensemble of plain Python-backend models, built here: ``first`` (a pass-through,
the tokenizer's place) then ``probe`` (the embedder's place: one instance, one request per
batch, the dynamic batcher's priority levels of :mod:`triton_embed.priority`), which answers
each request with its execution order and holds the instance 1 s for a ``block`` text.
Blocking requests fill ``probe``; then a ``batch`` request arrives, then an ``interactive``
one. When the instance frees, the step's priority queue serves the interactive one first,
sent to the step directly (the control) and through the ensemble (the question): in 2.51
the ensemble's requests to its steps carry the ensemble request's priority.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from triton_embed.priority import DEFAULT_PRIORITY_LEVEL, PRIORITY_LEVELS, Priority
from triton_embed_server.run.launcher import TritonServer

from tests.helpers import running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Seconds one ``block`` request holds ``probe``'s instance.
BLOCK_S = 1.0
#: Blocking requests sent first: more than the step's payload slots, so the batch and
#: interactive requests both wait in its priority queue.
BLOCKERS = 3

PASS_THROUGH = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("MIDDLE", text)]))
        return out
"""

PROBE = f"""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.done = 0

    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "MIDDLE").as_numpy().reshape(-1)[0]
            if bytes(text).startswith(b"block"):
                time.sleep({BLOCK_S})
            self.done += 1
            order = np.array([[self.done]], dtype=np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("ORDER", order)]))
        return out
"""


def _config(name: str, inp: str, out: str, dtype: str, batcher: str) -> str:
    return f"""name: "{name}"
backend: "python"
max_batch_size: 1
input [ {{ name: "{inp}", data_type: TYPE_STRING, dims: [ 1 ] }} ]
output [ {{ name: "{out}", data_type: {dtype}, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{batcher}
"""


ENSEMBLE = """name: "probe_ensemble"
platform: "ensemble"
max_batch_size: 1
input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "ORDER", data_type: TYPE_INT32, dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "first", model_version: -1,
      input_map { key: "TEXT", value: "TEXT" }, output_map { key: "MIDDLE", value: "mid" } },
    { model_name: "probe", model_version: -1,
      input_map { key: "MIDDLE", value: "mid" }, output_map { key: "ORDER", value: "ORDER" } }
  ]
}
"""


@pytest.fixture(scope="module")
def probe_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("priority") / "model_repository"
    # The levels as the shipped steps state them (triton_embed.priority, the one place).
    levels = (
        f"dynamic_batching {{ priority_levels: {PRIORITY_LEVELS} "
        f"default_priority_level: {DEFAULT_PRIORITY_LEVEL} }}"
    )
    models = {
        "first": (_config("first", "TEXT", "MIDDLE", "TYPE_STRING", levels), PASS_THROUGH),
        "probe": (_config("probe", "MIDDLE", "ORDER", "TYPE_INT32", levels), PROBE),
    }
    for name, (config, code) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(code)
    (repo / "probe_ensemble" / "1").mkdir(parents=True)
    (repo / "probe_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    with running(TritonServer(model_repository=repo, ready_timeout_s=240), "probe server") as srv:
        yield srv


def _orders(
    url: str, model: str, name: str, levels: tuple[int, int] | None = None
) -> dict[str, int]:
    """Send the blockers, then ``batch``, then ``interactive``; each one's execution order.

    ``levels``: the priority levels the two are sent at (default: their classes'; ``(0, 0)``:
    none sent, the control).
    """
    batch_level, interactive_level = levels or (Priority.BATCH.level, Priority.INTERACTIVE.level)
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    orders: dict[str, int] = {}
    errors: list[BaseException] = []
    done = threading.Event()
    expected = BLOCKERS + 2

    def send(label: str, text: bytes, priority: int) -> None:
        arr = np.array([[text]], dtype=object)
        tensor = grpcclient.InferInput(name, [1, 1], "BYTES")
        tensor.set_data_from_numpy(arr)

        def answered(result, error) -> None:
            if error is not None:
                errors.append(error)
            else:
                orders[label] = int(result.as_numpy("ORDER").reshape(-1)[0])
            if len(orders) + len(errors) == expected:
                done.set()

        client.async_infer(
            model, [tensor], answered, outputs=[grpcclient.InferRequestedOutput("ORDER")],
            client_timeout=60, **({"priority": priority} if priority else {}),
        )  # fmt: skip

    try:
        for i in range(BLOCKERS):
            send(f"block{i}", b"block", 0)
        time.sleep(0.3 * BLOCK_S)  # the first blocker runs, the others fill the slots
        send("batch", b"batch", batch_level)
        time.sleep(0.2 * BLOCK_S)
        send("interactive", b"interactive", interactive_level)
        assert done.wait(BLOCKERS * BLOCK_S + 30), f"answers missing: {orders}, {errors}"
    finally:
        client.close()
    assert not errors, errors
    return orders


def test_the_step_serves_interactive_before_batch_when_called_directly(probe_server):
    orders = _orders(probe_server.grpc_url, "probe", "MIDDLE")
    assert orders["interactive"] < orders["batch"], orders


def test_the_ensemble_passes_the_requests_priority_to_its_steps(probe_server):
    orders = _orders(probe_server.grpc_url, "probe_ensemble", "TEXT")
    assert orders["interactive"] < orders["batch"], orders


def test_without_a_priority_the_step_serves_in_arrival_order(probe_server):
    """The control: the same sequence with no priority sent runs the batch request first."""
    orders = _orders(probe_server.grpc_url, "probe_ensemble", "TEXT", levels=(0, 0))
    assert orders["batch"] < orders["interactive"], orders
