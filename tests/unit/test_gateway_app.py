"""The gateway's HTTP routes against a test double of its upstream pool (no Triton server).

``FakeUpstreamPool`` stands in for ``UpstreamPool``: it serves one embedding ensemble
(``embed``, alias ``org/model``, max_batch_size 4) with deterministic vectors, records the
pieces it was sent, and can be told to fail.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib

import numpy as np
import orjson
import pytest
from starlette.testclient import TestClient
from triton_embed.codec import frame_bytes
from triton_embed.transport.catalog import Catalog, ModelInfo
from triton_embed.transport.inference import MAX_INPUTS
from triton_embed_server.gateway import auth as auth_module
from triton_embed_server.gateway import tenants as tenants_module
from triton_embed_server.gateway.app import Gateway
from triton_embed_server.gateway.metrics import GatewayMetrics
from triton_embed_server.gateway.routes import build_app
from triton_embed_server.gateway.settings import GatewaySettings
from tritonclient.utils import InferenceServerException

from tests.unit.gateway_fakes import embed_info

DIM = 8
MODEL = embed_info(
    4,
    6,
    served_model_name="org/model",
    dimension=DIM,
    max_length=16,
    pooling="mean",
    normalize=True,
    max_batch_tokens=1024,
)
KEY = "s3cret-gateway-key"


def vector(payload: bytes) -> np.ndarray:
    """A deterministic unit float32 vector of a payload (its SHA-256 bytes)."""
    raw = np.frombuffer(hashlib.sha256(payload).digest(), dtype=np.uint8)[:DIM]
    v = raw.astype(np.float32) - 127.5
    return (v / np.linalg.norm(v)).astype("<f4")


class FakeUpstreamPool:
    """Test double of ``UpstreamPool``: answers like the shipped ensemble and its steps."""

    def __init__(self, catalog: Catalog | None = None, ready: bool = True):
        self.catalog = Catalog.build([MODEL]) if catalog is None else catalog
        self.ready = ready
        self.calls: list[tuple[str, int, dict]] = []
        self.fail: BaseException | None = None
        self.fail_on_piece: int | None = None
        self.delay_s = 0.0

    def any_ready(self) -> bool:
        return self.ready

    async def infer(self, model, inputs, outputs, parameters=None):
        ((name, elements),) = inputs.items()
        self.calls.append((model, len(elements), dict(parameters or {})))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail is not None and (
            self.fail_on_piece is None or self.fail_on_piece == len(self.calls) - 1
        ):
            raise self.fail
        if model == "tokenizer":
            ids = [
                np.array([101, *range(1000, 1000 + len(e.split())), 102], "<i4") for e in elements
            ]
            return {"TOKEN_IDS": frame_bytes(i.tobytes() for i in ids)}
        vectors = [vector(bytes(e)).tobytes() for e in elements]
        raw = {"EMBEDDING": frame_bytes(vectors)}
        if model == "embed":
            counts = [len(bytes(e).split()) + 2 for e in elements]
            raw["NUM_TOKENS"] = np.array(counts, "<i4").tobytes()
        return raw


def make_client(pool=None, *, key=None, **settings) -> tuple[TestClient, FakeUpstreamPool, Gateway]:
    pool = pool or FakeUpstreamPool()
    gateway = Gateway(
        GatewaySettings(upstreams=("127.0.0.1:1",), **settings), pool, GatewayMetrics(), key
    )
    return TestClient(build_app(gateway), raise_server_exceptions=False), pool, gateway


@pytest.fixture
def client():
    test_client, pool, _ = make_client()
    return test_client, pool


JSON_HEADERS = {"Content-Type": "application/json"}


def post(client, path, body, **kwargs):
    headers = {**JSON_HEADERS, **kwargs.pop("headers", {})}
    return client.post(path, content=orjson.dumps(body), headers=headers, **kwargs)


def assert_invalid_request(r, status: int, message: str, param: str, code: str) -> None:
    """``r`` is ``status`` with OpenAI's ``invalid_request_error`` envelope of these values."""
    assert r.status_code == status
    assert r.json()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": code,
    }


# ---- /v1/embeddings -----------------------------------------------------------------------


