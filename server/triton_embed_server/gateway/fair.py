"""The gateway's request scheduler: priority classes, fair shares by tokens, concurrency caps.

At most ``--max-upstream-requests`` requests do upstream work at once; the others wait here
and are let through in this order (:class:`FairQueue`, a plain class the simulation test
drives; :class:`Scheduler`, its asyncio wrapper):

1. class: every waiting ``interactive`` request goes before any ``batch`` one (the same
   order Triton's priority levels keep inside the server, :mod:`triton_embed.priority`);
2. within a class, weighted fair queuing by tokens: start-time fair queuing (Goyal, Vin
   and Cheng, "Start-time Fair Queueing", SIGCOMM 1996). A request's start tag is
   ``max(V, F_t)``, ``F_t`` its tenant's last finish tag, and its tenant's finish tag
   becomes ``start + tokens / weight``; the waiting request with the smallest start tag
   goes first and ``V`` becomes its tag. Tokens are estimated when a request arrives
   (:func:`estimate_tokens`) and the tenant's finish tag is corrected by the tokens it was
   served when it is done, so shares converge on served tokens;
3. a tenant with ``max_concurrency`` requests already at the upstreams waits, and the next
   request of another tenant goes.

A tenant flooding its class thus gets its weight's share of the class's tokens while others
of the class have requests waiting, and all of it when they have none.

With ``--workers N`` each worker has its own queue and slots, and ``max_concurrency`` holds
for the whole gateway: a capped tenant's request also takes one of its slots in the
workers' shared store (:class:`~triton_embed_server.gateway.shared.SharedStore`, passed as
``shared``) and gives it back when done; while a request waits for a slot another worker
holds, the scheduler looks again every :data:`SHARED_POLL_S` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

#: Bytes per token a text is estimated at before the tokenizer step has counted it.
BYTES_PER_TOKEN_ESTIMATE = 4
#: Special tokens estimated per text.
SPECIAL_TOKENS_ESTIMATE = 2
#: Seconds between two looks at the shared slots while a request waits for one.
SHARED_POLL_S = 0.005


class SharedSlots(Protocol):
    """Tenants' slots held by all the gateway's workers (``--workers N``)."""

    def try_acquire(self, tenant: str, cap: int) -> bool:
        """Take one of ``tenant``'s ``cap`` slots if fewer are held; whether taken."""

    def release(self, tenant: str) -> None:
        """Give back one of ``tenant``'s slots."""


def estimate_tokens(sizes: Sequence[int], max_tokens_per_text: int | None = None) -> int:
    """An estimate of the tokens of texts of ``sizes`` UTF-8 bytes (at least 1 each).

    ``ceil(bytes / 4) + 2`` per text (English WordPiece and BPE average about 4 bytes per
    token), capped at the model's ``max_tokens_per_text`` where known.
    """
    total = 0
    for size in sizes:
        tokens = math.ceil(size / BYTES_PER_TOKEN_ESTIMATE) + SPECIAL_TOKENS_ESTIMATE
        if max_tokens_per_text is not None:
            tokens = min(tokens, max_tokens_per_text)
        total += max(1, tokens)
    return total


@dataclass(eq=False)
class Ticket:
    """One request's place in the queue.

    Attributes:
        tenant: its tenant's name.
        level: its class's priority level (1 first).
        weight: its tenant's weight.
        max_concurrency: its tenant's cap (``None``: none).
        cost: its estimated tokens.
        tokens: the tokens it was served (set by its caller before it is done).
        start: its start tag.
        seq: arrival order (ties).
        started: it has been let through.
    """

    tenant: str
    level: int
    weight: float
    max_concurrency: int | None
    cost: int
    tokens: int | None = None
    start: float = 0.0
    seq: int = 0
    started: bool = False
    future: asyncio.Future | None = field(default=None, repr=False)


