"""The gateway's request path in one process, with and without the workers' shared store.

What ``--workers N`` adds to a request (:mod:`triton_embed_server.gateway.shared`: the
tenant's bucket, slot and usage row in SQLite) against the one-worker path, without a
server: the unit tests' fake upstream pool (``tests/unit/test_gateway_app.py``) answers,
and ``httpx`` drives the app in-process. One tenant with a ``tokens_per_minute`` and a
``max_concurrency`` (so both paths do all their work), one-text requests one after another;
prints microseconds per request for each mode, alternating (this machine's speed drifts).

    PYTHONPATH=. .venv/bin/python -m perf.gateway_workers --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from triton_embed_server.gateway.app import Gateway
from triton_embed_server.gateway.metrics import GatewayMetrics
from triton_embed_server.gateway.routes import build_app
from triton_embed_server.gateway.settings import GatewaySettings
from triton_embed_server.gateway.shared import SharedStore
from triton_embed_server.gateway.tenancy import TenantRegistry
from triton_embed_server.gateway.tenants import load_tenants

from tests.unit.test_gateway_app import FakeUpstreamPool

KEY = "bench-key-0123456789"


def gateway_app(folder: Path, shared: bool):
    """The app of a gateway with one tenant; its limits in the shared store if ``shared``."""
    path = folder / "tenants.yaml"
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    path.write_text(
        f"tenants:\n  - name: t\n    keys_sha256: [{digest}]\n    priority: interactive\n"
        "    tokens_per_minute: 1000000000\n    max_concurrency: 1000\n"
    )
    store = SharedStore(folder) if shared else None
    tenants = TenantRegistry(load_tenants(path), path, store=store)
    settings = GatewaySettings(upstreams=("127.0.0.1:1",))
    gateway = Gateway(settings, FakeUpstreamPool(), GatewayMetrics(), None, tenants, store=store)
    return build_app(gateway)


async def per_request_us(app, requests: int) -> float:
    """Microseconds per one-text ``POST /v1/embeddings``, after 200 to warm up."""
    body = orjson.dumps({"model": "embed", "input": ["a b c"]})
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        for _ in range(200):
            await client.post("/v1/embeddings", content=body, headers=headers)
        started = time.perf_counter()
        for _ in range(requests):
            r = await client.post("/v1/embeddings", content=body, headers=headers)
            r.raise_for_status()
        return (time.perf_counter() - started) / requests * 1e6


def main() -> None:
    """Alternate the two modes ``--rounds`` times and print each run."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=3000)
    args = p.parse_args()
    for _ in range(args.rounds):
        for shared in (False, True):
            with tempfile.TemporaryDirectory() as folder:
                app = gateway_app(Path(folder), shared)
                us = asyncio.run(per_request_us(app, args.requests))
            print(f"{'shared store' if shared else 'one worker  '}: {us:.0f} us/request")


if __name__ == "__main__":
    main()
