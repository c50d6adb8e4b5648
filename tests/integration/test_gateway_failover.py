"""A dead upstream costs no client request: two real servers behind one gateway, one killed.

Two real tritonservers on loopback (the shipped repository with one embedder instance each,
the same admin key) behind one gateway process (``--upstream a,b``). Client threads drive the
official ``openai`` SDK (its own retries off) the whole time, 16 texts per request, and check
every response against the gRPC path bit for bit. Mid-load, server b is SIGKILLed with its
supervisor and stubs: no request may fail (a call that was on b goes once more to a, counted
in ``triton_embed_gateway_upstream_retries_total``), and the gateway's
``triton_embed_gateway_upstream_up`` for b drops to 0. A new server on b's ports must be put
back (``upstream_up`` 1) and given requests again (its ``nv_inference_request_success``).
docs/operations.md, "Upstreams".
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from triton_embed import EmbeddingClient
from triton_embed_server.host.admin_key import generate_key
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import Gateway, TritonServer
from triton_embed_server.run.supervisor import remove_shm_regions

from tests.helpers import VECTOR_ATOL, metric_sum, stub_regions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

READY_TIMEOUT_S = 400.0  # a start on 2 shared cores takes 25-100 s, two at once longer
CLIENTS = 4  # client threads, each with its own openai.OpenAI
TEXTS_PER_REQUEST = 16
LOAD_S = 25.0  # the load before the restart, seconds from its start
KILL_AT_S = 10.0  # when server b is killed, seconds from the load's start
TAKEN_OUT_WITHIN_S = 10.0  # a failed call takes it out at once; a health check within 2 s
PUT_BACK_WITHIN_S = 30.0  # after the new server is ready: checks every 2 s, backoff <= 2 s
BALANCED_S = 10.0  # the load after b is back
MIN_SHARE = 0.1  # each server's least share of the requests once both are up
EMBED_SUCCESS = "nv_inference_request_success"
UP = "triton_embed_gateway_upstream_up"
RETRIES = "triton_embed_gateway_upstream_retries_total"
REQUESTS = "triton_embed_gateway_requests_total"

TOPICS = ("the sea", "a cat on a mat", "tax law", "graph theory", "bread", "the moon", "rain")
TEXTS = [
    f"sentence {i}: a few words about {TOPICS[i % len(TOPICS)]}" + " and more" * (i % 5)
    for i in range(64)
]


def gateway_samples(url: str) -> list:
    """Every sample of the gateway's ``/metrics`` now."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def upstream_up(url: str, upstream: str) -> float | None:
    """``triton_embed_gateway_upstream_up{upstream}``, ``None`` when there is no such series."""
    samples = gateway_samples(url)
    values = [s.value for s in samples if s.name == UP and s.labels == {"upstream": upstream}]
    return values[0] if values else None


def embed_successes(server: TritonServer) -> float:
    """Requests the server's ``embed`` ensemble answered (Triton's counter).

    ``prometheus_client``'s parser names the samples of a counter ``<family>_total``.
    """
    return metric_sum(server.metric_samples(), f"{EMBED_SUCCESS}_total", model="embed")


def wait_all_up(gw: Gateway, upstreams: list[str], timeout_s: float = 60.0) -> None:
    """Until every upstream of the gateway is up (it already lists ``embed``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert gw.process.poll() is None, f"gateway exited:\n{gw.log_tail()}"
        try:
            if all(upstream_up(gw.base_url, u) == 1 for u in upstreams):
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.2)
    pytest.fail(f"gateway not up on {upstreams} after {timeout_s:.0f} s:\n{gw.log_tail()}")


@dataclass
class Pair:
    """The two servers; :attr:`b` is replaced when the test restarts it."""

    repository: Path
    admin_key: str
    logs: Path
    a: TritonServer | None = None
    b: TritonServer | None = None
    old_b: TritonServer | None = None

    def server(self, name: str, **ports: int) -> TritonServer:
        return TritonServer(
            model_repository=self.repository,
            admin_key=self.admin_key,
            ready_timeout_s=READY_TIMEOUT_S,
            log_path=self.logs / f"tritonserver-{name}.log",
            **ports,
        )

    def stop(self) -> None:
        for server in (self.a, self.old_b, self.b):
            if server is not None:
                server.stop()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two servers, one embedder instance each, same admin key; stopped even on failure."""
    root = tmp_path_factory.mktemp("failover")
    repository = copy_repository(root / "model_repository")
    edit_config(repository / "embedder" / "config.pbtxt", count=1)
    servers = Pair(repository, generate_key(), root)
    servers.a, servers.b = servers.server("a"), servers.server("b-first")
    try:
        with ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(s.start) for s in (servers.a, servers.b)]:
                started.result()
        yield servers
    finally:
        servers.stop()
        print(f"\nserver logs in {root}")


