"""The engine step's own queue on a real server (server/triton_embed_server/steps/engine_queue.py).

On the session's ``one_embedder_server`` (one embedder replica, so one queue, and a queue
bound of SMALL_QUEUE requests per priority level):

* while interactive requests are served, a batch-class request runs in engine calls of at
  most ``batch_call_tokens`` (512) tokens, cut between its texts, and its vectors are those
  of the same texts embedded at once (the embedder's metrics count each call's tokens);
* batch-class requests past the queue's bound are refused as overload, in Triton's words,
  by the embedder's own queue (its ``queue_full`` counter), and the rest are served;
* a ``priority_class`` that is not a class is refused with the classes named.
"""

from __future__ import annotations

import math
import random
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_embed import EmbeddingClient
from triton_embed.codec import decode_embeddings
from triton_embed.corpus import read_fortunes
from triton_embed.errors import QUEUE_FULL
from triton_embed.priority import CLASS_PARAMETER, Priority, wire
from triton_embed_server.steps.engine_queue import DEFAULT_BATCH_CALL_TOKENS
from triton_embed_server.steps.metrics import REPORT_INTERVAL_S

from tests.helpers import VECTOR_ATOL, metric_sum, text_input

pytestmark = pytest.mark.integration

#: Requests sent at once at the batch level to a queue of SMALL_QUEUE (4): most are refused.
FLOOD = 24


@pytest.fixture(scope="module")
def texts():
    """64 distinct real texts of 20+ words (Debian fortunes): about 2,000 tokens."""
    long = sorted({" ".join(t.split()) for _, t in read_fortunes() if len(t.split()) >= 20})
    return random.Random(5).sample(long, 64)


def samples_after_flush(server):
    time.sleep(REPORT_INTERVAL_S + 1)  # the steps' counts are flushed every REPORT_INTERVAL_S
    return server.metric_samples()


def test_batch_work_runs_in_short_calls_beside_interactive_requests(one_embedder_server, texts):
    server = one_embedder_server
    with EmbeddingClient(server.grpc_url, batch_size=64) as interactive:
        reference = interactive.embed(texts)  # one request, one call: the reference
        before = samples_after_flush(server)
        interactive.embed(texts[:1])  # an interactive request: short calls from now on
        with EmbeddingClient(server.grpc_url, batch_size=64, priority="batch") as batch:
            result = batch.embed_with_details(texts)
    after = samples_after_flush(server)

    def delta(name, **labels):
        labels = {"model": "embedder", **labels}
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    np.testing.assert_allclose(result.embeddings, reference, rtol=0, atol=VECTOR_ATOL)
    tokens = int(result.num_tokens.sum())
    assert tokens > 3 * DEFAULT_BATCH_CALL_TOKENS  # the request needs several calls
    calls = delta("triton_embed_batch_tokens_count")
    # the interactive call, then the batch request's calls of <= 512 tokens each
    assert calls >= 1 + math.ceil(tokens / DEFAULT_BATCH_CALL_TOKENS)
    assert delta("triton_embed_batch_tokens_bucket", le="1024") == calls
    assert delta("triton_embed_requests_succeeded_total") == 2


def test_batch_requests_past_the_queue_bound_are_refused_as_overload(one_embedder_server, texts):
    server = one_embedder_server
    before = samples_after_flush(server)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outcomes: list = [None] * FLOOD
    reference = EmbeddingClient(server.grpc_url, batch_size=8).embed(texts[:8])

    def send(i: int) -> None:
        try:
            result = client.infer(
                "embed", [text_input(texts[:8])], client_timeout=120,
                **wire(Priority.BATCH.level, None),
            )  # fmt: skip
            outcomes[i] = result.as_numpy("EMBEDDING").reshape(-1)
        except Exception as exc:  # noqa: BLE001 - the outcome is checked below
            outcomes[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(FLOOD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    refused = [o for o in outcomes if isinstance(o, Exception)]
    served = [o for o in outcomes if not isinstance(o, Exception)]
    for exc in refused:
        assert exc.status() == "StatusCode.UNAVAILABLE", exc
        assert QUEUE_FULL in exc.message(), exc
    for elements in served:
        np.testing.assert_allclose(decode_embeddings(elements), reference, rtol=0, atol=VECTOR_ATOL)
    assert refused and served
    after = samples_after_flush(server)
    own = metric_sum(
        after, "triton_embed_requests_failed_total", model="embedder", reason="queue_full"
    ) - metric_sum(
        before, "triton_embed_requests_failed_total", model="embedder", reason="queue_full"
    )
    assert own >= 1, "no request was refused by the embedder's own queue"
    assert server.is_ready()
    client.close()


def test_a_priority_class_that_is_not_a_class_is_refused(server, grpc_client):
    with pytest.raises(Exception) as caught:
        grpc_client.infer("embed", [text_input(["a text"])], parameters={CLASS_PARAMETER: "urgent"})
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert (
        "request parameter priority_class must be one of interactive, batch; got 'urgent'"
        in caught.value.message()
    )
