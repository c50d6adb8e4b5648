"""The gateway against hostile and careless traffic, in front of a real tritonserver (issue 20).

Real gateway processes (``python -m triton_embed_server.gateway``) in front of the session
``server``: the 100,000-level body on every POST route, 50 stalled connections against a
small ``--max-in-flight``, a client that leaves a large request after 1 s (its pieces counted
with Triton's ``nv_inference_request_success``), ``dimensions`` of 2**63, a body not declared
JSON, and ``huggingface_hub.InferenceClient`` configured with the base URL, as its users do.
"""

from __future__ import annotations

import contextlib
import socket
import time

import httpx
import numpy as np
import orjson
import pytest
from triton_embed import EmbeddingClient
from triton_embed_server.run.launcher import Gateway

from tests.helpers import DIM, metric_sum

pytestmark = [pytest.mark.integration, pytest.mark.slow]

API_KEY = "gateway-hardening-key-7c2a"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
POST_ROUTES = ("/v1/embeddings", "/embed", "/tokenize", "/", "/invocations")
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()


@pytest.fixture(scope="module")
def gateway(server):
    """A gateway with small limits: 4 in flight, 2 s for headers, 2 s (+ rate) for a body."""
    extra = ["--max-in-flight", "4", "--header-timeout-s", "2", "--body-timeout-s", "2"]
    with Gateway([server.grpc_url], server.admin_key, api_key=API_KEY, extra_args=extra) as gw:
        yield gw
    print(f"\ngateway log: {gw.log_path}")


@pytest.fixture(scope="module")
def grpc(server):
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key) as c:
        yield c


def embed_successes(server) -> float:
    return metric_sum(server.metric_samples(), "nv_inference_request_success_total", model="embed")


def assert_healthy(gateway, server) -> None:
    assert server.is_ready()
    assert httpx.get(f"{gateway.base_url}/health", timeout=10).status_code == 200
    r = httpx.post(
        f"{gateway.base_url}/v1/embeddings",
        headers=AUTH,
        json={"model": "embed", "input": "still here"},
        timeout=30,
    )
    assert r.status_code == 200


def test_the_100000_level_body_is_400_on_every_post_route(gateway, server):
    body = b"[" * 100_000 + b"]" * 100_000
    for path in POST_ROUTES:
        r = httpx.post(
            f"{gateway.base_url}{path}",
            headers={**AUTH, "Content-Type": "application/json"},
            content=body,
            timeout=30,
        )
        assert r.status_code == 400, path
        error = r.json()["error"]
        text = error["message"] if isinstance(error, dict) else error
        assert "more than 128 levels deep" in text
    assert_healthy(gateway, server)


def test_a_body_not_declared_json_is_415(gateway):
    body = orjson.dumps({"model": "embed", "input": "x"})
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        r = httpx.post(
            f"{gateway.base_url}/v1/embeddings",
            headers={**AUTH, "Content-Type": content_type},
            content=body,
        )
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"


def test_dimensions_of_2_to_the_63_is_400_naming_dimensions(gateway, server):
    for path, body in (
        ("/v1/embeddings", {"model": "embed", "input": "x", "dimensions": 2**63}),
        ("/embed", {"inputs": "x", "dimensions": 2**63}),
    ):
        r = httpx.post(f"{gateway.base_url}{path}", headers=AUTH, json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        text = error["message"] if isinstance(error, dict) else error
        assert "'dimensions' must be a whole number from 1 to 2147483647" in text
    assert_healthy(gateway, server)


def test_fifty_stalled_connections_take_no_slot_and_are_closed_within_the_limits(gateway, server):
    body = orjson.dumps({"model": "embed", "input": "x"})
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    clients = []
    for i in range(50):  # silent, trickling headers, trickling body, stalled body
        s = socket.create_connection(("127.0.0.1", gateway.port))
        kind = i % 4
        if kind == 1:
            s.sendall(head[:12])
        elif kind >= 2:
            s.sendall(head + body[:4])
        clients.append((kind, s))
    started = time.monotonic()
    time.sleep(0.5)
    for kind, s in clients:
        if kind in (1, 2):
            s.send(b"P" if kind == 1 else b" ")
    # 50 slow clients, --max-in-flight 4: a normal caller is served, not refused with 429.
    for _ in range(3):
        r = httpx.post(
            f"{gateway.base_url}/v1/embeddings",
            headers=AUTH,
            json={"model": "embed", "input": "a normal caller"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    first_lines = set()
    for _, s in clients:
        s.settimeout(10)
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(4096):
                data += chunk
        first_lines.add(data.split(b"\r\n", 1)[0])
        s.close()
    assert time.monotonic() - started < 5.0  # each limit is 2 s
    assert first_lines == {b"HTTP/1.1 408 Request Timeout"}
    metrics = httpx.get(f"{gateway.base_url}/metrics").text
    assert 'route="",status="408"' in metrics
    assert 'route="/v1/embeddings",status="408"' in metrics
    assert_healthy(gateway, server)


def test_a_client_that_leaves_after_1_s_does_not_get_all_its_pieces_computed(gateway, server):
    # 2,048 texts of about 50 tokens (~106,000 tokens, under the 131,072 budget): 32 pieces of
    # 64, 16 in flight at once; at 5,000-14,000 tokens/s the whole request takes 8-21 s here.
    texts = [f"text {i} " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(48))
             for i in range(2048)]  # fmt: skip
    before = embed_successes(server)
    with contextlib.suppress(httpx.TimeoutException):
        httpx.post(
            f"{gateway.base_url}/v1/embeddings",
            headers=AUTH,
            json={"model": "embed", "input": texts},
            timeout=httpx.Timeout(1.0, connect=5.0),
        )
    left_at = time.monotonic()
    small = httpx.post(
        f"{gateway.base_url}/v1/embeddings",
        headers=AUTH,
        json={"model": "embed", "input": "a small request after a big abandoned one"},
        timeout=60,
    )
    small_s = time.monotonic() - left_at
    assert small.status_code == 200
    # Wait until Triton has finished whatever it still had, then count the pieces it computed.
    last, stable_since = embed_successes(server), time.monotonic()
    while time.monotonic() - stable_since < 3.0:
        time.sleep(0.5)
        now = embed_successes(server)
        if now != last:
            last, stable_since = now, time.monotonic()
    computed = last - before - 1  # the small request is one
    print(f"\npieces computed: {computed:g} of 32; the small request took {small_s:.2f} s")
    assert computed <= 16  # the other 16 were never sent
    assert small_s < 15.0
    metrics = httpx.get(f"{gateway.base_url}/metrics").text
    assert 'route="/v1/embeddings",status="499"' in metrics
    assert 'status="500"' not in metrics
    log = gateway.log_tail()
    assert "the client disconnected before its answer; counted as 499" in log
    assert "Traceback" not in log


def test_huggingface_hub_inference_client_on_the_base_url(gateway, grpc):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=gateway.base_url, token=API_KEY)
    got = client.feature_extraction("hugging face's client posts to the base URL")
    assert got.shape == (1, DIM)
    expected = grpc.embed(["hugging face's client posts to the base URL"])
    assert np.array_equal(np.asarray(got, dtype=np.float32), expected)
    for path in ("/", "/ping"):
        assert httpx.get(f"{gateway.base_url}{path}").status_code == 200
    r = httpx.post(f"{gateway.base_url}/invocations", headers=AUTH, json={"inputs": ["a", "b"]})
    assert r.status_code == 200 and np.array(r.json()).shape == (2, DIM)
