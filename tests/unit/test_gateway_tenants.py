"""Tenants in the gateway: 401/403/429 in both envelopes, counters, usage, priorities, reload.

Against ``FakeUpstreamPool`` (tests/unit/test_gateway_app.py): ``embed`` (alias ``org/model``)
answers ``NUM_TOKENS`` = words + 2 per text.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
import logging
import os
import signal
import textwrap

import httpx
import pytest
from starlette.testclient import TestClient
from triton_embed.transport.priorities import REQUEST_PRIORITY
from triton_embed_server.gateway.app import Gateway
from triton_embed_server.gateway.metrics import GatewayMetrics
from triton_embed_server.gateway.routes import build_app
from triton_embed_server.gateway.settings import GatewaySettings
from triton_embed_server.gateway.tenancy import TenantRegistry
from triton_embed_server.gateway.tenants import load_tenants

from tests.unit.test_gateway_app import FakeUpstreamPool, post

SEARCH, INDEXER, OTHER = "search-key-0123456789", "indexer-key-0123456789", "other-key-012345678"
ADMIN = "admin-key-0123456789abcdef"
USD_PER_MILLION = 2.5


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tenants_yaml(search_key: str = SEARCH) -> str:
    return textwrap.dedent(
        f"""\
        usd_per_million_tokens: {USD_PER_MILLION}
        tenants:
          - name: search
            keys_sha256: [{sha(search_key)}]
            priority: interactive
            models: [org/model]
          - name: indexer
            keys_sha256: [{sha(INDEXER)}]
            priority: batch
            tokens_per_minute: 60
            burst: 10
            weight: 3
          - name: other
            keys_sha256: [{sha(OTHER)}]
            priority: batch
            models: [rerank]
        """
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class PriorityPool(FakeUpstreamPool):
    """Records the Triton priority level each upstream call is sent at."""

    def __init__(self) -> None:
        super().__init__()
        self.levels: list[int] = []

    async def infer(self, model, inputs, outputs, parameters=None):
        self.levels.append(REQUEST_PRIORITY.get())
        return await super().infer(model, inputs, outputs, parameters)


@pytest.fixture
def tenants_file(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text(tenants_yaml())
    return path


@pytest.fixture
def setup(tenants_file):
    clock = Clock()
    registry = TenantRegistry(load_tenants(tenants_file), tenants_file, clock=clock)
    pool = PriorityPool()
    gateway = Gateway(
        GatewaySettings(upstreams=("127.0.0.1:1",)), pool, GatewayMetrics(), None, registry, ADMIN
    )
    client = TestClient(build_app(gateway), raise_server_exceptions=False)
    return client, pool, gateway, clock


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def embed(client, key: str | None, texts, model: str = "embed"):
    headers = bearer(key) if key else {}
    return post(client, "/v1/embeddings", {"model": model, "input": texts}, headers=headers)


def metric(client, name: str, **labels: str) -> float:
    """One sample's value from ``GET /metrics`` (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # exposition order
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# ---- 401 -------------------------------------------------------------------------------------


