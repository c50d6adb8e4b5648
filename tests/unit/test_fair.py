"""The gateway's scheduler: fair shares by tokens, classes, caps; the token bucket."""

from __future__ import annotations

import asyncio
import heapq
import random

import pytest
from triton_embed_server.gateway.fair import FairQueue, Scheduler, Ticket, estimate_tokens
from triton_embed_server.gateway.quota import TokenBucket

INTERACTIVE, BATCH = 1, 2


def ticket(tenant: str, cost: int, *, level: int = BATCH, weight: float = 1.0, cap=None):
    return Ticket(tenant, level, weight, cap, cost)


def simulate(weights: dict[str, float], *, slots: int, seconds: float, seed: int = 7,
             noisy_estimates: bool = True) -> dict[str, int]:  # fmt: skip
    """Tenants flooding one class; tokens served per tenant in ``seconds`` of simulated time.

    Each tenant always keeps 8 requests waiting; a request has 10-500 tokens (seeded), its
    estimate off by up to 50% when ``noisy_estimates``; the upstream serves 1,000 tokens/s
    per slot. Returns the tokens each tenant was served.
    """
    rng = random.Random(seed)
    queue = FairQueue(slots)
    served = dict.fromkeys(weights, 0)
    now = 0.0
    running: list[tuple[float, int, Ticket]] = []
    seq = 0

    def arrive(tenant: str) -> None:
        tokens = rng.randint(10, 500)
        estimate = int(tokens * rng.uniform(0.5, 1.5)) if noisy_estimates else tokens
        t = queue.push(ticket(tenant, max(1, estimate), weight=weights[tenant]))
        t.tokens = tokens

    for tenant in weights:
        for _ in range(8):
            arrive(tenant)
    while now < seconds:
        while (t := queue.pop()) is not None:
            seq += 1
            heapq.heappush(running, (now + t.tokens / 1000.0, seq, t))
        now, _, t = heapq.heappop(running)
        queue.done(t)
        served[t.tenant] += t.tokens
        arrive(t.tenant)
    return served


@pytest.mark.parametrize("slots", [1, 4])
def test_weights_1_and_3_get_token_shares_within_10_percent_of_1_to_3(slots):
    served = simulate({"a": 1.0, "b": 3.0}, slots=slots, seconds=600)
    ratio = served["b"] / served["a"]
    assert 3 * 0.9 <= ratio <= 3 * 1.1, served


def test_equal_weights_get_equal_token_shares_whatever_their_request_sizes():
    served = simulate({"a": 1.0, "b": 1.0, "c": 1.0}, slots=2, seconds=600, seed=3)
    low, high = min(served.values()), max(served.values())
    assert high / low <= 1.1, served


def test_shares_are_by_tokens_not_requests():
    """Tenant small sends 10-token requests, big 1,000-token ones: equal weights, equal tokens."""
    queue = FairQueue(1)
    served = {"small": 0, "big": 0}
    for tenant, size, count in (("small", 10, 5000), ("big", 1000, 50)):  # 50,000 tokens each
        for _ in range(count):
            queue.push(ticket(tenant, size)).tokens = size
    while sum(served.values()) < 40_000:
        t = queue.pop()
        queue.done(t)
        served[t.tenant] += t.tokens
    assert 0.9 <= served["small"] / served["big"] <= 1.1, served


def test_interactive_requests_go_before_every_waiting_batch_request():
    queue = FairQueue(1)
    blocker = queue.push(ticket("x", 1))
    first = queue.pop()
    assert first is blocker
    batch = [queue.push(ticket("indexer", 100)) for _ in range(5)]
    interactive = queue.push(ticket("search", 100, level=INTERACTIVE))
    queue.done(first)
    assert queue.pop() is interactive
    queue.done(interactive)
    assert queue.pop() is batch[0]


def test_a_tenant_at_its_max_concurrency_waits_and_the_next_tenant_goes():
    queue = FairQueue(4)
    capped = [queue.push(ticket("capped", 10, cap=2)) for _ in range(4)]
    other = queue.push(ticket("other", 10_000))
    started = [queue.pop() for _ in range(4)]
    # Start tags: capped 0, 10, 20, 30; other 0. The fourth slot stays free: capped has 2.
    assert started == [capped[0], other, capped[1], None]
    queue.done(started[0])
    assert queue.pop() is capped[2]


