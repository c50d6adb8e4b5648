"""The engine steps' own queue: interactive first, batch work cut into short calls, bounds."""

from __future__ import annotations

import threading

import pytest
from triton_embed_server.steps.engine_queue import EngineQueue, Job, QueueSettings
from triton_embed_server.steps.errors import EngineError

WAIT_S = 10.0


class FakeRunner:
    """Records each call's parts; answers are ``(job name, parts' results)`` or the error.

    ``gate`` (when set) holds every call until the test releases it, so the test decides
    what is queued while a call runs.
    """

    def __init__(self, fail_on: set[str] | None = None, gate: bool = False):
        self.calls: list[list[tuple[str, int, int]]] = []
        self.answers: dict[str, tuple] = {}
        self.fail_on = fail_on or set()
        self.cancelled_names: set[str] = set()
        self.gate = threading.Semaphore(0) if gate else None
        self.started = threading.Semaphore(0)
        self.answered = threading.Condition()

    def run_call(self, parts):
        self.started.release()
        if self.gate is not None:
            assert self.gate.acquire(timeout=WAIT_S)
        self.calls.append([(job.request, start, end) for job, start, end in parts])
        if any(job.request in self.fail_on for job, _, _ in parts):
            raise EngineError("the embedding engine failed: boom")
        return [(job.request, start, end) for job, start, end in parts]

    def answer(self, job, results, error):
        with self.answered:
            assert job.request not in self.answers, f"{job.request} answered twice"
            self.answers[job.request] = (results, error)
            self.answered.notify_all()

    def cancelled(self, job):
        return job.request in self.cancelled_names

    def wait_answers(self, n: int) -> None:
        with self.answered:
            assert self.answered.wait_for(lambda: len(self.answers) >= n, timeout=WAIT_S)


def job(name: str, tokens: list[int], batch: bool = True, cuttable: bool = True) -> Job:
    return Job(name, None, batch, tokens, cuttable=cuttable)


def settings(**kw) -> QueueSettings:
    defaults = {"max_call_texts": 8, "batch_call_tokens": 100, "interactive_window_s": 5.0}
    return QueueSettings(**{**defaults, **kw})


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_queue():
    made = []

    def make(runner, **kw):
        clock = kw.pop("clock", Clock())
        q = EngineQueue(runner, settings(**kw), clock=clock)
        made.append(q)
        return q

    yield make
    for q in made:
        q.close(timeout_s=WAIT_S)


def test_interactive_request_is_answered_before_submit_returns(make_queue):
    runner = FakeRunner()
    q = make_queue(runner)
    q.submit([job("a", [10, 10], batch=False), job("b", [5], batch=False)])
    assert runner.calls == [[("a", 0, 2), ("b", 0, 1)]]
    assert runner.answers["a"] == ([("a", 0, 2)], None)
    assert runner.answers["b"] == ([("b", 0, 1)], None)


def test_batch_work_is_whole_without_interactive_traffic(make_queue):
    runner = FakeRunner()
    q = make_queue(runner)
    q.submit([job("b1", [60] * 3), job("b2", [60] * 3)])  # returns at once
    runner.wait_answers(2)
    # no interactive request seen: no token cut, calls of max_call_texts (8) texts
    assert runner.calls == [[("b1", 0, 3), ("b2", 0, 3)]]


def test_batch_work_is_cut_while_interactive_requests_are_served(make_queue):
    runner = FakeRunner()
    clock = Clock()
    q = make_queue(runner, clock=clock)
    q.submit([job("i", [5], batch=False)])
    q.submit([job("b1", [40, 40, 40]), job("b2", [35, 35])])
    runner.wait_answers(3)
    # 100 tokens per call: 40+40 | 40+35 | 35, a request cut between its texts
    assert runner.calls[1:] == [[("b1", 0, 2)], [("b1", 2, 3), ("b2", 0, 1)], [("b2", 1, 2)]]
    assert runner.answers["b1"] == ([("b1", 0, 2), ("b1", 2, 3)], None)
    assert runner.answers["b2"] == ([("b2", 0, 1), ("b2", 1, 2)], None)


def test_a_text_over_the_budget_still_runs_alone(make_queue):
    runner = FakeRunner()
    q = make_queue(runner)
    q.submit([job("i", [5], batch=False)])
    q.submit([job("b", [250, 250])])
    runner.wait_answers(2)
    assert runner.calls[1:] == [[("b", 0, 1)], [("b", 1, 2)]]


def test_short_calls_end_after_the_interactive_window(make_queue):
    runner = FakeRunner()
    clock = Clock()
    q = make_queue(runner, clock=clock)
    q.submit([job("i", [5], batch=False)])
    clock.now += 5.0  # the window is 5 s: no longer within it
    q.submit([job("b", [60, 60, 60])])
    runner.wait_answers(2)
    assert runner.calls[1:] == [[("b", 0, 3)]]


def test_an_interactive_request_goes_before_queued_batch_work(make_queue):
    runner = FakeRunner(gate=True)
    q = make_queue(runner)
    done = threading.Event()
    first = threading.Thread(target=lambda: (q.submit([job("i0", [5], batch=False)]), done.set()))
    first.start()
    assert runner.started.acquire(timeout=WAIT_S)  # the call of i0 runs, held
    q.submit([job("b", [50] * 6)])  # batch work queued behind it: submit returns at once
    assert q.waiting == (0, 1)
    runner.gate.release()  # i0's call ends
    assert done.wait(WAIT_S)
    assert runner.started.acquire(timeout=WAIT_S)  # b's first short call runs, held
    late = threading.Thread(target=lambda: q.submit([job("i1", [7], batch=False)]))
    late.start()
    for _ in range(4):
        runner.gate.release()
    late.join(WAIT_S)
    runner.wait_answers(3)
    for _ in range(4):
        runner.gate.release()
    runner.wait_answers(3)
    names = [[p[0] for p in call] for call in runner.calls]
    # i1 ran right after the one short batch call that was running when it came
    assert names[:3] == [["i0"], ["b"], ["i1"]]
    assert [c[0][1:] for c in runner.calls if c[0][0] == "b"] == [(0, 2), (2, 4), (4, 6)]
    first.join(WAIT_S)