@pytest.fixture(scope="module")
def gateway(pair):
    upstreams = [pair.a.grpc_url, pair.b.grpc_url]
    with Gateway(upstreams, pair.admin_key, log_path=pair.logs / "gateway.log") as gw:
        wait_all_up(gw, upstreams)
        yield gw
    print(f"\ngateway log: {gw.log_path}")


@pytest.fixture(scope="module")
def reference(pair) -> np.ndarray:
    """float32 [64, dim]: :data:`TEXTS` over gRPC; both servers give the same vectors.

    The same within VECTOR_ATOL, not bit for bit: each server batches the texts its own way
    (at bfloat16 oneDNN picks AMX kernels by the batch's shape).
    """
    vectors = []
    for server in (pair.a, pair.b):
        with EmbeddingClient(server.grpc_url, admin_key=pair.admin_key) as client:
            vectors.append(client.embed(TEXTS))
    np.testing.assert_allclose(vectors[0], vectors[1], rtol=0, atol=VECTOR_ATOL)
    return vectors[0]


@dataclass(frozen=True)
class Outcome:
    """One client request: when it was sent (monotonic s), how long it took, what went wrong."""

    sent: float
    seconds: float
    error: str | None


class Load:
    """:data:`CLIENTS` threads sending 16 texts per request through the openai SDK until stopped.

    Each answer is checked against ``reference`` (bit for bit, in order); :attr:`pause_s`
    between requests lightens the load.
    """

    def __init__(self, url: str, reference: np.ndarray):
        self.url = url
        self.reference = reference
        self.pause_s = 0.0
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)
        ]

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=180)

    def since(self, t: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.sent >= t]

    def _client(self, number: int) -> None:
        import openai

        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)
        sent = 0
        while not self._stop.is_set():
            start = (number * 5 + sent * TEXTS_PER_REQUEST) % len(TEXTS)
            rows = [(start + k) % len(TEXTS) for k in range(TEXTS_PER_REQUEST)]
            t0 = time.monotonic()
            error = None
            try:
                response = client.embeddings.create(model="embed", input=[TEXTS[r] for r in rows])
                got = np.array([d.embedding for d in response.data], dtype=np.float32)
                if [d.index for d in response.data] != list(range(len(rows))):
                    error = "answers out of order"
                elif not np.allclose(got, self.reference[rows], rtol=0, atol=VECTOR_ATOL):
                    error = "vectors differ from the gRPC path's"
            except Exception as exc:  # noqa: BLE001 - every failure is the test's finding
                error = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.outcomes.append(Outcome(t0, time.monotonic() - t0, error))
            sent += 1
            if self.pause_s:
                self._stop.wait(self.pause_s)
        client.close()


