"""The transport: one reading of a failed call, the client's table over it, the wire framing,
the pieces of a request and the pool's retries (pure functions; no server)."""

from __future__ import annotations

import asyncio
import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from triton_embed import errors
from triton_embed.codec import (
    bytes_elements,
    decode_embeddings,
    encode_embeddings,
    encode_typed_embeddings,
    frame_bytes,
    int32_values,
)
from triton_embed.options import EmbeddingType
from triton_embed.retry import POOL_RETRYABLE, RetryPolicy, is_pool_retryable
from triton_embed.transport.failures import (
    ErrorKind,
    TransportError,
    classify,
    short_message,
    upstream_error,
)
from triton_embed.transport.inference import pieces
from tritonclient.utils import InferenceServerException

REPO_ROOT = Path(__file__).resolve().parents[2]


def upstream(status: str, message: str) -> InferenceServerException:
    return InferenceServerException(msg=message, status=f"StatusCode.{status}")


QUEUE_FULL = "in ensemble 'embed', [request id: <id_unknown>] Exceeds maximum queue size"
OVERLOADED, UNREACHABLE = ErrorKind.OVERLOADED, ErrorKind.UNREACHABLE
REFUSED = "This protocol is restricted, expecting header 'triton-grpc-protocol-x'"


@pytest.mark.parametrize(
    "error, kind",
    [
        (upstream("INVALID_ARGUMENT", "text 0 is empty"), ErrorKind.INVALID_INPUT),
        (InferenceServerException(msg="bad", status="400"), ErrorKind.INVALID_INPUT),
        (upstream("UNAVAILABLE", REFUSED), ErrorKind.ACCESS_DENIED),
        (upstream("DEADLINE_EXCEEDED", "Deadline Exceeded"), ErrorKind.TIMEOUT),
        (TimeoutError("Deadline Exceeded"), ErrorKind.TIMEOUT),
        (upstream("UNAVAILABLE", QUEUE_FULL), ErrorKind.OVERLOADED),
        (
            upstream("UNAVAILABLE", "in ensemble 'embed', Request timeout expired"),
            ErrorKind.OVERLOADED,
        ),
        (upstream("INTERNAL", QUEUE_FULL), ErrorKind.OTHER),  # a queue's words, not its refusal
        (upstream("NOT_FOUND", "Request for unknown model"), ErrorKind.MODEL_MISSING),
        (upstream("UNAVAILABLE", "failed to connect to all addresses"), ErrorKind.UNREACHABLE),
        (
            InferenceServerException(msg="Socket closed", status="UNAVAILABLE"),
            ErrorKind.UNREACHABLE,
        ),
        (upstream("UNKNOWN", "Socket closed"), ErrorKind.UNREACHABLE),
        (upstream("CANCELLED", "Connection reset by peer"), ErrorKind.UNREACHABLE),
        (upstream("CANCELLED", "Locally cancelled by application!"), ErrorKind.OTHER),
        (upstream("INTERNAL", "engine failed"), ErrorKind.OTHER),
        (ValueError("something else"), ErrorKind.OTHER),
    ],
)
def test_one_reading_gives_each_failure_its_kind(error, kind):
    assert classify(error).kind is kind


@pytest.mark.parametrize(
    "message, index, reason",
    [
        ("text 6 is empty; send text", 6, "is empty; send text"),
        ("in ensemble 'embed', text 12: has 602 tokens", 12, "has 602 tokens"),
        ("the request has no texts", None, None),
    ],
)
def test_the_text_index_is_read_once_with_what_follows_it(message, index, reason):
    failure = classify(upstream("INVALID_ARGUMENT", message))
    assert (failure.index, failure.reason) == (index, reason)
    assert classify(upstream("INTERNAL", message)).index is None  # only refused input


def test_a_text_index_is_counted_in_the_callers_texts():
    message = "in ensemble 'embed', text 6 has 602 tokens; the model accepts 256"
    failure = classify(upstream("INVALID_ARGUMENT", message))
    assert failure.renumbered(64, 64) == message.replace("text 6", "text 70")
    assert failure.index_in(64, 64) == 70
    assert failure.renumbered(0, 64) == message and failure.index_in(0, 64) == 6
    assert failure.renumbered(64, 5) == message and failure.index_in(64, 5) is None
    error = upstream_error(upstream("INVALID_ARGUMENT", message), offset=64, size=64)
    assert (error.kind, error.index) == (ErrorKind.INVALID_INPUT, 70)
    assert "text 70 has 602 tokens" in error.message