def test_openai_float_response_has_openai_shape_and_the_servers_float32_values(client):
    c, _ = client
    r = post(c, "/v1/embeddings", {"model": "embed", "input": ["a b", "c"]})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"object", "data", "model", "usage"}
    assert body["object"] == "list" and body["model"] == "embed"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in body["data"])
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert np.array_equal(got, np.stack([vector(b"a b"), vector(b"c")]))
    assert body["usage"] == {"prompt_tokens": 4 + 3, "total_tokens": 7}


def test_openai_base64_is_the_servers_bytes_exactly(client):
    c, _ = client
    r = post(c, "/v1/embeddings", {"model": "embed", "input": "x", "encoding_format": "base64"})
    assert r.status_code == 200
    (item,) = r.json()["data"]
    assert base64.b64decode(item["embedding"]) == vector(b"x").tobytes()


def test_a_large_request_is_split_into_max_batch_size_pieces_and_answered_in_order(client):
    c, pool = client
    texts = [f"text {i}" for i in range(11)]
    r = post(c, "/v1/embeddings", {"model": "embed", "input": texts, "encoding_format": "base64"})
    assert r.status_code == 200
    assert sorted(n for _, n, _ in pool.calls) == [3, 4, 4]
    got = [base64.b64decode(d["embedding"]) for d in r.json()["data"]]
    assert got == [vector(t.encode()).tobytes() for t in texts]


def test_chunked_requests_are_split_so_no_piece_can_pass_the_steps_token_budget():
    # The step refuses a request over its max_request_tokens (here 512). With CHUNK a text can
    # be max_chunks (16) windows of max_length (16) tokens: 256, so at most 2 texts a piece;
    # without CHUNK 16 tokens a text, so the ensemble's max_batch_size (4) still applies.
    info = ModelInfo(**{**MODEL.__dict__, "max_request_tokens": 512})
    assert info.piece_size("CHUNK") == 2 and info.piece_size(None) == 4
    c, pool, _ = make_client(FakeUpstreamPool(Catalog.build([info])))
    texts = [f"text {i}" for i in range(5)]
    r = post(c, "/v1/embeddings", {"model": "embed", "input": texts, "truncate": "CHUNK"})
    assert r.status_code == 200, r.text
    assert sorted(n for _, n, _ in pool.calls) == [1, 2, 2]
    pool.calls.clear()
    r = post(c, "/v1/embeddings", {"model": "embed", "input": texts})
    assert r.status_code == 200, r.text
    assert sorted(n for _, n, _ in pool.calls) == [1, 4]


def test_the_alias_is_accepted_and_echoed(client):
    c, pool = client
    r = post(c, "/v1/embeddings", {"model": "org/model", "input": "x"})
    assert r.status_code == 200 and r.json()["model"] == "org/model"
    assert pool.calls[0][0] == "embed"


def test_token_ids_go_to_the_embedder_and_count_as_tokens(client):
    c, pool = client
    r = post(c, "/v1/embeddings", {"model": "embed", "input": [[1, 2, 3], [4, 5]]})
    assert r.status_code == 200
    assert pool.calls == [("embedder", 2, {})]
    assert r.json()["usage"]["prompt_tokens"] == 5
    r = post(c, "/v1/embeddings", {"model": "embed", "input": [7, 8, 9, 10]})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 4
    expected = vector(np.array([7, 8, 9, 10], "<i4").tobytes())
    assert np.allclose(r.json()["data"][0]["embedding"], expected)


def test_options_become_request_parameters(client):
    c, pool = client
    body = {
        "model": "embed",
        "input": "x",
        "dimensions": 4,
        "input_type": "query",
        "truncate": "end",
        "user": "someone",
    }
    assert post(c, "/v1/embeddings", body).status_code == 200
    assert pool.calls[-1][2] == {"truncation": "END", "input_type": "query", "dimensions": 4}
    body = {"model": "embed", "input": "x", "truncation": "NONE", "dimensions": None}
    assert post(c, "/v1/embeddings", body).status_code == 200
    assert pool.calls[-1][2] == {"truncation": "NONE"}


