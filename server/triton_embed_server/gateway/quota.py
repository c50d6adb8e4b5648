"""A tenant's token rate: one token bucket per tenant, charged by the tokens it was served.

The gateway knows a request's tokens only once the tokenizer step has counted them (the
ensemble's ``NUM_TOKENS``), so a request takes its estimated tokens from its tenant's bucket
when it goes upstream (:meth:`TokenBucket.reserve`: refused while the bucket is at or below
0) and is charged the difference to what it was served afterwards (a refund for a request
that fails or was over-estimated); the bucket may go below 0 (a debt), and the tenant's next
requests are refused until the refill has paid it back. Requests that arrive together are
so held to the bucket too: each takes its estimate in turn. The bucket holds at most
``burst`` tokens and refills at ``tokens_per_minute / 60`` tokens per second. A refused
request is answered 429 with ``Retry-After``: the whole seconds until the bucket is above 0
again (at least 1). Over a long run a tenant is served at most ``tokens_per_minute`` plus
one ``burst``, plus one request, plus what its estimates missed.

:class:`TokenBucket` keeps its level in the process (one worker); with ``--workers N`` the
workers share one bucket per tenant in :mod:`~triton_embed_server.gateway.shared`, with the
same arithmetic (:func:`refilled`, :func:`wait_s`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


def refilled(level: float, elapsed_s: float, rate_per_s: float, burst: float) -> float:
    """A bucket's level ``elapsed_s`` seconds after it was ``level``, refilled up to ``burst``."""
    return min(burst, level + max(0.0, elapsed_s) * rate_per_s)


def wait_s(level: float, rate_per_s: float) -> int:
    """0 when a bucket at ``level`` lets a request go, else whole seconds until it does (>= 1)."""
    if level > 0:
        return 0
    return max(1, math.ceil((1.0 - level) / rate_per_s))


class TokenBucket:
    """One tenant's bucket.

    Args:
        tokens_per_minute: the refill rate.
        burst: the bucket's size, tokens (it starts full).
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(
        self, tokens_per_minute: int, burst: int, clock: Callable[[], float] = time.monotonic
    ):
        self.clock = clock
        self.rate_per_s = tokens_per_minute / 60.0
        self.burst = float(burst)
        self.level = float(burst)
        self.updated = clock()

    def reconfigure(self, tokens_per_minute: int, burst: int) -> None:
        """New rate and size (a reloaded tenants file); the level is kept, capped at ``burst``."""
        self._refill()
        self.rate_per_s = tokens_per_minute / 60.0
        self.burst = float(burst)
        self.level = min(self.level, self.burst)

    def _refill(self) -> None:
        now = self.clock()
        self.level = refilled(self.level, now - self.updated, self.rate_per_s, self.burst)
        self.updated = now

    def retry_after_s(self) -> int:
        """0 when a request may go now, else the whole seconds until it may (>= 1)."""
        self._refill()
        return wait_s(self.level, self.rate_per_s)

    def reserve(self, tokens: int) -> int:
        """Take ``tokens`` (an estimate) if the bucket is above 0; else refuse.

        Returns:
            0 when taken (the level may go below 0), else the whole seconds until the bucket
            lets a request go (>= 1), nothing taken.
        """
        wait = self.retry_after_s()
        if not wait:
            self.level -= tokens
        return wait

    def charge(self, tokens: int) -> None:
        """Take ``tokens`` (negative: give back), the level at most ``burst`` (may go below 0)."""
        self._refill()
        self.level = min(self.burst, self.level - tokens)
