"""The client's retry policy without a server: which errors retry, the backoff bounds, giving up.

Also the mapping of Triton's queue-policy refusals to ServerOverloadedError, and the client's
batch-level retries over a stand-in transport (every text once, in input order).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from triton_embed import (
    EmbedClientError,
    EmbeddingClient,
    EmbedTimeoutError,
    InvalidInputError,
    RetryPolicy,
    ServerOverloadedError,
    ServerUnavailableError,
)
from triton_embed.errors import AccessDeniedError, map_error
from triton_embed.retry import is_retryable
from tritonclient.utils import InferenceServerException

QUEUE_FULL_MESSAGE = "in ensemble 'embed', [request id: <id_unknown>] Exceeds maximum queue size"
QUEUE_TIMEOUT_MESSAGE = "in ensemble 'embed', Request timeout expired"


class Flaky:
    """Raises the given errors in turn, then returns ``"done"``; counts its calls."""

    def __init__(self, *errors: BaseException):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def overloaded(i: int = 0) -> ServerOverloadedError:
    return ServerOverloadedError(f"server at h:1 is overloaded ({i}); retry later, with backoff")


# ---- which errors retry -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (overloaded(), True),
        (ServerUnavailableError("server at h:1 is unavailable: failed to connect"), True),
        (InvalidInputError("texts[0:2]: text 1 is empty"), False),
        (EmbedTimeoutError("request to h:1 timed out"), False),
        (AccessDeniedError("server at h:1 refused the call"), False),
        (EmbedClientError("StatusCode.INTERNAL boom"), False),
        (ValueError("not ours"), False),
    ],
)
def test_only_overload_and_unavailability_are_retried(error, retried):
    assert is_retryable(error) is retried
    fn = Flaky(error)
    policy = RetryPolicy(retries=3)
    if retried:
        assert policy.call(fn, sleep=lambda s: None) == "done"
        assert fn.calls == 2
    else:
        with pytest.raises(type(error)) as info:
            policy.call(fn, sleep=lambda s: None)
        assert info.value is error  # raised at once, as it was
        assert fn.calls == 1


# ---- backoff bounds ----------------------------------------------------------------------


def test_wait_bounds_double_from_the_first_up_to_the_cap():
    policy = RetryPolicy(retries=10, initial_wait_s=0.1, max_wait_s=5.0)
    assert [policy.wait_bound_s(k) for k in range(1, 11)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0]
    )
    assert policy.wait_bound_s(10_000) == 5.0  # no overflow
    with pytest.raises(ValueError, match="from 1"):
        policy.wait_bound_s(0)


def test_every_wait_is_drawn_within_its_bound_and_spread_by_jitter():
    policy = RetryPolicy(retries=7, initial_wait_s=0.1, max_wait_s=1.0)
    random.seed(11)
    draws: list[list[float]] = []
    for _ in range(200):
        waits: list[float] = []
        fn = Flaky(*(overloaded(i) for i in range(7)))
        assert policy.call(fn, sleep=waits.append) == "done"
        assert fn.calls == 8
        draws.append(waits)
    by_retry = np.array(draws)  # [run, retry]
    bounds = np.array([policy.wait_bound_s(k) for k in range(1, 8)])
    assert (by_retry >= 0).all()
    assert (by_retry <= bounds).all()
    # full jitter: each wait is uniform on [0, bound], so the draws fill the whole range
    assert (by_retry.min(axis=0) < 0.1 * bounds).all()
    assert (by_retry.max(axis=0) > 0.9 * bounds).all()
    assert by_retry.mean(axis=0) == pytest.approx(bounds / 2, rel=0.2)


def test_on_retry_sees_each_error_and_its_wait():
    seen: list[tuple[str, float]] = []
    waits: list[float] = []
    fn = Flaky(overloaded(1), overloaded(2))
    RetryPolicy(retries=5).call(
        fn, on_retry=lambda e, w: seen.append((str(e), w)), sleep=waits.append
    )
    assert [w for _, w in seen] == waits
    assert ["(1)" in seen[0][0], "(2)" in seen[1][0]] == [True, True]


# ---- giving up, turning it off -----------------------------------------------------------


def test_gives_up_after_the_last_retry_with_an_overload_error_that_says_so():
    fn = Flaky(*(overloaded(i) for i in range(10)))
    waits: list[float] = []
    with pytest.raises(ServerOverloadedError) as info:
        RetryPolicy(retries=3).call(fn, sleep=waits.append)
    assert fn.calls == 4 and len(waits) == 3
    message = str(info.value)
    assert "overloaded" in message and "retry later, with backoff" in message
    assert "gave up after 4 attempts" in message
    assert "(3)" in message  # the last refusal's own message


@pytest.mark.parametrize("off", [0, None, RetryPolicy(retries=0)])
def test_zero_or_none_turns_retries_off(off):
    fn = Flaky(overloaded())
    with pytest.raises(ServerOverloadedError) as info:
        RetryPolicy.of(off).call(fn, sleep=lambda s: pytest.fail("no wait expected"))
    assert fn.calls == 1
    assert "gave up" not in str(info.value)  # the server's refusal, as it came


def test_policy_of_a_number_keeps_the_default_waits():
    assert RetryPolicy.of(3) == RetryPolicy(retries=3)
    assert RetryPolicy.of(RetryPolicy(retries=2, max_wait_s=9)) == RetryPolicy(2, 0.1, 9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retries": -1}, "retries must be >= 0"),
        ({"retries": 1.5}, "whole number"),
        ({"retries": True}, "whole number"),
        ({"initial_wait_s": 0}, "initial_wait_s must be"),
        ({"max_wait_s": float("inf")}, "max_wait_s must be"),
        ({"initial_wait_s": 2.0, "max_wait_s": 1.0}, "must be >= initial_wait_s"),
    ],
)
def test_out_of_range_policies_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)


def test_the_client_refuses_a_bad_retry_argument_before_connecting():
    with pytest.raises(InvalidInputError, match="retry must be"):
        EmbeddingClient("127.0.0.1:1", retry="forever")  # nothing listens there: never reached
    with pytest.raises(InvalidInputError, match="retries must be >= 0"):
        EmbeddingClient("127.0.0.1:1", retry=-2)


# ---- Triton's refusals as the client's errors ----------------------------------------------


@pytest.mark.parametrize("message", [QUEUE_FULL_MESSAGE, QUEUE_TIMEOUT_MESSAGE])
def test_queue_policy_refusals_become_server_overloaded_error(message):
    exc = InferenceServerException(msg=message, status="StatusCode.UNAVAILABLE")
    error = map_error(exc, "h:1", 32, 16)
    assert isinstance(error, ServerOverloadedError)
    assert isinstance(error, ServerUnavailableError)  # callers of the old type still catch it
    text = str(error)
    assert text.startswith("texts[32:48]: server at h:1 is overloaded")
    assert message in text and text.endswith("retry later, with backoff")


def test_other_unavailability_is_not_called_overload():
    exc = InferenceServerException(msg="failed to connect to all addresses", status="UNAVAILABLE")
    error = map_error(exc, "h:1")
    assert type(error) is ServerUnavailableError
    # the queue-full text under another status is not an overload refusal either
    exc = InferenceServerException(msg=QUEUE_FULL_MESSAGE, status="StatusCode.INTERNAL")
    assert not isinstance(map_error(exc, "h:1"), ServerUnavailableError)


# ---- the client: batch-level retries over a stand-in transport ---------------------------


def test_client_retries_each_batch_alone_and_keeps_every_text_once_in_order(monkeypatch):
    """Batches refused a few times each still come back once each, in input order."""
    monkeypatch.setattr(EmbeddingClient, "_server_max_batch_size", lambda self, model: 4)
    client = EmbeddingClient("127.0.0.1:1", max_concurrency=3, retry=RetryPolicy(6, 0.001, 0.002))
    refusals = {start: start % 3 for start in range(0, 30, 4)}  # 0, 1 or 2 refusals per batch
    sent: list[int] = []

    def fake_infer(batch, offset, request=None, calls=None):
        sent.append(offset)
        if refusals[offset] > 0:
            refusals[offset] -= 1
            raise overloaded(offset)
        vectors = np.array([[float(b.decode().split()[1]), 1.0] for b in batch], np.float32)
        return vectors, np.full(len(batch), 3, np.int32)

    monkeypatch.setattr(client, "_infer", fake_infer)
    texts = [f"text {i}" for i in range(30)]
    result = client.embed_with_details(texts)
    np.testing.assert_array_equal(result.embeddings[:, 0], np.arange(30))
    assert result.retries == sum(start % 3 for start in range(0, 30, 4)) == 7
    assert len(result.latencies_s) == 8
    assert sorted(set(sent)) == list(range(0, 30, 4))
    client.close()


def test_client_with_retries_off_raises_the_overload_at_once(monkeypatch):
    monkeypatch.setattr(EmbeddingClient, "_server_max_batch_size", lambda self, model: 64)
    client = EmbeddingClient("127.0.0.1:1", retry=None)
    calls = []

    def fake_infer(batch, offset, request=None, in_flight=None):
        calls.append(offset)
        raise overloaded()

    monkeypatch.setattr(client, "_infer", fake_infer)
    with pytest.raises(ServerOverloadedError, match="retry later, with backoff"):
        client.embed(["a", "b"])
    assert calls == [0]
    client.close()