BAD_REQUESTS = [
    ([1, 2], "the request body must be a JSON object"),
    (
        {"model": "embed", "input": "x", "foo": 1},
        "unknown field 'foo'; the fields are input, model, encoding_format, dimensions, "
        "input_type, truncate, truncation, user",
    ),
    (
        {"input": "x"},
        "'model' is required: the name of an embedding model (GET /v1/models lists them)",
    ),
    ({"model": 3, "input": "x"}, "'model' must be a non-empty string"),
    (
        {"model": "embed"},
        "'input' is required: a string, a list of strings, a list of token IDs or a list of "
        "token-ID lists",
    ),
    (
        {"model": "embed", "input": {"a": 1}},
        "'input' must be a string, a list of strings, a list of token IDs or a list of "
        "token-ID lists; got an object",
    ),
    ({"model": "embed", "input": []}, "'input' is an empty list; send at least one input"),
    (
        {"model": "embed", "input": ["a", 3]},
        "input[1] is a number; a list that starts with a string must hold only strings",
    ),
    (
        {"model": "embed", "input": [[1], "a"]},
        "input[1] is a string; a list that starts with a list of token IDs must hold only "
        "lists of token IDs",
    ),
    (
        {"model": "embed", "input": [1, -2]},
        "input[1] is -2; a token ID is a whole number from 0 to 2147483647",
    ),
    (
        {"model": "embed", "input": [[1], [2, 2**31]]},
        "input[1][1] is 2147483648; a token ID is a whole number from 0 to 2147483647",
    ),
    (
        {"model": "embed", "input": [[1], [True]]},
        "input[1][0] is true; a token ID is a whole number from 0 to 2147483647",
    ),
    (
        {"model": "embed", "input": [1.5]},
        "input[0] is a number; 'input' must be a string, a list of strings, a list of token "
        "IDs or a list of token-ID lists",
    ),
    (
        {"model": "embed", "input": "x", "encoding_format": "int8"},
        "'encoding_format' must be 'float' or 'base64', got 'int8'",
    ),
    (
        {"model": "embed", "input": "x", "truncate": "END", "truncation": "END"},
        "send one of 'truncate' and 'truncation' (the same option), not both",
    ),
    (
        {"model": "embed", "input": "x", "truncate": "middle"},
        "'truncate' must be one of NONE, END, START, CHUNK; got 'middle'",
    ),
    (
        {"model": "embed", "input": "x", "dimensions": 0},
        "'dimensions' must be a whole number from 1 to 2147483647 (one of the model's "
        "dimensions; GET /v1/models lists its full dimension); got 0",
    ),
    (
        {"model": "embed", "input": "x", "input_type": ""},
        "'input_type' must be a prompt name of the model such as query or document; got ''",
    ),
    (
        {"model": "embed", "input": [1, 2], "input_type": "query"},
        "'input_type' applies to text input; token IDs are embedded as given (send text, or "
        "leave it out)",
    ),
    (
        {"model": "embed", "input": [[1, 2]], "truncation": "END"},
        "'truncation' applies to text input; token IDs are embedded as given (send text, or "
        "leave it out)",
    ),
]


@pytest.mark.parametrize("body, message", BAD_REQUESTS)
def test_bad_openai_requests_are_400_with_their_message(client, body, message):
    c, pool = client
    r = post(c, "/v1/embeddings", body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"] == message
    assert error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}
    assert pool.calls == []


def test_malformed_json_is_400(client):
    c, _ = client
    r = c.post("/v1/embeddings", content=b'{"model": "embed", "input": ', headers=JSON_HEADERS)
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("the request body is not valid JSON: ")
    r = c.post("/v1/embeddings", content=b"", headers=JSON_HEADERS)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "the request body is empty; send a JSON object"
    # bytes that are not UTF-8: said so, with their position (orjson said "surrogates", char 0)
    body = b'{"model": "embed", "input": ["\xff"]}'
    r = c.post("/v1/embeddings", content=body, headers=JSON_HEADERS)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "the request body is not valid UTF-8 at byte 30 (invalid start byte); send JSON "
        "encoded in UTF-8 (JSON's \\u escapes for any character)"
    )