def test_the_pools_wording_of_each_kind_keeps_the_servers_message():
    cases = {
        ("UNAVAILABLE", QUEUE_FULL): (ErrorKind.OVERLOADED, "every upstream is overloaded"),
        ("DEADLINE_EXCEEDED", "Deadline Exceeded"): (ErrorKind.TIMEOUT, "did not answer in time"),
        ("NOT_FOUND", "unknown model"): (ErrorKind.MODEL_MISSING, "no upstream has the model"),
        ("UNAVAILABLE", "Socket closed"): (ErrorKind.UNREACHABLE, "could be reached"),
        ("UNAVAILABLE", REFUSED): (ErrorKind.OTHER, "failed the request: UNAVAILABLE"),
        ("INTERNAL", "boom"): (ErrorKind.OTHER, "failed the request: INTERNAL boom"),
    }
    for (status, message), (kind, words) in cases.items():
        error = upstream_error(upstream(status, message))
        assert error.kind is kind and words in error.message and message in error.message
    huge = upstream_error(upstream("INTERNAL", "x" * 5000))
    assert huge.message.endswith("... (5000 characters)") and len(huge.message) < 1100
    assert short_message("short") == "short"


def test_a_transport_error_survives_copies_and_pickles():
    error = TransportError(ErrorKind.INVALID_INPUT, "text 3 is empty", index=3, field="input")
    for twin in (copy.copy(error), pickle.loads(pickle.dumps(error))):
        assert twin is not error
        assert (twin.kind, twin.message, twin.index, twin.field) == (
            ErrorKind.INVALID_INPUT,
            "text 3 is empty",
            3,
            "input",
        )


# ---- the client's exception classes: one table over the kinds ----------------------------


def test_every_error_kind_has_one_client_class():
    assert set(errors.ERROR_CLASSES) == set(ErrorKind)
    assert errors.ERROR_CLASSES[ErrorKind.OVERLOADED] is errors.ServerOverloadedError
    assert errors.ERROR_CLASSES[ErrorKind.ACCESS_DENIED] is errors.AccessDeniedError
    assert errors.ERROR_CLASSES[ErrorKind.TIMEOUT] is errors.EmbedTimeoutError
    assert errors.ERROR_CLASSES[ErrorKind.UNREACHABLE] is errors.ServerUnavailableError
    assert errors.ERROR_CLASSES[ErrorKind.INVALID_INPUT] is errors.InvalidInputError


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_map_error_and_from_transport_follow_the_table(kind):
    cls = errors.ERROR_CLASSES[kind]
    assert type(errors.from_transport(TransportError(kind, "why"))) is cls


def test_a_refused_text_from_the_pool_keeps_its_index():
    error = errors.from_transport(TransportError(ErrorKind.INVALID_INPUT, "text 9 ...", index=9))
    assert isinstance(error, errors.InvalidInputError) and error.index == 9


# ---- the wire: KServe v2 framing and the one EMBEDDING decoder ---------------------------


def test_bytes_elements_keep_trailing_zero_bytes_and_refuse_bad_framing():
    vectors = np.array([[1.0, 0.0], [0.5, 0.0], [0.0, 0.0]], dtype=np.float32)
    payloads = list(encode_embeddings(vectors))
    raw = frame_bytes(payloads)
    elements = bytes_elements(raw, 3)
    assert all(isinstance(e, memoryview) for e in elements)
    assert [bytes(e) for e in elements] == payloads
    assert np.array_equal(decode_embeddings(elements), vectors)
    with pytest.raises(ValueError, match="does not hold 4 framed elements"):
        bytes_elements(raw, 4)
    with pytest.raises(ValueError, match="does not hold 2 framed elements"):
        bytes_elements(raw, 2)
    with pytest.raises(ValueError, match="embedding 1 has 4 bytes; expected 8"):
        decode_embeddings([b"\0" * 8, b"\0" * 4])
    assert int32_values(np.array([3, 4], "<i4").tobytes(), 2).tolist() == [3, 4]
    with pytest.raises(ValueError):
        int32_values(b"\0" * 4, 2)


