"""A gateway with ``--workers 2`` keeps each tenant's limits and reports one set of figures.

A real gateway process in front of the session ``server`` (a real tritonserver), once with
one worker and once with two. Each test holds one keep-alive connection to each worker
(which worker accepted a connection is read from the processes' sockets, psutil) and sends
its requests alternately over them, so that with two workers each one serves half:

* a tenant's ``tokens_per_minute`` bucket refuses it (429) after the same tokens as with one
  worker: exactly, for the same requests;
* its ``max_concurrency`` of 1 holds across workers: a request on the other worker waits
  until the first one is answered (and a tenant without a cap is not made to wait);
* every scrape of ``/metrics``, whichever worker answers, counts each request once;
* ``GET /admin/usage`` answers the sum of both workers' rows, whichever worker answers;
* the folder the workers share is private (0700), a killed worker's counts stay and its
  live gauge goes, and the folder is removed when the gateway exits.
"""

from __future__ import annotations

import hashlib
import http.client
import math
import os
import signal
import stat
import textwrap
import threading
import time
import urllib.request

import orjson
import psutil
import pytest
from triton_embed.admin import ADMIN_HEADER
from triton_embed_server.run.launcher import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNTED, SMALL, CAPPED = "counted-key-0123456789", "small-key-0123456789", "capped-key-012345678"
#: The ``small`` tenant's bucket: 1 token per minute (no refill to speak of), burst BURST.
BURST = 100
#: A text of 5 words: 7 tokens with [CLS] and [SEP] (all-MiniLM-L6-v2's WordPiece).
SHORT = "alpha beta gamma delta epsilon"
#: A text the model truncates at its 256 tokens: 64 of them keep the CPU engine busy for
#: a second or more.
LONG = " ".join(f"word{i % 50} is here" for i in range(200))


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module", params=[1, 2], ids=["1-worker", "2-workers"])
def gateway(server, tmp_path_factory, request):
    path = tmp_path_factory.mktemp("workers") / "tenants.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            usd_per_million_tokens: 1.0
            tenants:
              - name: counted
                keys_sha256: [{sha(COUNTED)}]
                priority: interactive
              - name: small
                keys_sha256: [{sha(SMALL)}]
                priority: interactive
                tokens_per_minute: 1
                burst: {BURST}
              - name: capped
                keys_sha256: [{sha(CAPPED)}]
                priority: interactive
                max_concurrency: 1
            """
        )
    )
    gw = Gateway([server.grpc_url], server.admin_key, api_key=COUNTED, tenants=path,
                 workers=request.param)  # fmt: skip
    with gw:
        yield gw
    print(f"\ngateway log: {gw.log_path}")


def _serving_pid(gateway: Gateway, local_port: int) -> int | None:
    parent = psutil.Process(gateway.process.pid)
    for process in [parent, *parent.children(recursive=True)]:
        try:
            sockets = process.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(s.raddr and s.raddr.port == local_port for s in sockets):
            return process.pid
    return None


def call(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    key: str | None = None,
    body: dict | None = None,
    headers: dict | None = None,
) -> tuple[int, dict, bytes]:
    """One request on ``conn``: status, headers, body."""
    sent = dict(headers or {})
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    data = None
    if body is not None:
        data = orjson.dumps(body)
        sent["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=sent)
    response = conn.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


@pytest.fixture
def conns(gateway) -> list[http.client.HTTPConnection]:
    """Two keep-alive connections: one to each worker (both to the one), each lists ``embed``."""
    picked: list[http.client.HTTPConnection] = []
    pids: list[int] = []
    deadline = time.monotonic() + 60
    while len(picked) < 2:
        assert time.monotonic() < deadline, f"not every worker took a connection: {pids}"
        conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=120)
        status, _, body = call(conn, "GET", "/v1/models", COUNTED)
        pid = _serving_pid(gateway, conn.sock.getsockname()[1])
        if (
            status != 200
            or b'"embed"' not in body
            or pid is None
            or (gateway.workers > 1 and pid in pids)
        ):
            conn.close()
            time.sleep(0.05)
            continue
        picked.append(conn)
        pids.append(pid)
    yield picked
    for conn in picked:
        conn.close()


def embed(conn, key: str, texts: list[str]) -> tuple[int, dict, dict]:
    status, headers, body = call(conn, "POST", "/v1/embeddings", key,
                                 {"model": "embed", "input": texts})  # fmt: skip
    return status, headers, orjson.loads(body)


def test_a_tenants_token_rate_holds_for_all_workers_together(conns):
    served, answers = 0, []
    for i in range(BURST):
        status, headers, body = embed(conns[i % 2], SMALL, [SHORT])
        answers.append(status)
        if status != 200:
            break
        assert body["usage"]["total_tokens"] == 7
        served += 7
    assert answers[-1] == 429, answers
    assert body["error"]["code"] == "rate_limit_exceeded" and int(headers["retry-after"]) >= 1
    # Admitted while the bucket is above 0, charged after: ceil(100 / 7) = 15 requests, as
    # one worker alone serves them (with a bucket per worker, two workers served 210).
    assert served == math.ceil(BURST / 7) * 7 == 105
    for conn in conns:  # and now refused on every worker
        assert embed(conn, SMALL, [SHORT])[0] == 429


def _timed(conn, key: str, texts: list[str], out: dict, name: str) -> None:
    status, _, _ = embed(conn, key, texts)
    out[name] = (status, time.monotonic())


def _race(conns, key: str) -> dict:
    """A long request on the first worker, then a short one on the other 0.3 s later."""
    out: dict = {}
    long = threading.Thread(target=_timed, args=(conns[0], key, [LONG] * 64, out, "long"))
    long.start()
    time.sleep(0.3)
    _timed(conns[1], key, [SHORT], out, "short")
    long.join()
    return out


def test_max_concurrency_holds_across_workers(gateway, conns):
    out = _race(conns, CAPPED)
    assert out["long"][0] == out["short"][0] == 200
    assert out["short"][1] >= out["long"][1] - 0.05  # it waited for the tenant's one slot
    if gateway.workers > 1:  # the check can tell: a tenant without a cap is not held back
        out = _race(conns, COUNTED)
        assert out["short"][1] < out["long"][1] - 0.2


def _sample(text: str, name: str, labels: str = "") -> float:
    series = f"{name}{{{labels}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(series):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_and_usage_count_every_request_once_whichever_worker_answers(gateway, conns):
    tenant = 'status="200",tenant="counted"'
    before = urllib.request.urlopen(f"{gateway.base_url}/metrics").read().decode()
    base = _sample(before, "triton_embed_gateway_tenant_requests_total", tenant)
    base_tokens = _sample(before, "triton_embed_gateway_tenant_tokens_total", 'tenant="counted"')
    tokens = 0
    for i in range(20):
        status, _, body = embed(conns[i % 2], COUNTED, [SHORT] * (1 + i % 3))
        assert status == 200
        tokens += body["usage"]["total_tokens"]
    scrapes = [call(conn, "GET", "/metrics")[2].decode() for conn in conns for _ in range(3)]
    scrapes += [urllib.request.urlopen(f"{gateway.base_url}/metrics").read().decode()
                for _ in range(6)]  # fmt: skip
    for text in scrapes:
        assert _sample(text, "triton_embed_gateway_tenant_requests_total", tenant) == base + 20
        assert (
            _sample(text, "triton_embed_gateway_tenant_tokens_total", 'tenant="counted"')
            == base_tokens + tokens
        )
        assert "triton_embed_gateway_in_flight 0.0" in text.splitlines()  # none now
    admin = {ADMIN_HEADER: gateway.admin_key}
    for conn in conns:
        status, _, body = call(conn, "GET", "/admin/usage?tenant=counted", headers=admin)
        assert status == 200
        rows = orjson.loads(body)["usage"]
        assert sum(r["tokens"] for r in rows) == base_tokens + tokens
        assert sum(r["requests"] for r in rows) == base + 20


def _workers_of(gateway: Gateway) -> dict[int, str]:
    """pid -> the shared folder, of each worker that has the shared store open."""
    found = {}
    for process in psutil.Process(gateway.process.pid).children(recursive=True):
        try:
            files = process.open_files()
        except psutil.Error:
            continue
        for f in files:
            if f.path.endswith("/limits.sqlite"):
                found[process.pid] = os.path.dirname(f.path)
    return found


def test_the_shared_folder_is_private_outlives_a_killed_worker_and_is_removed_at_exit(server):
    with Gateway([server.grpc_url], server.admin_key, workers=2) as gw:
        deadline = time.monotonic() + 60
        while len(workers := _workers_of(gw)) < 2:
            assert time.monotonic() < deadline, workers
            time.sleep(0.1)
        (folder,) = set(workers.values())
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        url = f"{gw.base_url}/v1/embeddings"
        for _ in range(6):
            request = urllib.request.Request(url, orjson.dumps({"model": "embed", "input": SHORT}),
                                             {"Content-Type": "application/json"})  # fmt: skip
            assert urllib.request.urlopen(request).status == 200
        killed = min(workers)
        os.kill(killed, signal.SIGKILL)  # uvicorn starts another one
        while killed in (workers := _workers_of(gw)) or len(workers) < 2:
            assert time.monotonic() < deadline + 60, workers
            time.sleep(0.1)
        series = 'model="embed",route="/v1/embeddings",status="200"'
        for _ in range(6):
            text = urllib.request.urlopen(f"{gw.base_url}/metrics").read().decode()
            assert _sample(text, "triton_embed_gateway_requests_total", series) == 6
            assert "triton_embed_gateway_in_flight 0.0" in text.splitlines()
        assert not os.path.exists(os.path.join(folder, f"gauge_livesum_{killed}.db"))
    assert not os.path.exists(folder)