def test_2048_inputs_are_served_and_2049_are_413(client):
    c, pool = client
    r = post(c, "/v1/embeddings", {"model": "embed", "input": ["x"] * MAX_INPUTS})
    assert r.status_code == 200 and len(r.json()["data"]) == MAX_INPUTS
    pool.calls.clear()
    r = post(c, "/v1/embeddings", {"model": "embed", "input": ["x"] * (MAX_INPUTS + 1)})
    message = (
        "'input' has 2049 inputs; at most 2048 are allowed per request; split them over "
        "several requests"
    )
    assert_invalid_request(r, 413, message, "input", "too_many_inputs")
    r = post(c, "/v1/embeddings", {"model": "embed", "input": [[1]] * (MAX_INPUTS + 1)})
    assert r.status_code == 413
    assert pool.calls == []


def test_a_body_over_the_limit_is_413_by_content_length_and_by_its_stream():
    c, pool, _ = make_client(max_body_mb=0.001)  # 1048 bytes
    body = orjson.dumps({"model": "embed", "input": ["x" * 2000]})
    r = c.post("/v1/embeddings", content=body, headers=JSON_HEADERS)
    assert r.status_code == 413
    assert r.json()["error"]["message"] == (
        f"the request body is {len(body)} bytes (Content-Length); the gateway accepts at most "
        "1048 bytes (0.000999451 MiB, --max-body-mb); send fewer or shorter inputs per request"
    )

    def chunks():
        for i in range(0, len(body), 100):
            yield body[i : i + 100]

    r = c.post(
        "/v1/embeddings", content=chunks(), headers=JSON_HEADERS
    )  # chunked: no Content-Length
    assert r.status_code == 413
    assert r.json()["error"]["message"].startswith("the request body is over 1048 bytes;")
    assert pool.calls == []


def test_unknown_model_is_404_listing_the_models(client):
    c, _ = client
    r = post(c, "/v1/embeddings", {"model": "nope", "input": "x"})
    message = "the model 'nope' does not exist; the models are: embed, org/model (GET /v1/models)"
    assert_invalid_request(r, 404, message, "model", "model_not_found")