def wait_for(condition, timeout_s: float, what: str, log: str = "") -> float:
    """Poll ``condition()`` every 0.1 s; the monotonic time it first held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.1)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s\n{log}")


def test_a_killed_upstream_costs_no_request_and_is_put_back(pair, gateway, reference):
    a, b_url = pair.a, pair.b.grpc_url
    first = {"a": embed_successes(a), "b": embed_successes(pair.b)}
    load = Load(gateway.base_url, reference).start()
    t_load = time.monotonic()
    try:
        # Both servers take requests before the kill.
        wait_for(
            lambda: embed_successes(a) > first["a"] and embed_successes(pair.b) > first["b"],
            KILL_AT_S,
            "both servers serving",
        )
        time.sleep(max(0.0, t_load + KILL_AT_S - time.monotonic()))

        # SIGKILL b with its supervisor and stubs (no restart); clear the stubs' /dev/shm.
        dead = pair.b
        regions = stub_regions(dead)
        t_kill = time.monotonic()
        os.killpg(dead.process.pid, signal.SIGKILL)
        dead.process.wait()
        remove_shm_regions(regions)
        pair.old_b = dead
        t_out = wait_for(
            lambda: upstream_up(gateway.base_url, b_url) == 0,
            TAKEN_OUT_WITHIN_S,
            "the gateway takes the dead upstream out",
            gateway.log_tail(),
        )
        time.sleep(max(0.0, t_load + LOAD_S - time.monotonic()))
        retries_after_kill = metric_sum(gateway_samples(gateway.base_url), RETRIES)
        answered_by_a_alone = load.since(t_out)

        # A new server on b's ports, under a light load meanwhile; the gateway puts it back.
        load.pause_s = 0.5
        pair.b = pair.server(
            "b-second",
            grpc_port=dead.grpc_port,
            http_port=dead.http_port,
            metrics_port=dead.metrics_port,
        )
        t_restart = time.monotonic()
        pair.b.start()
        t_ready = time.monotonic()
        assert pair.b.grpc_url == b_url
        t_back = wait_for(
            lambda: upstream_up(gateway.base_url, b_url) == 1,
            PUT_BACK_WITHIN_S,
            "the gateway puts the new server back",
            gateway.log_tail(),
        )
        load.pause_s = 0.0
        before = {"a": embed_successes(a), "b": embed_successes(pair.b)}
        time.sleep(BALANCED_S)
        after = {"a": embed_successes(a), "b": embed_successes(pair.b)}
    finally:
        load.stop()
    t_end = time.monotonic()

    outcomes = load.since(t_load)
    failed = [o for o in outcomes if o.error]
    while_out = [o for o in outcomes if t_kill <= o.sent <= t_back]
    samples = gateway_samples(gateway.base_url)
    retries = metric_sum(samples, RETRIES)
    served = {k: after[k] - before[k] for k in after}
    statuses = {
        s.labels["status"]: s.value
        for s in samples
        if s.name == REQUESTS and s.labels.get("route") == "/v1/embeddings"
    }
    latencies = sorted(o.seconds for o in outcomes)
    p50, slowest = latencies[len(latencies) // 2], latencies[-1]
    print(
        f"\n{len(outcomes)} requests of {TEXTS_PER_REQUEST} texts from {CLIENTS} clients in "
        f"{t_end - t_load:.0f} s, {len(failed)} failed; latency p50 {p50:.3f} s, "
        f"max {slowest:.2f} s\n"
        f"b killed at {t_kill - t_load:.1f} s, taken out {t_out - t_kill:.2f} s later; "
        f"{retries_after_kill:.0f} retries after the kill, {retries:.0f} in all\n"
        f"new b ready {t_ready - t_restart:.0f} s after its start, put back "
        f"{t_back - t_ready:.2f} s after ready; b out for {t_back - t_out:.0f} s, "
        f"{len(while_out)} requests sent meanwhile (all answered by a)\n"
        f"embed requests once b was back ({BALANCED_S:.0f} s): a {served['a']:.0f}, "
        f"b {served['b']:.0f}; gateway /v1/embeddings statuses {statuses}"
    )
    assert not failed, f"{len(failed)} of {len(outcomes)} failed, first: {failed[:3]}"
    assert len(answered_by_a_alone) >= CLIENTS, "the load ran on while b was out"
    assert retries_after_kill >= 1, "a call that was on b must have been retried on a"
    assert set(statuses) == {"200"}, statuses
    assert statuses["200"] == len(outcomes)
    total = served["a"] + served["b"]
    assert total > 0
    for name, count in served.items():
        assert count >= MIN_SHARE * total, f"server {name} got {count:.0f} of {total:.0f}"
