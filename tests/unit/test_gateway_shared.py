"""What ``--workers N`` processes share: buckets, slots, usage (SQLite), metrics (files).

Two :class:`SharedStore` connections on one folder stand for two workers (the end-to-end
test with a real ``--workers 2`` gateway is tests/integration/test_gateway_workers.py).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time

import pytest
from triton_embed_server.gateway.fair import FairQueue, Scheduler, Ticket
from triton_embed_server.gateway.metrics import MULTIPROC_ENV, reap_dead_workers
from triton_embed_server.gateway.quota import TokenBucket
from triton_embed_server.gateway.shared import REAP_INTERVAL_S, SharedStore, SharedUsageLedger
from triton_embed_server.gateway.tenancy import TenantRegistry
from triton_embed_server.gateway.tenants import load_tenants

from tests.unit.test_gateway_tenants import tenants_yaml


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def workers(tmp_path, clock):
    """Two workers' stores on one folder, sharing one clock."""
    stores = [SharedStore(tmp_path, clock=clock, wall_clock=clock) for _ in range(2)]
    yield stores
    for store in stores:
        store.close()


def dead_pid() -> int:
    process = multiprocessing.get_context("spawn").Process(target=int)
    process.start()
    process.join()
    return process.pid


# ---- token buckets ---------------------------------------------------------------------------


def test_two_workers_charge_one_bucket_and_refuse_after_the_tokens_of_one(workers, clock):
    """The same charges, alternating between workers, leave one bucket where one worker's is."""
    a = workers[0].bucket("t", tokens_per_minute=600, burst=100)
    b = workers[1].bucket("t", tokens_per_minute=600, burst=100)
    alone = TokenBucket(600, 100, clock)
    served = {"shared": 0, "alone": 0}
    for i in range(40):
        bucket = (a, b)[i % 2]
        if bucket.retry_after_s() == 0:
            bucket.charge(7)
            served["shared"] += 7
        if alone.retry_after_s() == 0:
            alone.charge(7)
            served["alone"] += 7
    assert served["shared"] == served["alone"] == 105  # 15 requests: the 15th took it to -5
    assert a.level == b.level == alone.level == -5
    assert a.retry_after_s() == b.retry_after_s() == alone.retry_after_s() == 1
    clock.now += 3600
    assert a.level == 100  # refilled to the burst, not above


def test_a_bucket_keeps_its_level_when_another_worker_opens_it_or_the_file_is_reloaded(
    workers, clock
):
    workers[0].bucket("t", 600, 100).charge(30)
    late = workers[1].bucket("t", 600, 100)  # a worker (re)started later
    assert late.level == 70
    late.reconfigure(60, 50)
    assert late.level == 50 and late.rate_per_s == 1.0


def test_the_registry_of_each_worker_uses_the_shared_buckets(tmp_path, workers, clock):
    path = tmp_path / "tenants.yaml"
    path.write_text(tenants_yaml())
    registries = [
        TenantRegistry(load_tenants(path), path, clock=clock, store=store) for store in workers
    ]
    indexer = registries[0].tenants.tenants["indexer"]  # 60 tokens/minute, burst 10
    registries[0].charge(indexer, 6)
    registries[1].charge(indexer, 6)
    for registry in registries:
        with pytest.raises(Exception, match="over its token rate"):
            registry.admit(indexer)


# ---- slots (max_concurrency) -------------------------------------------------------------------


def test_max_concurrency_counts_every_workers_slots(workers):
    a, b = workers
    assert a.try_acquire("t", 2) and b.try_acquire("t", 2)
    assert not a.try_acquire("t", 2) and not b.try_acquire("t", 2)
    assert a.try_acquire("u", 2)  # another tenant's slots are its own
    b.release("t")
    assert a.try_acquire("t", 2)


def test_the_slots_of_a_dead_worker_are_given_back(workers):
    gone = dead_pid()
    with workers[0]._write():
        workers[0].db.execute("INSERT INTO slots VALUES ('t', ?, 2)", (gone,))
    assert not workers[1].try_acquire("t", 2)  # the last look was under a second ago (at open)
    workers[1]._reaped_at -= REAP_INTERVAL_S
    assert workers[1].try_acquire("t", 2) and workers[0].try_acquire("t", 2)
    assert not workers[0].try_acquire("t", 2)


def test_two_schedulers_keep_one_cap_and_the_waiting_one_goes_when_a_slot_is_freed(workers):
    async def scenario() -> list[str]:
        first, second = Scheduler(4, workers[0]), Scheduler(4, workers[1])
        order: list[str] = []
        release = asyncio.Event()

        async def request(scheduler: Scheduler, name: str) -> None:
            async with scheduler.turn(Ticket("t", 2, 1.0, 1, 10)):
                order.append(name)
                if name == "a":
                    await release.wait()

        a = asyncio.create_task(request(first, "a"))
        await asyncio.sleep(0.01)
        b = asyncio.create_task(request(second, "b"))
        await asyncio.sleep(0.05)
        assert order == ["a"] and second.waiting == 1  # the other worker holds the one slot
        release.set()
        await asyncio.wait_for(asyncio.gather(a, b), 2)
        return order

    assert asyncio.run(scenario()) == ["a", "b"]