def test_no_ready_upstream_is_503():
    c, _, _ = make_client(FakeUpstreamPool(catalog=Catalog(), ready=False))
    r = post(c, "/v1/embeddings", {"model": "embed", "input": "x"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "service_unavailable"
    assert c.get("/v1/models").status_code == 503
    r = c.get("/health")
    assert r.status_code == 503
    assert r.json() == {"error": "no upstream is ready", "error_type": "Unhealthy"}


def upstream_error(status: str, message: str) -> InferenceServerException:
    return InferenceServerException(msg=message, status=f"StatusCode.{status}")


@pytest.mark.parametrize(
    "status, message, http_status, openai_type",
    [
        (
            "INVALID_ARGUMENT",
            "in ensemble 'embed', text 1 has 602 tokens; the model accepts 256",
            400,
            "invalid_request_error",
        ),
        (
            "UNAVAILABLE",
            "in ensemble 'embed', [request id: <id_unknown>] Exceeds maximum queue size",
            429,
            "rate_limit_error",
        ),
        ("DEADLINE_EXCEEDED", "Deadline Exceeded", 504, "timeout_error"),
        ("UNAVAILABLE", "failed to connect to all addresses", 503, "service_unavailable"),
        (
            "NOT_FOUND",
            "Request for unknown model: 'embed' is not found",
            503,
            "service_unavailable",
        ),
        ("INTERNAL", "engine error: vLLM died", 502, "api_error"),
    ],
)
def test_upstream_errors_map_to_their_status(client, status, message, http_status, openai_type):
    c, pool = client
    pool.fail = upstream_error(status, message)
    r = post(c, "/v1/embeddings", {"model": "embed", "input": ["a", "b"]})
    assert r.status_code == http_status
    assert r.json()["error"]["type"] == openai_type
    assert message in r.json()["error"]["message"]
    if http_status == 429:
        assert r.headers["retry-after"] == "1"


def test_a_servers_text_index_is_renumbered_to_the_requests(client):
    c, pool = client
    pool.fail = upstream_error("INVALID_ARGUMENT", "in ensemble 'embed', text 1 is empty; ...")
    pool.fail_on_piece = 2  # the third piece: inputs 8 to 11
    r = post(c, "/v1/embeddings", {"model": "embed", "input": ["x"] * 12})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "in ensemble 'embed', text 9 is empty; ..."
    assert r.json()["error"]["param"] == "input"


def test_an_unexpected_exception_is_a_short_500_and_is_logged(client, caplog):
    c, pool = client

    async def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero, secret details")

    pool.infer = broken
    r = post(c, "/v1/embeddings", {"model": "embed", "input": "x"})
    assert r.status_code == 500
    assert r.json() == {
        "error": {
            "message": "internal error in the gateway; its log has the details",
            "type": "server_error",
            "param": None,
            "code": "internal",
        }
    }
    r = post(c, "/embed", {"inputs": "x"})
    assert r.status_code == 500
    assert r.json() == {
        "error": "internal error in the gateway; its log has the details",
        "error_type": "Backend",
    }
    assert "secret details" not in r.text and "Traceback" not in r.text
    assert "ZeroDivisionError: division by zero, secret details" in caplog.text


# ---- in flight, auth, metrics -------------------------------------------------------------


def test_requests_past_max_in_flight_are_429_with_retry_after():
    pool = FakeUpstreamPool()
    pool.delay_s = 0.3
    c, _, gateway = make_client(pool, max_in_flight=1)
    gateway.in_flight = 1  # one request already in the gateway
    r = post(c, "/v1/embeddings", {"model": "embed", "input": "x"})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "overloaded"
    r = post(c, "/embed", {"inputs": "x"})
    assert r.status_code == 429 and r.json()["error_type"] == "Overloaded"
    assert c.get("/health").status_code == 200  # not counted
    gateway.in_flight = 0
    assert post(c, "/v1/embeddings", {"model": "embed", "input": "x"}).status_code == 200
    assert gateway.in_flight == 0


def test_with_a_key_every_route_but_health_and_metrics_needs_it():
    c, _, _ = make_client(key=KEY)
    good = {"Authorization": f"Bearer {KEY}"}
    for headers, status in [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": f"Basic {KEY}"}, 401),
        (good, 200),
        ({"Authorization": f"bearer {KEY}"}, 200),
    ]:
        r = post(c, "/v1/embeddings", {"model": "embed", "input": "x"}, headers=headers)
        assert r.status_code == status, headers
        if status == 401:
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert KEY not in r.text
    for path in ("/v1/models", "/info"):
        assert c.get(path).status_code == 401
        assert c.get(path, headers=good).status_code == 200
    r = post(c, "/embed", {"inputs": "x"})
    assert r.status_code == 401 and r.json()["error_type"] == "Unauthorized"
    assert post(c, "/tokenize", {"inputs": "x"}).status_code == 401
    assert c.get("/health").status_code == 200
    assert c.get("/metrics").status_code == 200


def test_without_a_key_the_gateway_is_open(client):
    c, _ = client
    assert post(c, "/v1/embeddings", {"model": "embed", "input": "x"}).status_code == 200


def test_the_key_is_compared_in_constant_time(monkeypatch):
    seen = []
    real = tenants_module.hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tenants_module.hmac, "compare_digest", spy)
    c, _, _ = make_client(key=KEY)
    post(
        c,
        "/v1/embeddings",
        {"model": "embed", "input": "x"},
        headers={"Authorization": "Bearer no"},
    )
    # The SHA-256 digests are compared (tenants.py), every configured one: here the one key's.
    assert seen == [(hashlib.sha256(b"no").digest(), hashlib.sha256(KEY.encode()).digest())]


def test_the_api_key_comes_from_the_file_then_the_environment(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(f"  {KEY}\n")
    assert auth_module.load_api_key(key_file, {}) == KEY
    assert auth_module.load_api_key(None, {auth_module.API_KEY_ENV: "from-env"}) == "from-env"
    assert auth_module.load_api_key(None, {}) is None
    key_file.write_text("a key with spaces")
    with pytest.raises(ValueError, match="empty or holds whitespace") as info:
        auth_module.load_api_key(key_file, {})
    assert "spaces" not in str(info.value)


def test_metrics_count_requests_by_route_model_and_status(client):
    c, _ = client
    post(c, "/v1/embeddings", {"model": "org/model", "input": "x"})
    post(c, "/v1/embeddings", {"model": "nope", "input": "x"})
    post(c, "/embed", {"inputs": "x"})
    text = c.get("/metrics").text
    assert (
        'triton_embed_gateway_requests_total{model="embed",route="/v1/embeddings",status="200"} 1.0'
        in text
    )
    assert (
        'triton_embed_gateway_requests_total{model="",route="/v1/embeddings",status="404"} 1.0'
        in text
    )
    assert (
        'triton_embed_gateway_requests_total{model="embed",route="/embed",status="200"} 1.0' in text
    )
    assert 'triton_embed_gateway_request_duration_seconds_count{route="/embed"} 1.0' in text
    assert "triton_embed_gateway_in_flight 0.0" in text


# ---- /v1/models ---------------------------------------------------------------------------


def test_models_lists_every_name_with_dimension_and_token_budget(client):
    c, _ = client
    body = c.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["embed", "org/model"]
    for m in body["data"]:
        assert m["object"] == "model" and m["owned_by"] == "triton-embed"
        assert isinstance(m["created"], int)
        assert m["root"] == "embed" and m["dimension"] == DIM and m["max_length"] == 16


# ---- TEI routes ---------------------------------------------------------------------------


def test_tei_embed_returns_a_list_of_vectors(client):
    c, pool = client
    r = post(c, "/embed", {"inputs": "a b"})
    assert r.status_code == 200
    assert np.array_equal(np.array(r.json(), dtype=np.float32), vector(b"a b")[None])
    assert pool.calls[-1] == ("embed", 1, {"truncation": "NONE"})
    r = post(c, "/embed", {"inputs": ["a", "b", "c", "d", "e"], "truncate": True})
    assert len(r.json()) == 5
    assert pool.calls[-1][2] == {"truncation": "END"}
    body = {
        "inputs": ["a"],
        "truncate": True,
        "truncation_direction": "Left",
        "prompt_name": "query",
        "dimensions": 4,
        "normalize": True,
    }
    assert post(c, "/embed", body).status_code == 200
    assert pool.calls[-1][2] == {"truncation": "START", "input_type": "query", "dimensions": 4}


def test_tei_embed_normalize_false_is_sent_as_the_request_parameter(client):
    """Haystack's TEI request shape: ``normalize: false`` reaches the embedder step."""
    c, pool = client
    r = post(c, "/embed", {"inputs": ["x", "y"], "normalize": False, "truncate": True})
    assert r.status_code == 200
    assert pool.calls[-1] == ("embed", 2, {"truncation": "END", "normalize": False})
    assert post(c, "/embed", {"inputs": "x", "normalize": True}).status_code == 200
    assert pool.calls[-1] == ("embed", 1, {"truncation": "NONE"})  # default: unchanged


def test_tei_embed_normalizes_the_vectors_of_a_model_that_does_not():
    info = ModelInfo(**{**MODEL.__dict__, "normalize": False})
    pool = FakeUpstreamPool(catalog=Catalog.build([info]))
    real = pool.infer

    async def doubled(*args, **kwargs):
        raw = await real(*args, **kwargs)
        vectors = [2 * vector(b"x")] * (len(raw["NUM_TOKENS"]) // 4)
        return {**raw, "EMBEDDING": frame_bytes(v.astype("<f4").tobytes() for v in vectors)}

    pool.infer = doubled
    c, _, _ = make_client(pool)
    normalized = np.array(post(c, "/embed", {"inputs": "x"}).json(), dtype=np.float32)
    assert np.allclose(normalized[0], vector(b"x"))
    raw = np.array(post(c, "/embed", {"inputs": "x", "normalize": False}).json())
    assert np.allclose(raw[0], 2 * vector(b"x"))
    assert pool.calls[-1][2] == {"truncation": "NONE", "normalize": False}


@pytest.mark.parametrize(
    "body, status, message, error_type",
    [
        ({"inputs": []}, 400, "'inputs' is an empty list; send at least one input", "Empty"),
        (
            {"inputs": ["x"] * 2049},
            413,
            "'inputs' has 2049 inputs; at most 2048 are allowed per request; split them over "
            "several requests",
            "Validation",
        ),
        (
            {"inputs": "x", "truncation_direction": "up"},
            400,
            "'truncation_direction' must be 'Left' or 'Right', got 'up'",
            "Validation",
        ),
        (
            {"inputs": "x", "truncate": "yes"},
            400,
            "'truncate' must be true or false, got 'yes'",
            "Validation",
        ),  # noqa: E501
        (
            {"inputs": "x", "raw_scores": True},
            400,
            "unknown field 'raw_scores'; the fields are inputs, normalize, truncate, "
            "truncation_direction, prompt_name, dimensions",
            "Validation",
        ),
        (
            {"normalize": True},
            400,
            "'inputs' is required: a string, a list of strings, a list of token IDs or a list "
            "of token-ID lists",
            "Validation",
        ),
        (
            {"inputs": [1, 2], "prompt_name": "query"},
            400,
            "'prompt_name' applies to text input; token IDs are embedded as given (send text, "
            "or leave it out)",
            "Validation",
        ),
    ],
)
def test_bad_tei_embed_requests(client, body, status, message, error_type):
    c, _ = client
    r = post(c, "/embed", body)
    assert r.status_code == status
    assert r.json() == {"error": message, "error_type": error_type}


def test_tei_embed_of_token_ids(client):
    c, pool = client
    r = post(c, "/embed", {"inputs": [[5, 6], [7]]})
    assert r.status_code == 200 and len(r.json()) == 2
    assert pool.calls[-1] == ("embedder", 2, {})


def test_tei_tokenize_names_its_own_field_for_an_empty_text(client):
    c, pool = client
    r = post(c, "/tokenize", {"inputs": ["a", ""]})
    assert r.status_code == 400
    assert r.json()["error"] == (
        "inputs[1] is an empty string; model 'embed' does not embed empty texts: send at least "
        "one character in each input"
    )
    assert pool.calls == []  # refused before any upstream call


def test_an_unknown_field_of_any_length_is_bounded_in_message_and_param(client):
    c, _ = client
    r = post(c, "/v1/embeddings", {"model": "embed", "input": "x", "z" * 100_000: 1})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "z" * 64 and error["code"] == "unknown_field"
    assert len(r.content) < 1_000


def test_tei_tokenize_returns_ids_and_nulls_for_what_the_step_does_not_give(client):
    c, pool = client
    r = post(c, "/tokenize", {"inputs": "hello big world"})
    assert r.status_code == 200
    assert [t["id"] for t in r.json()[0]] == [101, 1000, 1001, 1002, 102]
    assert r.json()[0][0] == {"id": 101, "text": None, "special": None, "start": None, "stop": None}
    assert pool.calls[-1] == ("tokenizer", 1, {"truncation": "NONE"})
    r = post(c, "/tokenize", {"inputs": ["a", "b c"], "prompt_name": "query"})
    assert [len(x) for x in r.json()] == [3, 4]
    assert pool.calls[-1][2] == {"truncation": "NONE", "input_type": "query"}
    r = post(c, "/tokenize", {"inputs": "x", "add_special_tokens": False})
    assert r.status_code == 400
    assert r.json()["error"] == (
        "add_special_tokens=false is not supported: the model's tokenizer step always adds its "
        "special tokens"
    )
    r = post(c, "/tokenize", {"inputs": [1, 2]})
    assert r.status_code == 400


def test_tei_info_describes_the_default_model(client):
    c, _ = client
    info = c.get("/info").json()
    assert info["model_id"] == "org/model"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 16
    assert info["max_client_batch_size"] == 2048
    assert info["max_batch_tokens"] == 1024
    assert info["model_dtype"] == "float32"
    assert isinstance(info["version"], str)


def test_tei_routes_use_the_default_model():
    c, _, _ = make_client(default_model="other")
    r = c.get("/info")
    assert r.status_code == 404
    assert r.json()["error_type"] == "NotFound"
    assert "'other' does not exist" in r.json()["error"]


def test_health_is_200_with_an_empty_body(client):
    c, _ = client
    r = c.get("/health")
    assert r.status_code == 200 and r.content == b""


def test_unknown_routes_and_methods_answer_in_the_apis_envelope(client):
    c, _ = client
    r = c.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_route"
    r = c.get("/v1/embeddings")
    assert r.status_code == 405
    assert r.json()["error"]["message"] == "/v1/embeddings does not take GET"
    assert "POST" in r.headers["allow"]
    r = c.post("/health")
    assert r.status_code == 405 and r.json()["error_type"] == "Validation"
    r = c.get("/nothing")
    assert r.status_code == 404 and r.json()["error_type"] == "NotFound"
