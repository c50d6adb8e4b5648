"""The gateway's limits against hostile and careless requests (issue 20), no Triton server.

Each test sends the hostile input itself: bodies not declared JSON, a 100,000-level nested
body, values of 100,000 characters, ``dimensions`` of 2**63, requests over the token budget,
clients that disconnect, and (over real sockets, a real uvicorn with the gateway's protocol)
silent and trickling connections. The upstream is ``FakeUpstreamPool`` of
``test_gateway_app``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time

import httpx
import numpy as np
import orjson
import pytest
import uvicorn
from triton_embed.transport.catalog import Catalog
from triton_embed_server.gateway import protocol
from triton_embed_server.gateway.app import Gateway
from triton_embed_server.gateway.body import MAX_JSON_DEPTH, json_depth
from triton_embed_server.gateway.errors import quote
from triton_embed_server.gateway.metrics import GatewayMetrics
from triton_embed_server.gateway.routes import build_app
from triton_embed_server.gateway.settings import DEFAULT_MAX_BODY_BYTES, GatewaySettings
from triton_embed_server.run.launcher import free_port
from tritonclient.utils import InferenceServerException

from tests.unit.test_gateway_app import JSON_HEADERS, MODEL, FakeUpstreamPool, make_client, post

POST_ROUTES = {
    "/v1/embeddings": {"model": "embed", "input": "x"},
    "/embed": {"inputs": "x"},
    "/tokenize": {"inputs": "x"},
    "/": {"inputs": "x"},
    "/invocations": {"inputs": "x"},
}
#: The issue's crash input: 100,000 levels of arrays, about 200 KB.
DEEP_BODY = b"[" * 100_000 + b"]" * 100_000
HUGE = "z" * 100_000


def message(r) -> str:
    """The error message of either envelope."""
    body = r.json()
    return body["error"]["message"] if isinstance(body["error"], dict) else body["error"]


def timed_embeddings(pool, delay_s: float, texts: list[str], **settings):
    """``POST /v1/embeddings`` of ``texts`` to a gateway over ``pool``, each call taking
    ``delay_s``: the answer and the seconds it took."""
    pool.delay_s = delay_s
    c, _, _ = make_client(pool, **settings)
    started = time.perf_counter()
    r = post(c, "/v1/embeddings", {"model": "embed", "input": texts})
    return r, time.perf_counter() - started


# ---- 415: a body not declared JSON --------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/json; charset=latin-1",
        "application/jsonx",
    ],
)
def test_a_body_not_declared_json_is_415_on_every_post_route(content_type):
    c, pool, _ = make_client()
    headers = {} if content_type is None else {"Content-Type": content_type}
    for path, body in POST_ROUTES.items():
        r = c.post(path, content=orjson.dumps(body), headers=headers)
        assert r.status_code == 415, (path, content_type)
        assert "application/json" in message(r)
        if path.startswith("/v1/"):
            assert r.json()["error"]["code"] == "unsupported_media_type"
        else:
            assert r.json()["error_type"] == "Validation"
    assert pool.calls == []


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "Application/JSON; charset=UTF-8", "application/vnd.api+json"],
)
def test_json_with_a_charset_and_plus_json_are_accepted(content_type):
    c, _, _ = make_client()
    for path, body in POST_ROUTES.items():
        r = c.post(path, content=orjson.dumps(body), headers={"Content-Type": content_type})
        assert r.status_code == 200, (path, content_type, r.text)


# ---- nesting ------------------------------------------------------------------------------


def test_the_100000_level_body_is_400_on_every_post_route_and_the_gateway_stays_healthy():
    c, pool, _ = make_client()
    assert len(DEEP_BODY) == 200_000
    for path in POST_ROUTES:
        started = time.perf_counter()
        r = c.post(path, content=DEEP_BODY, headers=JSON_HEADERS)
        assert time.perf_counter() - started < 1.0
        assert r.status_code == 400, path
        assert message(r).startswith(
            f"the request body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep"
        )
    assert pool.calls == []
    assert c.get("/health").status_code == 200
    assert post(c, "/v1/embeddings", POST_ROUTES["/v1/embeddings"]).status_code == 200


def test_depth_is_counted_outside_strings_and_128_levels_still_parse():
    assert json_depth(b'{"input": ["a", "b"]}') == 2
    assert json_depth(b'{"input": "' + b"[" * 1000 + b'"}') == 1  # brackets inside a string
    assert json_depth(b'{"input": "\\"' + b"[" * 1000 + b'"}') == 1  # after an escaped quote
    c, _, _ = make_client()
    at_limit = b'{"input": ' + b"[" * 127 + b"]" * 127 + b', "model": "embed"}'
    r = c.post("/v1/embeddings", content=at_limit, headers=JSON_HEADERS)
    assert r.status_code == 400 and "levels deep" not in message(r)  # parsed, then refused
    over = b'{"input": ' + b"[" * 128 + b"]" * 128 + b', "model": "embed"}'
    r = c.post("/v1/embeddings", content=over, headers=JSON_HEADERS)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_deep"


# ---- body size ----------------------------------------------------------------------------


def test_the_default_body_limit_is_2048_inputs_of_the_character_cap_plus_json():
    assert DEFAULT_MAX_BODY_BYTES == 2048 * (64 * 256 + 6) + 64 * 1024 == 33_632_256
    assert GatewaySettings(upstreams=("127.0.0.1:1",)).max_body_bytes == DEFAULT_MAX_BODY_BYTES
    c, pool, _ = make_client()
    r = c.post(
        "/embed",
        content=b" " * (DEFAULT_MAX_BODY_BYTES + 1),
        headers=JSON_HEADERS,
    )
    assert r.status_code == 413
    assert message(r) == (
        f"the request body is {DEFAULT_MAX_BODY_BYTES + 1} bytes (Content-Length); the gateway "
        f"accepts at most {DEFAULT_MAX_BODY_BYTES} bytes (32.0742 MiB, --max-body-mb); send "
        "fewer or shorter inputs per request"
    )


# ---- dimensions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [2**63, 2**64 - 1, 2**63 - 1, 2**31, -1, 0, 1.5, True, False, "4", [4], {"a": 1}]
)
def test_dimensions_out_of_range_or_of_another_type_is_400_naming_it_and_its_range(value):
    c, pool, _ = make_client()
    for path, body in (
        ("/v1/embeddings", POST_ROUTES["/v1/embeddings"]),
        ("/embed", {"inputs": "x"}),
    ):
        r = post(c, path, {**body, "dimensions": value})
        assert r.status_code == 400, (path, value)
        assert message(r).startswith("'dimensions' must be a whole number from 1 to 2147483647"), (
            message(r)
        )
        assert quote(value) in message(r)
    assert pool.calls == []


def test_dimensions_above_the_models_is_400_naming_the_models_dimension():
    c, pool, _ = make_client()
    r = post(c, "/v1/embeddings", {**POST_ROUTES["/v1/embeddings"], "dimensions": 9})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    assert message(r) == (
        "'dimensions' is 9; the vectors of model 'embed' have 8 dimensions: send a number from "
        "1 to 8 (one of the model's dimensions), or leave it out"
    )
    assert post(c, "/embed", {"inputs": "x", "dimensions": 8}).status_code == 200


def test_a_number_json_cannot_hold_is_400():
    c, _, _ = make_client()
    body = b'{"model": "embed", "input": "x", "dimensions": 1' + b"0" * 400 + b"}"
    r = c.post("/v1/embeddings", content=body, headers=JSON_HEADERS)
    assert r.status_code == 400
    assert message(r).startswith("the request body is not valid JSON: number is infinity")


# ---- bounded messages ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/embeddings", {"model": HUGE, "input": "x"}),
        ("/v1/embeddings", {"model": "embed", "input": "x", HUGE: 1}),
        ("/v1/embeddings", {"model": "embed", "input": "x", "input_type": HUGE}),
        ("/v1/embeddings", {"model": "embed", "input": "x", "encoding_format": HUGE}),
        ("/v1/embeddings", {"model": "embed", "input": "x", "truncate": HUGE}),
        ("/v1/embeddings", {"model": "embed", "input": [[1, HUGE]]}),
        ("/v1/embeddings", {"model": "embed", "input": [[1, [[[[2]]]] * 1000]]}),
        ("/embed", {"inputs": "x", "truncation_direction": HUGE}),
        ("/embed", {"inputs": "x", "normalize": HUGE}),
        ("/embed", {"inputs": "x", "prompt_name": HUGE}),
        ("/embed", {"inputs": "x", HUGE: 1}),
    ],
)
def test_messages_quote_a_bounded_prefix_of_an_offending_value(path, body):
    c, pool, _ = make_client()
    r = post(c, path, body)
    assert r.status_code in (400, 404)
    text = message(r)
    assert len(text) < 400, text
    if "zzzz" in text:
        assert "(100000 characters)" in text
    assert pool.calls == []


# ---- empty texts --------------------------------------------------------------------------


def test_an_empty_text_is_400_naming_the_apis_own_field_not_allow_empty():
    c, pool, _ = make_client()
    r = post(c, "/v1/embeddings", {"model": "embed", "input": ["a", ""]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert message(r) == (
        "input[1] is an empty string; model 'embed' does not embed empty texts: send at least "
        "one character in each input"
    )
    r = post(c, "/embed", {"inputs": ["", "b"]})
    assert r.status_code == 400 and message(r).startswith("inputs[0] is an empty string;")
    assert "allow_empty" not in message(r)
    assert pool.calls == []


def test_a_model_whose_tokenizer_allows_empty_texts_gets_them():
    from dataclasses import replace

    pool = FakeUpstreamPool(catalog=Catalog.build([replace(MODEL, allow_empty=True)]))
    c, _, _ = make_client(pool)
    assert post(c, "/v1/embeddings", {"model": "embed", "input": ["a", ""]}).status_code == 200


# ---- token budget -------------------------------------------------------------------------


def test_a_request_over_the_token_budget_is_400_and_stops_computing():
    # Each text "w w w" has 5 tokens (3 words and 2 specials); a piece of 4 texts 20. The
    # bound of a text is min(max_length 16, 5 bytes + 32) = 16, so a piece's bound (64) is
    # over the budget (40): one piece at a time, and the third passes the budget.
    c, pool, _ = make_client(max_request_tokens=40)
    r = post(c, "/v1/embeddings", {"model": "embed", "input": ["w w w"] * 40})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "too_many_tokens"
    assert message(r) == (
        "the request is over the gateway's token budget: the first 12 of its 40 inputs have "
        "60 tokens; at most 40 tokens are embedded per request (--max-request-tokens); split "
        "the inputs over several requests"
    )
    assert len(pool.calls) == 3  # of 10 pieces
    pool.calls.clear()
    assert post(c, "/embed", {"inputs": ["w w w"] * 8}).status_code == 200  # 40 tokens
    r = post(c, "/embed", {"inputs": [list(range(30)), list(range(11))]})
    assert r.status_code == 400 and "its inputs have 41 tokens" in message(r)
    assert [call[0] for call in pool.calls] == ["embed", "embed"]  # token IDs never sent


def test_within_the_budget_pieces_still_run_concurrently():
    pool = FakeUpstreamPool()
    r, seconds = timed_embeddings(pool, 0.2, ["w w w"] * 40, max_request_tokens=100_000)
    assert r.status_code == 200 and len(pool.calls) == 10
    assert seconds < 1.0  # 10 pieces of 0.2 s at once, not one by one


# ---- disconnects and deadlines ------------------------------------------------------------


class CountingPool(FakeUpstreamPool):
    """Counts the calls that were started and those that ran to their end."""

    def __init__(self):
        super().__init__()
        self.finished = 0
        self.cancelled = 0

    async def infer(self, model, inputs, outputs, parameters=None):
        try:
            result = await super().infer(model, inputs, outputs, parameters)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return result


async def call_app(app, body: bytes, leave_after_s: float | None):
    """One ASGI request to ``app``; the client disconnects ``leave_after_s`` after its body."""
    sent = []
    body_given = False
    left = asyncio.Event()

    async def receive():
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": body, "more_body": False}
        if leave_after_s is None:
            await left.wait()
        else:
            await asyncio.sleep(leave_after_s)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            left.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/embeddings",
        "raw_path": b"/v1/embeddings",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    await app(scope, receive, send)
    return sent


def test_a_client_that_leaves_cancels_its_pieces_starts_no_more_and_counts_499(caplog):
    pool = CountingPool()
    pool.delay_s = 1.0
    metrics = GatewayMetrics()
    gateway = Gateway(GatewaySettings(upstreams=("127.0.0.1:1",)), pool, metrics, None)
    app = build_app(gateway)
    body = orjson.dumps({"model": "embed", "input": ["w w"] * 80})  # 20 pieces of 4
    started = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="triton_embed.gateway"):
        asyncio.run(call_app(app, body, leave_after_s=0.2))
    assert time.perf_counter() - started < 0.8  # did not wait for the pieces
    assert len(pool.calls) == 16  # PIECES_IN_FLIGHT started, the other 4 never
    assert pool.cancelled == 16 and pool.finished == 0
    assert gateway.in_flight == 0
    text, _ = metrics.render()
    assert b'status="499"' in text and b'status="500"' not in text
    assert "the client disconnected before its answer; counted as 499" in caplog.text
    assert "Traceback" not in caplog.text


def test_a_client_that_disconnects_mid_upload_is_499_without_a_traceback(caplog):
    pool = CountingPool()
    metrics = GatewayMetrics()
    gateway = Gateway(GatewaySettings(upstreams=("127.0.0.1:1",)), pool, metrics, None)
    app = build_app(gateway)
    messages = [
        {"type": "http.request", "body": b'{"model": "embed", "input": ["a', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/embed", "raw_path": b"/embed", "query_string": b"",
        "root_path": "", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }  # fmt: skip
    with caplog.at_level(logging.INFO, logger="triton_embed.gateway"):
        asyncio.run(app(scope, receive, send))
    assert pool.calls == [] and gateway.in_flight == 0
    text, _ = metrics.render()
    assert b'route="/embed",status="499"' in text and b'status="500"' not in text
    assert "the client disconnected after 31 bytes of its body; counted as 499" in caplog.text
    assert "Traceback" not in caplog.text


def test_a_servers_long_message_is_cut():
    c, pool, _ = make_client()
    pool.fail = InferenceServerException(
        msg="in ensemble 'embed', prompt " + "q" * 100_000 + " unknown",
        status="StatusCode.INVALID_ARGUMENT",
    )
    r = post(c, "/v1/embeddings", {"model": "embed", "input": "x"})
    assert r.status_code == 400
    assert message(r).endswith("... (100036 characters)") and len(message(r)) < 1100


def test_a_client_that_stays_gets_its_answer_with_the_watcher_running():
    pool = CountingPool()
    gateway = Gateway(GatewaySettings(upstreams=("127.0.0.1:1",)), pool, GatewayMetrics(), None)
    sent = asyncio.run(
        call_app(build_app(gateway), orjson.dumps({"model": "embed", "input": ["w"] * 9}), None)
    )
    assert sent[0]["status"] == 200 and pool.finished == 3


def test_past_the_deadline_the_pieces_are_cancelled_and_the_answer_is_504():
    pool = CountingPool()
    r, seconds = timed_embeddings(pool, 5.0, ["w"] * 8, timeout_s=0.3)
    assert seconds < 2.0
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert message(r).startswith("the request did not finish within 0.3 s (--timeout-s)")
    assert pool.cancelled == 2 and pool.finished == 0


# ---- TEI's base-URL routes ----------------------------------------------------------------


def test_teis_base_url_routes_embed_and_answer_health():
    c, pool, _ = make_client(key="k")
    auth = {"Authorization": "Bearer k"}
    embed = post(c, "/embed", {"inputs": ["a b"]}, headers=auth).json()
    for path in ("/", "/invocations"):
        r = post(c, path, {"inputs": ["a b"]}, headers=auth)
        assert r.status_code == 200 and r.json() == embed
        assert post(c, path, {"inputs": ["a b"]}).status_code == 401
    for path in ("/", "/ping"):
        r = c.get(path)  # public, like /health
        assert r.status_code == 200 and r.content == b""
    pool.ready = False
    assert c.get("/ping").status_code == 503


# ---- real sockets: header and body timeouts, the slot taken after the body ----------------


@contextlib.contextmanager
def served(
    max_in_flight: int, header_timeout_s: float, body_timeout_s: float, http: type | None = None
):
    """The gateway app (a fake upstream) behind a real uvicorn with the gateway's protocol."""
    pool = FakeUpstreamPool()
    metrics = GatewayMetrics()
    settings = GatewaySettings(
        upstreams=("127.0.0.1:1",),
        max_in_flight=max_in_flight,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
    )
    gateway = Gateway(settings, pool, metrics, None)
    protocol.configure(header_timeout_s, lambda status: metrics.observe("", "", status, 0.0))
    port = free_port()
    config = uvicorn.Config(
        build_app(gateway),
        host="127.0.0.1",
        port=port,
        http=http or protocol.protocol_class(),
        loop="asyncio",
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", port, gateway, metrics
    finally:
        server.should_exit = True
        thread.join(10)
        protocol.configure(protocol.DEFAULT_HEADER_TIMEOUT_S, None)


def slow_clients(port: int) -> list[tuple[str, socket.socket]]:
    """50 stalled connections: silent, trickling headers, trickling bodies, and a stalled body."""
    body = orjson.dumps({"model": "embed", "input": "x"})
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    clients = []
    for i in range(50):
        kind = ("silent", "headers", "body", "stalled-body")[i % 4]
        s = socket.create_connection(("127.0.0.1", port))
        if kind == "headers":
            s.sendall(head[:10])
        elif kind in ("body", "stalled-body"):
            s.sendall(head + body[:3])
        clients.append((kind, s))
    return clients


def read_until_closed(s: socket.socket, timeout_s: float) -> bytes:
    s.settimeout(timeout_s)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(4096):
            data += chunk
    return data


@pytest.mark.parametrize("http", [protocol.HttpToolsProtocol, protocol.H11Protocol])
def test_fifty_slow_clients_hold_no_slot_and_are_closed_with_408_within_the_limits(http):
    limits = {"max_in_flight": 4, "header_timeout_s": 1.0, "body_timeout_s": 1.0, "http": http}
    with served(**limits) as (url, port, gw, m):
        clients = slow_clients(port)
        started = time.monotonic()
        # Trickle: one more byte every 0.2 s into the trickling ones while a normal caller goes.
        for _ in range(3):
            time.sleep(0.2)
            for kind, s in clients:
                if kind in ("headers", "body"):
                    with contextlib.suppress(OSError):
                        s.send(b"P" if kind == "headers" else b" ")
        r = httpx.post(f"{url}/v1/embeddings", json=POST_ROUTES["/v1/embeddings"], timeout=5)
        assert r.status_code == 200  # not 429: no stalled body holds a slot
        assert gw.in_flight == 0
        answers = {}
        for kind, s in clients:
            data = read_until_closed(s, timeout_s=5.0)
            answers.setdefault(kind, set()).add(data.split(b"\r\n", 1)[0])
            s.close()
        elapsed = time.monotonic() - started
        assert elapsed < 3.0  # every one closed at about 1 s (each limit is 1 s)
        assert answers == {
            "silent": {b"HTTP/1.1 408 Request Timeout"},
            "headers": {b"HTTP/1.1 408 Request Timeout"},
            "body": {b"HTTP/1.1 408 Request Timeout"},
            "stalled-body": {b"HTTP/1.1 408 Request Timeout"},
        }
        text, _ = m.render()
        assert b'route="",status="408"' in text
        assert b'route="/v1/embeddings",status="408"' in text
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_a_large_body_at_a_normal_rate_is_not_cut_and_headers_over_64_kib_are_431():
    with served(max_in_flight=4, header_timeout_s=1.0, body_timeout_s=0.5) as (url, port, _, _m):
        texts = ["word " * 2000] * 64  # 640 KB: 10 s at the minimum rate, sent in ~2 s
        body = orjson.dumps({"model": "embed", "input": texts})
        head = (
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(head)
        for i in range(0, len(body), 64 * 1024):
            s.sendall(body[i : i + 64 * 1024])
            time.sleep(0.2)  # ~320 KB/s: over the minimum rate, longer than 0.5 s in all
        assert read_until_closed(s, 5.0).startswith(b"HTTP/1.1 200 OK")
        s.close()
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000)
        assert read_until_closed(s, 5.0).startswith(b"HTTP/1.1 431 ")
        s.close()
        # complete headers over the limit in one write (the parser would finish them in one
        # read): 431 too; and 10,000 small headers
        for big in (b"X-Big: " + b"a" * 100_000 + b"\r\n", b"X-A: aaaaaa\r\n" * 10_000):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
            assert read_until_closed(s, 5.0).startswith(b"HTTP/1.1 431 ")
            s.close()
        # headers just under the limit followed by a body in the same write: not refused
        s = socket.create_connection(("127.0.0.1", port))
        pad = b"X-Pad: " + b"a" * 60_000 + b"\r\n"
        s.sendall(head.replace(b"Host: x\r\n", b"Host: x\r\n" + pad) + body)
        assert read_until_closed(s, 5.0).startswith(b"HTTP/1.1 200 OK")
        s.close()


def test_huggingface_hub_inference_client_on_the_base_url():
    from huggingface_hub import InferenceClient

    with served(max_in_flight=4, header_timeout_s=5.0, body_timeout_s=5.0) as (url, _, _, _m):
        got = InferenceClient(model=url).feature_extraction("a b")
        expected = httpx.post(f"{url}/embed", json={"inputs": "a b"}).json()
        assert got.shape == (1, 8)
        assert np.array_equal(got, np.array(expected, dtype=np.float32))


@pytest.mark.parametrize("http", [protocol.HttpToolsProtocol, protocol.H11Protocol])
def test_a_chunked_body_over_the_limit_gets_one_413_and_the_connection_is_closed(http):
    """The rest of a body the gateway refused is not read as a next request (was: a 431)."""
    limits = {"max_in_flight": 4, "header_timeout_s": 5.0, "body_timeout_s": 5.0, "http": http}
    with served(**limits) as (url, port, _, _m):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"%x\r\n" % (1 << 20) + b" " * (1 << 20) + b"\r\n"
        with contextlib.suppress(OSError):  # the gateway may close while we still send
            for _ in range(DEFAULT_MAX_BODY_BYTES // (1 << 20) + 4):
                s.sendall(chunk)
        answer = read_until_closed(s, 10.0)
        s.close()
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert answer.count(b"HTTP/1.1 ") == 1, answer[:400]
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
