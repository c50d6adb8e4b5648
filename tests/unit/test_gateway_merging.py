"""Request merging (gateway/merging.py) against a test double of the upstream pool.

``FakeEnsemblePool`` stands in for ``UpstreamPool``: it serves one ensemble (``embed``,
max_batch_size 4) with deterministic vectors, records every call's texts and parameters,
can hold calls until the test releases them, and refuses a text starting with ``BAD`` the
way Triton refuses an over-long text (gRPC ``INVALID_ARGUMENT``, "text N ..." with N the
index in that call), which the transport reads as ``INVALID_INPUT`` and the gateway's table
answers with ``BadRequest``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import numpy as np
import pytest
from triton_embed.codec import frame_bytes
from triton_embed.options import RequestOptions, Truncation
from triton_embed.transport.catalog import Catalog, ModelInfo
from triton_embed.transport.failures import ErrorKind, TransportError
from triton_embed.transport.inference import Embeddings
from triton_embed_server.gateway.errors import BadRequest, UpstreamError, from_transport
from triton_embed_server.gateway.merging import Merger, merge_key, split
from triton_embed_server.gateway.metrics import GatewayMetrics
from tritonclient.utils import InferenceServerException

from tests.unit.gateway_fakes import embed_info

DIM = 8
MODEL = embed_info(4, dimension=DIM, max_length=16)
NONE = RequestOptions(truncation=Truncation.NONE)


def vector(text: bytes) -> np.ndarray:
    raw = np.frombuffer(hashlib.sha256(text).digest(), dtype=np.uint8)[:DIM]
    return raw.astype("<f4")


def tokens(text: bytes) -> int:
    return len(text.split()) + 2


class FakeEnsemblePool:
    """Test double of ``UpstreamPool`` for the ensemble: records calls, can hold them."""

    def __init__(self) -> None:
        self.catalog = Catalog.build([MODEL])
        self.calls: list[tuple[list[bytes], dict]] = []
        self.hold: asyncio.Event | None = None
        self.fail: BaseException | None = None

    def any_ready(self) -> bool:
        return True

    async def infer(self, model, inputs, outputs, parameters=None):
        texts = [bytes(t) for t in inputs["TEXT"]]
        self.calls.append((texts, dict(parameters or {})))
        hold = self.hold
        if hold is not None:
            await hold.wait()
        if self.fail is not None:
            raise self.fail
        for i, text in enumerate(texts):
            if text.startswith(b"BAD"):
                raise InferenceServerException(
                    msg=f"text {i} has 602 tokens; the model accepts 16; send truncation=END "
                    "or shorten it",
                    status="StatusCode.INVALID_ARGUMENT",
                )
        return {
            "EMBEDDING": frame_bytes(vector(t).tobytes() for t in texts),
            "NUM_TOKENS": np.array([tokens(t) for t in texts], "<i4").tobytes(),
        }

    def texts_per_call(self) -> list[list[bytes]]:
        return [texts for texts, _ in self.calls]


def encoded(*texts: str) -> list[bytes]:
    return [t.encode() for t in texts]


def assert_answers(result: Embeddings, texts: list[bytes]) -> None:
    assert np.array_equal(result.matrix(), np.stack([vector(t) for t in texts]))
    assert result.num_tokens.tolist() == [tokens(t) for t in texts]


async def settle() -> None:
    """Let every ready task run until it waits on something."""
    for _ in range(20):
        await asyncio.sleep(0)


def merged_requests(metrics: GatewayMetrics) -> tuple[float, float]:
    """(calls counted, requests they carried) of ``triton_embed_gateway_merged_requests``."""
    name = "triton_embed_gateway_merged_requests"
    count = metrics.registry.get_sample_value(f"{name}_count") or 0.0
    return count, metrics.registry.get_sample_value(f"{name}_sum") or 0.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


async def held_first_call(
    metrics: GatewayMetrics | None = None,
) -> tuple[FakeEnsemblePool, Merger, asyncio.Future]:
    """A merger with ``in_flight`` 1 whose first call (``"first"``) the pool holds, so the
    requests that follow wait and are merged when ``pool.hold`` is set."""
    pool = FakeEnsemblePool()
    merger = Merger(pool, 1, metrics)
    pool.hold = asyncio.Event()
    first = asyncio.ensure_future(merger.embed_texts(MODEL, encoded("first"), NONE))
    await settle()
    return pool, merger, first


# ---- (1) idle: sent at once ----------------------------------------------------------------


def test_an_idle_gateway_sends_a_request_at_once_in_one_call():
    async def scenario():
        pool, metrics = FakeEnsemblePool(), GatewayMetrics()
        merger = Merger(pool, 4, metrics)
        pool.hold = asyncio.Event()
        task = asyncio.ensure_future(merger.embed_texts(MODEL, encoded("a b", "c"), NONE))
        await settle()
        assert pool.texts_per_call() == [encoded("a b", "c")]  # sent before anything finished
        pool.hold.set()
        assert_answers(await task, encoded("a b", "c"))
        assert pool.calls[0][1] == {"truncation": "NONE"}  # the options, as sent
        assert merged_requests(metrics) == (1, 1)
        assert not merger._queues  # nothing kept once idle

    run(scenario())


def test_up_to_in_flight_requests_are_sent_at_once():
    async def scenario():
        pool = FakeEnsemblePool()
        merger = Merger(pool, 3)
        pool.hold = asyncio.Event()
        tasks = [
            asyncio.ensure_future(merger.embed_texts(MODEL, encoded(f"t{i}"), NONE))
            for i in range(4)
        ]
        await settle()
        assert pool.texts_per_call() == [[b"t0"], [b"t1"], [b"t2"]]  # the 4th waits
        pool.hold.set()
        for i, task in enumerate(tasks):
            assert_answers(await task, [f"t{i}".encode()])
        assert pool.texts_per_call()[3] == [b"t3"]

    run(scenario())


# ---- (2) busy: the waiting requests share one call ------------------------------------------


def test_requests_waiting_behind_a_running_call_are_merged_into_one_call_in_order():
    async def scenario():
        metrics = GatewayMetrics()
        pool, merger, first = await held_first_call(metrics)
        waiting = [encoded("b one"), encoded("c one", "c two words"), encoded("d")]
        tasks = [asyncio.ensure_future(merger.embed_texts(MODEL, t, NONE)) for t in waiting]
        await settle()
        assert len(pool.calls) == 1
        pool.hold.set()
        assert_answers(await first, encoded("first"))
        for task, texts in zip(tasks, waiting, strict=True):
            assert_answers(await task, texts)
        assert pool.texts_per_call() == [encoded("first"), [t for ts in waiting for t in ts]]
        assert merged_requests(metrics) == (2, 1 + 3)

    run(scenario())


def test_a_request_is_never_split_across_merged_calls():
    async def scenario():
        pool, merger, first = await held_first_call()
        waiting = [encoded("a1", "a2", "a3"), encoded("b1", "b2"), encoded("c1")]
        tasks = [asyncio.ensure_future(merger.embed_texts(MODEL, t, NONE)) for t in waiting]
        await settle()
        pool.hold.set()
        await first
        for task, texts in zip(tasks, waiting, strict=True):
            assert_answers(await task, texts)
        # max_batch_size 4: the oldest (3 texts) alone, then the next two together
        assert pool.texts_per_call()[1:] == [waiting[0], waiting[1] + waiting[2]]

    run(scenario())


def test_a_request_larger_than_max_batch_size_goes_piecewise_without_waiting():
    async def scenario():
        pool, merger, first = await held_first_call()
        large = encoded(*(f"t{i}" for i in range(6)))
        task = asyncio.ensure_future(merger.embed_texts(MODEL, large, NONE))
        await settle()
        assert pool.texts_per_call()[1:] == [large[:4], large[4:]]  # at once, in pieces
        pool.hold.set()
        await first
        assert_answers(await task, large)

    run(scenario())


# ---- (3) one bad text: its request's error, the others served -------------------------------


def test_a_bad_text_in_a_merged_call_fails_only_its_request_with_its_own_index():
    async def scenario():
        pool, merger, first = await held_first_call()
        good_b, bad, good_d = encoded("good b"), encoded("fine", "BAD c"), encoded("good d")
        tasks = [
            asyncio.ensure_future(merger.embed_texts(MODEL, t, NONE)) for t in (good_b, bad, good_d)
        ]
        await settle()
        pool.hold.set()
        await first
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert_answers(results[0], good_b)
        assert_answers(results[2], good_d)
        assert isinstance(results[1], TransportError)
        assert results[1].kind is ErrorKind.INVALID_INPUT
        error = from_transport(results[1])
        assert isinstance(error, BadRequest) and error.status == 400
        assert error.message.startswith("text 1 has 602 tokens")  # "text 2" in the merged call
        # the merged call, then each of its requests again on its own
        assert pool.texts_per_call()[1] == good_b + bad + good_d
        assert sorted(pool.texts_per_call()[2:]) == sorted([good_b, bad, good_d])

    run(scenario())


def test_a_server_error_of_a_merged_call_fails_all_its_requests_without_resending():
    async def scenario():
        pool, merger, first = await held_first_call()
        tasks = [asyncio.ensure_future(merger.embed_texts(MODEL, encoded(t), NONE)) for t in "xyz"]
        await settle()
        pool.fail = InferenceServerException(msg="engine died", status="StatusCode.INTERNAL")
        pool.hold.set()
        results = await asyncio.gather(first, *tasks, return_exceptions=True)
        assert all(isinstance(r, TransportError) and r.kind is ErrorKind.OTHER for r in results)
        answers = [from_transport(r) for r in results]
        assert all(isinstance(a, UpstreamError) and "engine died" in a.message for a in answers)
        assert len({id(r) for r in results}) == 4  # one error object per request
        assert len(pool.calls) == 2

    run(scenario())


# ---- (4) different parameters are never merged ----------------------------------------------


def test_requests_with_different_parameters_are_never_merged():
    async def scenario():
        pool = FakeEnsemblePool()
        merger = Merger(pool, 1)
        end = RequestOptions(truncation=Truncation.END)
        pool.hold = asyncio.Event()
        sent = [(encoded("a"), NONE), (encoded("b"), end)]  # one key each: both at once
        waiting = [
            (encoded("c"), NONE),
            (encoded("d"), end),
            (encoded("e"), dataclasses.replace(NONE, dimensions=4)),
            (encoded("f"), NONE),
        ]
        tasks = [asyncio.ensure_future(merger.embed_texts(MODEL, t, p)) for t, p in sent + waiting]
        await settle()
        assert len(pool.calls) == 3  # a, b, and e (a third key, nothing running for it)
        pool.hold.set()
        await asyncio.gather(*tasks)
        calls = {tuple(texts): params for texts, params in pool.calls}
        assert calls == {
            (b"a",): {"truncation": "NONE"},
            (b"b",): {"truncation": "END"},
            (b"e",): {"truncation": "NONE", "dimensions": 4},
            (b"c", b"f"): {"truncation": "NONE"},
            (b"d",): {"truncation": "END"},
        }

    run(scenario())


def test_the_merge_key_is_the_ensemble_and_the_parsed_options():
    # The options are parsed when made, so one value given two ways is one key.
    given = RequestOptions(truncation=" none ", dimensions="4", allow_empty=1)
    assert merge_key(MODEL, given) == merge_key(
        MODEL, RequestOptions(truncation=Truncation.NONE, dimensions=4, allow_empty=True)
    )
    assert merge_key(MODEL, RequestOptions()) != merge_key(MODEL, NONE)
    assert merge_key(MODEL, NONE) != merge_key(MODEL, dataclasses.replace(NONE, normalize=False))
    other = ModelInfo(**{**MODEL.__dict__, "name": "other"})
    assert merge_key(MODEL, NONE) != merge_key(other, NONE)
    hash(merge_key(MODEL, NONE))


# ---- (5) cancellation -----------------------------------------------------------------------


def test_a_cancelled_waiter_is_dropped_and_the_others_are_served():
    async def scenario():
        pool = FakeEnsemblePool()
        merger = Merger(pool, 1)
        first_hold, second_hold = asyncio.Event(), asyncio.Event()
        pool.hold = first_hold
        first = asyncio.ensure_future(merger.embed_texts(MODEL, encoded("first"), NONE))
        await settle()
        tasks = {
            t: asyncio.ensure_future(merger.embed_texts(MODEL, [t], NONE))
            for t in (b"b", b"c", b"d", b"e")
        }
        await settle()
        tasks[b"c"].cancel()  # its client went away while it waited
        await settle()
        pool.hold = second_hold
        first_hold.set()
        await first
        await settle()
        assert pool.texts_per_call()[1] == [b"b", b"d", b"e"]
        tasks[b"d"].cancel()  # cancelled after its call was sent
        second_hold.set()
        assert_answers(await tasks[b"b"], [b"b"])
        assert_answers(await tasks[b"e"], [b"e"])
        for t in (b"c", b"d"):
            with pytest.raises(asyncio.CancelledError):
                await tasks[t]
        assert len(pool.calls) == 2
        await settle()
        assert not merger._queues

    run(scenario())


# ---- (6) merging off ------------------------------------------------------------------------


def test_merging_off_sends_every_request_as_it_comes():
    async def scenario():
        pool, metrics = FakeEnsemblePool(), GatewayMetrics()
        merger = Merger(pool, 0, metrics)
        pool.hold = asyncio.Event()
        tasks = [
            asyncio.ensure_future(merger.embed_texts(MODEL, encoded(f"t{i}"), NONE))
            for i in range(6)
        ]
        await settle()
        assert pool.texts_per_call() == [[f"t{i}".encode()] for i in range(6)]
        pool.hold.set()
        for i, task in enumerate(tasks):
            assert_answers(await task, [f"t{i}".encode()])
        assert len(pool.calls) == 6
        assert merged_requests(metrics) == (0, 0)

    run(scenario())


def test_a_negative_in_flight_is_refused():
    with pytest.raises(ValueError, match="in_flight must be >= 0"):
        Merger(FakeEnsemblePool(), -1)


# ---- split ----------------------------------------------------------------------------------


def test_split_gives_each_request_its_slice_and_checks_the_total():
    texts = encoded("a", "b c", "d", "e f g")
    whole = Embeddings(
        [memoryview(vector(t).tobytes()) for t in texts],
        np.array([tokens(t) for t in texts], np.int32),
    )
    parts = split(whole, [1, 0, 3])
    assert [len(p.elements) for p in parts] == [1, 0, 3]
    assert_answers(parts[0], texts[:1])
    assert_answers(parts[2], texts[1:])
    with pytest.raises(ValueError, match="merged call of 5 texts answered 4 vectors"):
        split(whole, [2, 3])