def test_no_free_slot_lets_nothing_through():
    queue = FairQueue(1)
    queue.push(ticket("a", 1))
    queue.push(ticket("a", 1))
    assert queue.pop() is not None and queue.pop() is None


def test_the_estimate_is_a_quarter_of_the_bytes_plus_two_capped_at_the_budget():
    assert estimate_tokens([0, 4, 5, 1000]) == 2 + 3 + 4 + 252
    assert estimate_tokens([1000], max_tokens_per_text=256) == 252
    assert estimate_tokens([10_000], max_tokens_per_text=256) == 256


def test_the_scheduler_frees_the_slot_of_a_cancelled_waiter_and_of_a_finished_turn():
    async def scenario() -> list[str]:
        scheduler = Scheduler(1)
        order: list[str] = []
        release = asyncio.Event()

        async def hold(name: str, level: int) -> None:
            async with scheduler.turn(ticket(name, 10, level=level)) as t:
                order.append(name)
                await release.wait()
                t.tokens = 10

        first = asyncio.create_task(hold("first", BATCH))
        await asyncio.sleep(0)
        batch = asyncio.create_task(hold("batch", BATCH))
        gone = asyncio.create_task(hold("gone", INTERACTIVE))
        interactive = asyncio.create_task(hold("interactive", INTERACTIVE))
        await asyncio.sleep(0)
        assert scheduler.waiting == 3
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert scheduler.waiting == 2
        release.set()
        await asyncio.gather(first, batch, interactive)
        assert scheduler.queue.busy == 0 and not scheduler.queue.in_service
        return order

    assert asyncio.run(scenario()) == ["first", "interactive", "batch"]


# ---- the token bucket -----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_admits_while_above_zero_and_says_when_it_refills():
    clock = Clock()
    bucket = TokenBucket(tokens_per_minute=600, burst=100, clock=clock)  # 10 tokens/s
    assert bucket.retry_after_s() == 0
    bucket.charge(100)
    assert bucket.level == 0 and bucket.retry_after_s() == 1  # 1 token in 0.1 s: 1 s at least
    bucket.charge(95)  # a debt of 95 tokens
    assert bucket.retry_after_s() == 10  # 96 tokens at 10/s: 9.6 s, rounded up
    clock.now += 9.0
    assert bucket.retry_after_s() == 1
    clock.now += 1.0
    assert bucket.retry_after_s() == 0
    clock.now += 3600
    assert bucket.retry_after_s() == 0 and bucket.level == 100  # never above the burst


def test_a_reconfigured_bucket_keeps_its_level_within_the_new_burst():
    clock = Clock()
    bucket = TokenBucket(600, 100, clock)
    bucket.charge(30)
    bucket.reconfigure(60, 50)
    assert bucket.level == 50 and bucket.rate_per_s == 1.0


# ---- the upstream call gate ------------------------------------------------------------------


def test_the_call_gate_lets_interactive_calls_in_before_waiting_batch_calls():
    from triton_embed.transport.priorities import REQUEST_PRIORITY, PriorityGate

    async def scenario() -> list[str]:
        gate = PriorityGate(1)
        order: list[str] = []
        release = asyncio.Event()

        async def call(name: str, level: int) -> None:
            REQUEST_PRIORITY.set(level)  # this task's own context
            async with gate:
                order.append(name)
                await release.wait()

        first = asyncio.create_task(call("first", 2))
        await asyncio.sleep(0)
        waiters = [asyncio.create_task(call(n, lv)) for n, lv in
                   (("batch", 2), ("gone", 1), ("default", 0), ("interactive", 1))]  # fmt: skip
        await asyncio.sleep(0)
        waiters[1].cancel()
        release.set()
        await asyncio.gather(first, *waiters, return_exceptions=True)
        assert gate.free == 1
        return order

    # 0 (no priority sent) is the server's default level: interactive.
    assert asyncio.run(scenario()) == ["first", "default", "interactive", "batch"]