def test_full_batch_queue_refuses_with_tritons_words(make_queue):
    runner = FakeRunner(gate=True)
    q = make_queue(runner, batch_queue_size=2)
    q.submit([job("b1", [10]), job("b2", [10]), job("b3", [10])])
    results, error = runner.answers["b3"]
    assert results is None
    assert error.code == "UNAVAILABLE"
    assert str(error).startswith("Exceeds maximum queue size: 2 batch-class requests")
    for _ in range(2):
        runner.gate.release()
    runner.wait_answers(3)
    assert runner.answers["b1"][1] is None and runner.answers["b2"][1] is None


def test_batch_request_that_waited_past_the_timeout_is_refused(make_queue):
    runner = FakeRunner(gate=True)
    clock = Clock()
    q = make_queue(runner, clock=clock, batch_timeout_s=30.0, max_call_texts=1)
    q.submit([job("b1", [10]), job("b2", [10])])
    assert runner.started.acquire(timeout=WAIT_S)  # b1 runs, held
    clock.now += 31.0
    runner.gate.release()
    runner.wait_answers(2)
    assert runner.answers["b1"][1] is None
    error = runner.answers["b2"][1]
    assert error.code == "UNAVAILABLE" and str(error).startswith("Request timeout expired")
    assert [c[0][0] for c in runner.calls] == ["b1"]


def test_engine_failure_answers_the_calls_requests_once_and_the_rest_go_on(make_queue):
    runner = FakeRunner(fail_on={"bad"})
    q = make_queue(runner)
    q.submit([job("i", [5], batch=False)])
    q.submit([job("ok1", [90]), job("bad", [60, 60, 60]), job("ok2", [90])])
    runner.wait_answers(4)
    assert isinstance(runner.answers["bad"][1], EngineError)
    assert runner.answers["ok1"] == ([("ok1", 0, 1)], None)
    assert runner.answers["ok2"] == ([("ok2", 0, 1)], None)
    # bad's first call failed: its other texts were never run
    assert [c for c in runner.calls if c[0][0] == "bad"] == [[("bad", 0, 1)]]


def test_cancelled_request_is_not_run(make_queue):
    runner = FakeRunner()
    runner.cancelled_names.add("gone")
    q = make_queue(runner)
    q.submit([job("gone", [10]), job("kept", [10])])
    runner.wait_answers(2)
    assert runner.answers["gone"][1].code == "CANCELLED"
    assert runner.calls == [[("kept", 0, 1)]]


def test_request_that_cannot_be_cut_runs_whole(make_queue):
    runner = FakeRunner()
    q = make_queue(runner)
    q.submit([job("i", [5], batch=False)])
    q.submit([job("w1", [80, 80], cuttable=False), job("w2", [10], cuttable=False)])
    runner.wait_answers(3)
    assert runner.calls[1:] == [[("w1", 0, 2)], [("w2", 0, 1)]]


def test_request_without_texts_is_answered(make_queue):
    runner = FakeRunner()
    q = make_queue(runner)
    q.submit([job("empty", []), job("i", [], batch=False)])
    runner.wait_answers(2)
    assert runner.answers["empty"] == ([("empty", 0, 0)], None)
    assert runner.answers["i"] == ([("i", 0, 0)], None)


def test_close_answers_what_waits_and_refuses_new_work():
    runner = FakeRunner(gate=True)
    q = EngineQueue(runner, settings(max_call_texts=1))
    q.submit([job("b1", [10]), job("b2", [10])])
    assert runner.started.acquire(timeout=WAIT_S)
    closer = threading.Thread(target=q.close)
    closer.start()
    runner.gate.release()  # b1's call ends; b2 never runs
    closer.join(WAIT_S)
    q.submit([job("late", [1], batch=False)])
    assert runner.answers["b1"][1] is None
    assert runner.answers["b2"][1].reason == "unloading"
    assert runner.answers["late"][1].code == "UNAVAILABLE"


def test_a_runner_that_cannot_answer_does_not_stop_the_queue(make_queue):
    runner = FakeRunner()
    real = runner.answer

    def flaky(job, results, error):
        real(job, results, error)
        if job.request == "first":
            raise RuntimeError("the response sender is closed")

    runner.answer = flaky
    q = make_queue(runner)
    q.submit([job("first", [1], batch=False)])
    q.submit([job("second", [1], batch=False)])
    assert runner.answers["second"] == ([("second", 0, 1)], None)


def test_settings_from_the_model_config_json():
    config = {
        "max_batch_size": 64,
        "dynamic_batching": {
            "priority_queue_policy": {
                "2": {"max_queue_size": 70, "default_timeout_microseconds": "60000000"}
            }
        },
    }
    s = QueueSettings.from_model_config(config, 256, 3.0)
    assert s == QueueSettings(64, 256, 3.0, 70, 60.0)
    assert QueueSettings.from_model_config({}, 0, 1.0) == QueueSettings(256, 0, 1.0, 0, 0.0)