@pytest.mark.parametrize("kind", list(EmbeddingType))
@pytest.mark.parametrize("dim", [1, 7, 8, 384])
def test_framed_views_decode_like_bytes_for_every_embedding_type(kind, dim):
    rng = np.random.default_rng(dim)
    vectors = rng.standard_normal((5, dim)).astype(np.float32)
    vectors[0] = 0.0  # an all-zero vector: trailing 0x00 bytes
    payloads = list(encode_typed_embeddings(vectors, kind))
    views = bytes_elements(frame_bytes(payloads), len(payloads))
    from_views = decode_embeddings(views, dim, kind)
    assert np.array_equal(from_views, decode_embeddings(payloads, dim, kind))
    if kind is EmbeddingType.UBINARY:
        assert np.array_equal(np.unpackbits(from_views, axis=-1, count=dim), vectors > 0)
    else:
        assert np.allclose(from_views, vectors, atol=1e-3 if kind is EmbeddingType.FLOAT16 else 0)


def test_pieces_cover_every_input_once_in_order():
    assert pieces(0, 4) == []
    assert pieces(4, 4) == [(0, 4)]
    assert pieces(2048, 64)[-1] == (1984, 2048) and len(pieces(2048, 64)) == 32
    for n in range(0, 40):
        spans = pieces(n, 7)
        assert [i for a, b in spans for i in range(a, b)] == list(range(n))
        assert all(0 < b - a <= 7 for a, b in spans)
    with pytest.raises(ValueError):
        pieces(3, 0)


# ---- the pool's retries: RetryPolicy.call_async -------------------------------------------


def test_pool_failures_time_can_cure_are_sent_again_and_refused_input_never():
    assert POOL_RETRYABLE == {
        ErrorKind.UNREACHABLE,
        ErrorKind.NO_UPSTREAM,
        ErrorKind.MODEL_MISSING,
        ErrorKind.OVERLOADED,
        ErrorKind.TIMEOUT,
    }
    policy = RetryPolicy(retries=3, initial_wait_s=0.5, max_wait_s=1.0)
    waits: list[float] = []
    seen: list[ErrorKind] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    def flaky(kinds: list[ErrorKind]):
        async def call() -> str:
            if kinds:
                raise TransportError(kinds.pop(0), "passing")
            return "done"

        return call

    def on_retry(error: BaseException, wait_s: float) -> None:
        seen.append(error.kind)

    cured = [ErrorKind.OVERLOADED, ErrorKind.TIMEOUT, ErrorKind.NO_UPSTREAM]
    result = asyncio.run(policy.call_async(flaky(cured), on_retry=on_retry, sleep=sleep))
    assert result == "done"
    assert seen == [ErrorKind.OVERLOADED, ErrorKind.TIMEOUT, ErrorKind.NO_UPSTREAM]
    assert len(waits) == 3 and all(0 <= w <= b for w, b in zip(waits, (0.5, 1.0, 1.0), strict=True))
    with pytest.raises(TransportError) as still:
        asyncio.run(policy.call_async(flaky([ErrorKind.UNREACHABLE] * 4), sleep=sleep))
    assert still.value.kind is ErrorKind.UNREACHABLE and is_pool_retryable(still.value)
    waits.clear()
    with pytest.raises(TransportError) as refused:
        asyncio.run(policy.call_async(flaky([ErrorKind.INVALID_INPUT]), sleep=sleep))
    assert refused.value.kind is ErrorKind.INVALID_INPUT and waits == []


def test_the_bulk_path_needs_no_prometheus_and_no_server_module():
    """In a fresh interpreter on this checkout: the bulk job's modules load neither."""
    code = (
        "import sys, triton_embed.bulk.pool_embedder, triton_embed.bulk.job, "
        "triton_embed.transport.upstreams, triton_embed.transport.inference\n"
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('prometheus_client', 'triton_embed_server')))"
    )
    path = os.pathsep.join([str(REPO_ROOT / "client"), str(REPO_ROOT / "server")])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
