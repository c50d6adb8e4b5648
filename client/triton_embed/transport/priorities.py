"""A request's Triton priority level in the transport, and a gate that admits by it.

:data:`REQUEST_PRIORITY` is the level the calls made in the current context are sent at
(:mod:`triton_embed.priority`; 0: the server's default level, interactive). The gateway
sets it once per request from the request's tenant, around the request's upstream work;
the bulk job around each batch. The request's pieces are tasks that inherit it, and
:meth:`~.upstreams.UpstreamPool.infer` sends it with every call (:func:`priority_kwargs`)
and waits for a call slot in a :class:`PriorityGate`, so interactive pieces do not queue
behind batch ones in the gateway either.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
from typing import Any

from triton_embed.priority import DEFAULT_PRIORITY_LEVEL, wire

#: The Triton priority level of the calls made in this context (0: the server's default).
REQUEST_PRIORITY: contextvars.ContextVar[int] = contextvars.ContextVar(
    "triton_embed_request_priority", default=0
)


def priority_kwargs(parameters: dict | None) -> dict:
    """``tritonclient`` ``infer`` arguments of this context's level and ``parameters``.

    :func:`triton_embed.priority.wire` of :data:`REQUEST_PRIORITY`: the level, and the
    request's class added to its parameters.
    """
    return wire(REQUEST_PRIORITY.get(), parameters)


def gate(
    gates: dict[Any, PriorityGate], key: Any, slots: int | None
) -> contextlib.AbstractAsyncContextManager:
    """The :class:`PriorityGate` of ``key`` in ``gates`` (made at first use), or none.

    Args:
        gates: the gates made so far (the pool's, one per upstream and model).
        key: ``(upstream address, model)``.
        slots: calls at once per key (``calls_per_model``); ``None``: no gate.
    """
    if slots is None:
        return contextlib.nullcontext()
    return gates.setdefault(key, PriorityGate(slots))


class PriorityGate:
    """A semaphore of ``slots`` whose waiters go by priority level (1 first), then arrival.

    ``async with gate:`` holds a slot; the caller's level is :data:`REQUEST_PRIORITY` (0
    counts as the default level). A waiter cancelled while waiting leaves no slot taken.

    Args:
        slots: calls at once (>= 1).
    """

    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.free = slots
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._seq = itertools.count()

    async def __aenter__(self) -> None:
        if self.free > 0 and not any(not f.done() for _, _, f in self._waiting):
            self.free -= 1
            return
        level = REQUEST_PRIORITY.get() or DEFAULT_PRIORITY_LEVEL
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (level, next(self._seq), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # its slot came as it was cancelled
                self._release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        """Give the slot to the first live waiter, or free it."""
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)
                return
        self.free += 1