class FairQueue:
    """The scheduling decisions, without asyncio (deterministic; the simulation test's).

    Args:
        slots: requests let through at once (>= 1).
        shared: the workers' shared slots (``--workers N``): ``max_concurrency`` counts
            every worker's requests; ``None``: this queue's alone.
    """

    def __init__(self, slots: int, shared: SharedSlots | None = None):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.shared = shared
        self.busy = 0
        self.waiting: list[Ticket] = []
        self.virtual: dict[int, float] = {}
        self.finish: dict[tuple[int, str], float] = {}
        self.in_service: dict[str, int] = {}
        self._seq = itertools.count()

    def push(self, ticket: Ticket) -> Ticket:
        """Queue ``ticket``: its start tag and its tenant's next finish tag are set."""
        key = (ticket.level, ticket.tenant)
        ticket.start = max(self.virtual.get(ticket.level, 0.0), self.finish.get(key, 0.0))
        self.finish[key] = ticket.start + ticket.cost / ticket.weight
        ticket.seq = next(self._seq)
        self.waiting.append(ticket)
        return ticket

    def _eligible(self, ticket: Ticket) -> bool:
        cap = ticket.max_concurrency
        return cap is None or self.in_service.get(ticket.tenant, 0) < cap

    def pop(self) -> Ticket | None:
        """The next ticket to let through now, or ``None`` (no free slot, or none eligible)."""
        if self.busy >= self.slots:
            return None
        full: set[str] = set()  # tenants at their cap in the shared slots
        while True:
            best = None
            for ticket in self.waiting:
                if ticket.tenant in full or not self._eligible(ticket):
                    continue
                if best is None or (ticket.level, ticket.start, ticket.seq) < (
                    best.level, best.start, best.seq,
                ):  # fmt: skip
                    best = ticket
            if best is None:
                return None
            cap = best.max_concurrency
            if self.shared is None or cap is None or self.shared.try_acquire(best.tenant, cap):
                break
            full.add(best.tenant)
        self.waiting.remove(best)
        self.virtual[best.level] = max(self.virtual.get(best.level, 0.0), best.start)
        self.busy += 1
        self.in_service[best.tenant] = self.in_service.get(best.tenant, 0) + 1
        best.started = True
        return best

    def remove(self, ticket: Ticket) -> None:
        """Take a waiting ticket out (its request was cancelled); its cost is given back."""
        if ticket in self.waiting:
            self.waiting.remove(ticket)
            key = (ticket.level, ticket.tenant)
            self.finish[key] = self.finish.get(key, 0.0) - ticket.cost / ticket.weight

    def done(self, ticket: Ticket) -> None:
        """A let-through ticket is done: its slot is free, its served tokens correct its tag."""
        self.busy -= 1
        if self.shared is not None and ticket.max_concurrency is not None:
            self.shared.release(ticket.tenant)
        count = self.in_service.get(ticket.tenant, 1) - 1
        if count:
            self.in_service[ticket.tenant] = count
        else:
            self.in_service.pop(ticket.tenant, None)
        if ticket.tokens is not None:
            key = (ticket.level, ticket.tenant)
            self.finish[key] = self.finish.get(key, 0.0) + (ticket.tokens - ticket.cost) / (
                ticket.weight
            )


class Scheduler:
    """:class:`FairQueue` for asyncio tasks: ``async with scheduler.turn(ticket): ...``.

    Args:
        slots: requests doing upstream work at once (``--max-upstream-requests``).
        shared: the workers' shared slots (``--workers N``; :class:`FairQueue`).
    """

    def __init__(self, slots: int, shared: SharedSlots | None = None):
        self.queue = FairQueue(slots, shared)
        self._poller: asyncio.Task | None = None

    @property
    def waiting(self) -> int:
        """Requests waiting now."""
        return len(self.queue.waiting)

    def _wake(self) -> None:
        while (ticket := self.queue.pop()) is not None:
            if ticket.future is not None and not ticket.future.done():
                ticket.future.set_result(None)

    def _dispatch(self) -> None:
        self._wake()
        shared = self.queue.shared is not None
        if shared and self.queue.waiting and (self._poller is None or self._poller.done()):
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        """Look again while requests wait: another worker may have given a slot back."""
        while self.queue.waiting:
            await asyncio.sleep(SHARED_POLL_S)
            self._wake()

    @contextlib.asynccontextmanager
    async def turn(self, ticket: Ticket) -> AsyncIterator[Ticket]:
        """Wait for ``ticket``'s turn, hold its slot while the body runs, then free it.

        Set ``ticket.tokens`` in the body to the tokens served (the fair-share correction).
        A task cancelled while waiting leaves the queue; one cancelled after its turn came
        frees its slot.
        """
        self.queue.push(ticket)
        ticket.future = asyncio.get_running_loop().create_future()
        self._dispatch()
        if not ticket.started:
            try:
                await ticket.future
            except asyncio.CancelledError:
                if ticket.started:
                    self.queue.done(ticket)
                    self._dispatch()
                else:
                    self.queue.remove(ticket)
                raise
        try:
            yield ticket
        finally:
            self.queue.done(ticket)
            self._dispatch()