def test_a_queue_passes_over_a_tenant_at_its_shared_cap(workers):
    queue = FairQueue(4, workers[1])
    assert workers[0].try_acquire("capped", 1)  # the other worker's request
    queue.push(Ticket("capped", 2, 1.0, 1, 10))
    free = queue.push(Ticket("free", 2, 1.0, None, 50))
    assert queue.pop() is free and queue.pop() is None
    workers[0].release("capped")
    assert queue.pop().tenant == "capped"


# ---- usage -------------------------------------------------------------------------------------


def test_usage_rows_are_every_workers_and_old_hours_are_dropped(workers, clock):
    a, b = (SharedUsageLedger(store) for store in workers)
    clock.now = 3600 * 500_000 + 10
    a.record("search", 2, 20)
    b.record("search", 1, 5)
    b.record("indexer", 16, 400)
    expected = [
        ("indexer", 500_000, 1, 16, 400),
        ("search", 500_000, 2, 3, 25),
    ]
    assert a.table() == b.table() == expected
    assert a.rows(2.5)[1] == {
        "tenant": "search", "hour": "2027-01-15T08:00:00Z", "requests": 2, "texts": 3,
        "tokens": 25, "cost_usd": 25 * 2.5 / 1e6,
    }  # fmt: skip
    clock.now += 31 * 24 * 3600
    b.record("search", 1, 1)
    assert a.table() == [("search", 500_000 + 31 * 24, 1, 1, 1)]


# ---- cost --------------------------------------------------------------------------------------


def test_a_shared_operation_takes_well_under_a_millisecond(tmp_path):
    store = SharedStore(tmp_path)
    bucket = store.bucket("t", 60_000_000, 10**9)
    ledger = SharedUsageLedger(store)
    n = 500
    started = time.perf_counter()
    for _ in range(n):
        bucket.retry_after_s()
        store.try_acquire("t", 10**6)
        store.release("t")
        bucket.charge(1)
        ledger.record("t", 1, 1)
    per_request_us = (time.perf_counter() - started) / n * 1e6
    print(f"shared store: {per_request_us:.0f} us per request (admit, slot, slot back, "
          "charge, usage)")  # fmt: skip
    assert per_request_us < 2000


# ---- metrics -----------------------------------------------------------------------------------


def test_the_live_gauge_files_of_dead_workers_are_removed(tmp_path):
    gone = dead_pid()
    for name in (f"gauge_livesum_{gone}.db", f"gauge_livesum_{os.getpid()}.db",
                 f"counter_{gone}.db"):  # fmt: skip
        (tmp_path / name).write_bytes(b"")
    assert reap_dead_workers(str(tmp_path)) == [gone]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [f"counter_{gone}.db", f"gauge_livesum_{os.getpid()}.db"]  # counts stay


WORKER = textwrap.dedent(
    """
    import sys
    from triton_embed_server.gateway.metrics import GatewayMetrics
    m = GatewayMetrics()
    for _ in range(int(sys.argv[1])):
        m.observe("/v1/embeddings", "embed", 200, 0.01, inputs=2, tokens=9)
    m.observe_tenant("search", 200, 2, 9, 1.0)
    m.in_flight.inc(int(sys.argv[1]))
    m.set_upstream("10.0.0.1:8001", True)
    if sys.argv[2] == "render":
        sys.stdout.write(m.render()[0].decode())
    """
)


def test_metrics_of_worker_processes_are_summed_in_any_workers_scrape(tmp_path):
    env = {**os.environ, MULTIPROC_ENV: str(tmp_path)}
    run = [sys.executable, "-c", WORKER]
    subprocess.run([*run, "3", "exit"], env=env, check=True)  # a worker that ran and exited
    text = subprocess.run(
        [*run, "4", "render"], env=env, check=True, capture_output=True, text=True
    ).stdout
    lines = set(text.splitlines())
    route = 'model="embed",route="/v1/embeddings"'
    assert f'triton_embed_gateway_requests_total{{{route},status="200"}} 7.0' in lines
    assert f"triton_embed_gateway_tokens_total{{{route}}} 63.0" in lines
    assert (
        'triton_embed_gateway_request_duration_seconds_count{route="/v1/embeddings"} 7.0' in lines
    )
    assert 'triton_embed_gateway_tenant_requests_total{status="200",tenant="search"} 2.0' in lines
    assert "triton_embed_gateway_in_flight 4.0" in lines  # the live worker's only
    assert 'triton_embed_gateway_upstream_up{upstream="10.0.0.1:8001"} 1.0' in lines
    assert not [line for line in lines if "pid=" in line]