def test_no_key_and_an_unknown_key_are_401_in_each_apis_envelope(setup):
    c, pool, _, _ = setup
    for key, message in (
        (None, "missing API key: send the header 'Authorization: Bearer <key>' (the openai "
               "SDK sends its api_key so)"),
        ("unknown-key-0123456789", "invalid API key"),
    ):  # fmt: skip
        r = embed(c, key, "x")
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == 'Bearer realm="triton-embed"'
        assert r.json() == {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
        r = post(c, "/embed", {"inputs": "x"}, headers=bearer(key) if key else {})
        assert r.status_code == 401
        assert r.json() == {"error": message, "error_type": "Unauthorized"}
    assert pool.calls == []
    assert metric(c, "triton_embed_gateway_tenant_refusals_total", tenant="",
                  reason="unauthorized") == 4  # fmt: skip


# ---- 403 -------------------------------------------------------------------------------------


def test_a_model_the_tenant_may_not_use_is_403_in_each_apis_envelope(setup):
    c, pool, _, _ = setup
    message = "tenant 'other' may not use the model 'embed'; its models are: rerank"
    r = embed(c, OTHER, "x")
    assert r.status_code == 403
    assert r.json() == {
        "error": {
            "message": message,
            "type": "permission_error",
            "param": "model",
            "code": "model_not_allowed",
        }
    }
    # TEI's routes name no model: the message names none either (no name leaks)
    default = "tenant 'other' may not use the gateway's default model; its models are: rerank"
    r = post(c, "/embed", {"inputs": "x"}, headers=bearer(OTHER))
    assert r.status_code == 403
    assert r.json() == {"error": default, "error_type": "Unauthorized"}
    assert post(c, "/tokenize", {"inputs": "x"}, headers=bearer(OTHER)).status_code == 403
    r = c.get("/info", headers=bearer(OTHER))  # was 200 with the default model's name
    assert (r.status_code, r.json()) == (403, {"error": default, "error_type": "Unauthorized"})
    assert c.get("/info", headers=bearer(INDEXER)).status_code == 200
    # an alias is quoted as sent, not resolved to the ensemble's name
    r = embed(c, OTHER, "x", model="org/model")
    assert r.json()["error"]["message"] == message.replace("'embed'", "'org/model'")
    assert pool.calls == []
    assert metric(c, "triton_embed_gateway_tenant_refusals_total", tenant="other",
                  reason="model_not_allowed") == 5  # fmt: skip


def test_a_model_the_tenant_may_not_use_is_403_before_the_routes_own_checks(setup):
    # "other" may use rerank only: a request for embed with a bad option is 403, not the 400
    # that would tell it what the model accepts
    c, pool, _, _ = setup
    body = {"model": "embed", "input": "x", "dimensions": -5}
    r = post(c, "/v1/embeddings", body, headers=bearer(OTHER))
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "model_not_allowed"
    assert post(c, "/v1/embeddings", body, headers=bearer(INDEXER)).status_code == 400
    assert pool.calls == []


def test_the_model_list_shows_a_tenant_only_its_models(setup):
    c, _, _, _ = setup
    ids = {m["id"] for m in c.get("/v1/models", headers=bearer(SEARCH)).json()["data"]}
    assert ids == {"embed", "org/model"}
    assert c.get("/v1/models", headers=bearer(OTHER)).json()["data"] == []  # rerank: not served


def test_an_unknown_model_404_lists_only_the_models_the_tenant_may_use(setup):
    c, _, _, _ = setup
    for key, listed in ((SEARCH, "embed, org/model"), (INDEXER, "embed, org/model"),
                        (OTHER, "none")):  # fmt: skip
        r = embed(c, key, "x", model="nope")
        assert r.status_code == 404, r.text
        message = r.json()["error"]["message"]
        assert message.endswith(f"the models are: {listed} (GET /v1/models)"), message


def test_a_tenants_model_may_be_named_by_its_alias_or_ensemble_name(setup):
    c, _, _, _ = setup
    assert embed(c, SEARCH, "x", model="org/model").status_code == 200
    assert embed(c, SEARCH, "x", model="embed").status_code == 200  # models: [org/model]
    assert embed(c, INDEXER, "x").status_code == 200  # no models: all


# ---- 429 -------------------------------------------------------------------------------------


def test_a_tenant_over_its_token_rate_is_429_with_retry_after_until_refilled(setup):
    c, pool, _, clock = setup
    # indexer: 60 tokens/min (1 per s), burst 10. 20 words + 2 = 22 tokens: admitted (the
    # bucket holds 10 > 0), charged after: the level is 10 - 22 = -12.
    r = embed(c, INDEXER, " ".join(["w"] * 20))
    assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == 22
    calls = len(pool.calls)
    r = embed(c, INDEXER, "x")
    assert r.status_code == 429
    assert r.headers["retry-after"] == "13"  # (1 - -12) tokens at 1 token/s
    assert r.json() == {
        "error": {
            "message": "tenant 'indexer' is over its token rate (60 tokens per minute, burst "
            "10); retry after 13 s",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    r = post(c, "/embed", {"inputs": "x"}, headers=bearer(INDEXER))
    assert r.status_code == 429 and r.headers["retry-after"] == "13"
    assert r.json()["error_type"] == "Overloaded"
    assert len(pool.calls) == calls  # refused before any upstream work
    assert embed(c, SEARCH, "x").status_code == 200  # another tenant is not limited
    clock.now += 12.0
    assert embed(c, INDEXER, "x").headers["retry-after"] == "1"
    clock.now += 1.0
    assert embed(c, INDEXER, "x").status_code == 200
    assert metric(c, "triton_embed_gateway_tenant_refusals_total", tenant="indexer",
                  reason="rate_limited") == 3  # fmt: skip


def test_requests_that_arrive_together_are_held_to_the_bucket(setup):
    """Each takes its estimate as it goes upstream: one goes, the rest are 429 at once."""
    _, pool, gateway, _ = setup
    pool.delay_s = 0.2  # all ten are in the gateway before the first is answered
    app = build_app(gateway)

    async def flood() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            body = {"model": "embed", "input": " ".join(["w"] * 20)}  # 22 tokens served
            answers = await asyncio.gather(
                *(client.post("/v1/embeddings", json=body, headers=bearer(INDEXER))
                  for _ in range(10))
            )  # fmt: skip
        return sorted(r.status_code for r in answers)

    # indexer: burst 10; the first takes its estimate (> 10), the bucket is then below 0
    assert asyncio.run(flood()) == [200] + [429] * 9
    assert len(pool.calls) == 1


def test_the_rate_limit_is_not_the_servers_overload(setup):
    c, pool, gateway, _ = setup
    gateway.max_in_flight = 0  # every counted request is refused by the gateway's own bound
    r = embed(c, SEARCH, "x")
    assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded"
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert metric(c, "triton_embed_gateway_tenant_refusals_total", tenant="search",
                  reason="overloaded") == 1  # fmt: skip


# ---- counters, usage, cost --------------------------------------------------------------------


def test_the_tenant_counters_rise_by_exactly_the_tokens_and_texts_served(setup):
    c, _, _, _ = setup
    sent = [["a b", "c"], ["one two three four"], ["x"] * 5]
    tokens = 0
    for texts in sent:
        r = embed(c, SEARCH, texts)
        assert r.status_code == 200
        tokens += r.json()["usage"]["total_tokens"]
    assert tokens == (4 + 3) + 6 + 5 * 3
    assert metric(c, "triton_embed_gateway_tenant_tokens_total", tenant="search") == tokens
    assert metric(c, "triton_embed_gateway_tenant_texts_total", tenant="search") == 8
    assert metric(c, "triton_embed_gateway_tenant_requests_total", tenant="search",
                  status="200") == 3  # fmt: skip
    cost = metric(c, "triton_embed_gateway_tenant_cost_usd_total", tenant="search")
    assert cost == pytest.approx(tokens * USD_PER_MILLION / 1e6, rel=1e-9)
    embed(c, SEARCH, "")  # 400: nothing served, nothing counted but the request
    assert metric(c, "triton_embed_gateway_tenant_tokens_total", tenant="search") == tokens
    assert metric(c, "triton_embed_gateway_tenant_requests_total", tenant="search",
                  status="400") == 1  # fmt: skip


def test_an_upstream_failure_is_counted_as_the_tenants_error(setup):
    from tritonclient.utils import InferenceServerException

    c, pool, _, _ = setup
    pool.fail = InferenceServerException(msg="engine broke", status="StatusCode.INTERNAL")
    assert embed(c, SEARCH, "x").status_code == 502
    assert metric(c, "triton_embed_gateway_tenant_errors_total", tenant="search",
                  status="502") == 1  # fmt: skip


def test_usage_route_gives_tokens_and_cost_per_tenant_and_hour_behind_the_admin_key(setup):
    c, _, _, _ = setup
    a = embed(c, SEARCH, ["a b", "c"]).json()["usage"]["total_tokens"]
    b = embed(c, INDEXER, ["x"]).json()["usage"]["total_tokens"]
    admin = {"triton-embed-admin-key": ADMIN}
    r = c.get("/admin/usage", headers=admin)
    assert r.status_code == 200
    body = r.json()
    assert body["usd_per_million_tokens"] == USD_PER_MILLION
    rows = {row["tenant"]: row for row in body["usage"]}
    assert set(rows) == {"search", "indexer"}
    assert (rows["search"]["requests"], rows["search"]["texts"], rows["search"]["tokens"]) == (
        1, 2, a,
    )  # fmt: skip
    assert rows["indexer"]["tokens"] == b
    assert rows["search"]["cost_usd"] == pytest.approx(a * USD_PER_MILLION / 1e6)
    assert rows["search"]["hour"].endswith(":00:00Z")
    r = c.get("/admin/usage?format=csv&tenant=search", headers=bearer(ADMIN))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert [(t["tenant"], int(t["tokens"])) for t in table] == [("search", a)]
    assert c.get("/admin/usage").status_code == 401
    assert c.get("/admin/usage", headers=bearer(SEARCH)).status_code == 401  # a tenant's key
    assert c.get("/admin/usage?format=xml", headers=admin).status_code == 400


def test_usage_route_is_closed_without_an_admin_key(tenants_file):
    registry = TenantRegistry(load_tenants(tenants_file), tenants_file)
    gateway = Gateway(GatewaySettings(upstreams=("127.0.0.1:1",)), FakeUpstreamPool(),
                      GatewayMetrics(), None, registry)  # fmt: skip
    c = TestClient(build_app(gateway), raise_server_exceptions=False)
    r = c.get("/admin/usage", headers={"triton-embed-admin-key": ADMIN})
    assert r.status_code == 403 and r.json()["error"]["code"] == "no_admin_key"


# ---- priorities --------------------------------------------------------------------------------


def test_each_tenants_calls_go_at_its_classs_priority_level(setup):
    c, pool, _, _ = setup
    embed(c, SEARCH, ["a", "b", "c", "d", "e"])  # 2 pieces of max_batch_size 4
    assert pool.levels == [1, 1]
    pool.levels.clear()
    embed(c, INDEXER, "x")
    post(c, "/tokenize", {"inputs": "x"}, headers=bearer(INDEXER))
    assert pool.levels == [2, 2]
    assert REQUEST_PRIORITY.get() == 0  # reset after each request


def test_the_api_key_file_is_one_interactive_tenant():
    pool = PriorityPool()
    gateway = Gateway(GatewaySettings(upstreams=("127.0.0.1:1",)), pool, GatewayMetrics(),
                      "only-key-0123456789")  # fmt: skip
    c = TestClient(build_app(gateway), raise_server_exceptions=False)
    assert embed(c, "only-key-0123456789", "x").status_code == 200
    assert embed(c, "other-key", "x").status_code == 401
    assert pool.levels == [1]
    assert metric(c, "triton_embed_gateway_tenant_tokens_total", tenant="default") == 3


# ---- reload ----------------------------------------------------------------------------------


def test_a_reload_while_requests_are_in_flight_loses_none(setup, tenants_file):
    c, pool, gateway, _ = setup
    pool.delay_s = 0.2
    app = build_app(gateway)
    new_key = "search-key-after-reload"

    async def scenario() -> tuple[list[int], int, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:

            async def one(i: int) -> int:
                r = await client.post(
                    "/v1/embeddings",
                    json={"model": "embed", "input": f"text {i}"},
                    headers=bearer(SEARCH),
                )
                return r.status_code

            tasks = [asyncio.create_task(one(i)) for i in range(20)]
            await asyncio.sleep(0.05)  # all in flight, waiting on the upstream
            tenants_file.write_text(tenants_yaml(search_key=new_key))
            assert gateway.tenancy.reload()
            statuses = await asyncio.gather(*tasks)
            old = await client.post(
                "/v1/embeddings", json={"model": "embed", "input": "x"}, headers=bearer(SEARCH)
            )
            new = await client.post(
                "/v1/embeddings", json={"model": "embed", "input": "x"}, headers=bearer(new_key)
            )
            return statuses, old.status_code, new.status_code

    statuses, old, new = asyncio.run(scenario())
    assert statuses == [200] * 20
    assert (old, new) == (401, 200)


def test_a_bad_file_is_refused_with_its_line_and_the_old_tenants_stay(setup, tenants_file, caplog):
    c, _, gateway, _ = setup
    text = tenants_yaml().replace("priority: batch", "priority: bulk", 1)
    tenants_file.write_text(text)
    with caplog.at_level(logging.ERROR, logger="triton_embed.gateway"):
        assert gateway.tenancy.reload() is False
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "bulk" in s)
    assert (
        f"tenants file refused, the 3 tenants in force stay: {tenants_file}, line {line}, "
        "tenants[1].priority: Input should be 'interactive' or 'batch'"
    ) in caplog.text
    for key in (SEARCH, INDEXER, OTHER):
        assert key not in caplog.text
    assert embed(c, SEARCH, "x").status_code == 200


def test_sighup_reloads_the_file(setup, tenants_file):
    _, _, gateway, _ = setup
    new_key = "search-key-after-sighup"

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        assert gateway.tenancy.install_sighup(loop)
        try:
            tenants_file.write_text(tenants_yaml(search_key=new_key))
            os.kill(os.getpid(), signal.SIGHUP)
            for _ in range(100):
                await asyncio.sleep(0.01)
                if gateway.tenancy.tenants.identify(new_key) is not None:
                    return True
            return False
        finally:
            loop.remove_signal_handler(signal.SIGHUP)

    assert asyncio.run(scenario())
    assert gateway.tenancy.tenants.identify(SEARCH) is None


def test_a_changed_file_is_read_again_by_the_watcher(setup, tenants_file):
    _, _, gateway, _ = setup
    new_key = "search-key-after-change"

    async def scenario() -> bool:
        watcher = asyncio.create_task(gateway.tenancy.watch(interval_s=0.01))
        try:
            tenants_file.write_text(tenants_yaml(search_key=new_key))
            stat = tenants_file.stat()
            os.utime(tenants_file, (stat.st_atime, stat.st_mtime + 5))  # a coarse clock
            for _ in range(200):
                await asyncio.sleep(0.01)
                if gateway.tenancy.tenants.identify(new_key) is not None:
                    return True
            return False
        finally:
            watcher.cancel()

    assert asyncio.run(scenario())


def test_a_reload_keeps_a_tenants_bucket(setup, tenants_file):
    c, _, gateway, _ = setup
    embed(c, INDEXER, " ".join(["w"] * 20))  # in debt
    assert gateway.tenancy.reload()
    assert embed(c, INDEXER, "x").status_code == 429


def test_tenants_and_an_api_key_file_are_not_given_together(tenants_file, tmp_path):
    with pytest.raises(ValueError, match="give --tenants or --api-key-file, not both"):
        GatewaySettings(
            upstreams=("127.0.0.1:1",), tenants_file=str(tenants_file), api_key_file="k"
        )
