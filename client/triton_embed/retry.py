"""Retries of refused requests: exponential backoff with full jitter, through ``tenacity``.

Past capacity the server refuses a request at once instead of queueing it (its queue policy,
docs/configuration.md "Queue policy"); the client raises
:class:`~triton_embed.errors.ServerOverloadedError`. :class:`RetryPolicy` sends such a
request again after a random wait whose upper bound doubles each time (AWS's "full jitter":
https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/), so that many
refused clients spread their retries instead of coming back together.

Retried: :class:`~triton_embed.errors.ServerOverloadedError` and
:class:`~triton_embed.errors.ServerUnavailableError` (server unreachable or restarting).
Never retried: bad input (:class:`~triton_embed.errors.InvalidInputError`), deadlines
(:class:`~triton_embed.errors.EmbedTimeoutError`: the server may still be working on it), a
refused key (:class:`~triton_embed.errors.AccessDeniedError`) and any other error.

A pool of servers (the bulk job, :mod:`triton_embed.bulk.pool_embedder`) retries more: a
:class:`~triton_embed.transport.failures.TransportError` whose kind is in
:data:`POOL_RETRYABLE` (every server unreachable or without the model, every queue full, a
deadline) is sent again through :meth:`RetryPolicy.call_async`; refused input never is.

    >>> policy = RetryPolicy(retries=8, initial_wait_s=0.1, max_wait_s=5.0)
    >>> [policy.wait_bound_s(k) for k in range(1, 9)]
    [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from triton_embed.errors import AccessDeniedError, ServerUnavailableError
from triton_embed.transport.failures import ErrorKind, TransportError

T = TypeVar("T")

DEFAULT_RETRIES = 8
DEFAULT_INITIAL_WAIT_S = 0.1
DEFAULT_MAX_WAIT_S = 5.0


#: Failures of a call to a pool of servers that time can cure: a server restarts, a queue
#: drains, a deadline passes while the servers are busy.
POOL_RETRYABLE = frozenset(
    {
        ErrorKind.UNREACHABLE,
        ErrorKind.NO_UPSTREAM,
        ErrorKind.MODEL_MISSING,
        ErrorKind.OVERLOADED,
        ErrorKind.TIMEOUT,
    }
)


def is_retryable(exc: BaseException) -> bool:
    """True for the errors a retry can cure: server overloaded, unreachable or restarting."""
    return isinstance(exc, ServerUnavailableError) and not isinstance(exc, AccessDeniedError)


def is_pool_retryable(exc: BaseException) -> bool:
    """True for a pool's failures that a retry can cure (:data:`POOL_RETRYABLE`)."""
    return isinstance(exc, TransportError) and exc.kind in POOL_RETRYABLE


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a refused request is sent again.

    Wait ``k`` (before retry ``k``, from 1) is drawn uniformly from
    ``[0, wait_bound_s(k)]``, ``wait_bound_s(k) = min(max_wait_s, initial_wait_s * 2**(k-1))``.
    With the defaults (8 retries, 0.1 s, 5 s) the bounds are 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5
    and 5 s: a request gives up after at most 16.3 s of waiting (8.2 s on average).

    Attributes:
        retries: retries after the first attempt; 0 = off (the first refusal raises).
        initial_wait_s: bound of the first wait, seconds (> 0).
        max_wait_s: cap of every bound, seconds (>= ``initial_wait_s``).

    Raises:
        ValueError: a field out of range.
    """

    retries: int = DEFAULT_RETRIES
    initial_wait_s: float = DEFAULT_INITIAL_WAIT_S
    max_wait_s: float = DEFAULT_MAX_WAIT_S

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int):
            raise ValueError(f"retries must be a whole number >= 0, got {self.retries!r}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        for name in ("initial_wait_s", "max_wait_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if self.max_wait_s < self.initial_wait_s:
            raise ValueError(
                f"max_wait_s={self.max_wait_s} must be >= initial_wait_s={self.initial_wait_s}"
            )

    @classmethod
    def of(cls, value: RetryPolicy | int | None) -> RetryPolicy:
        """The policy a ``retry=`` argument means: a policy, a number of retries, or off.

        Args:
            value: a :class:`RetryPolicy`; an ``int``, the retries with the default waits;
                ``None`` or ``0``, no retries.

        Raises:
            ValueError: anything else, or a negative number.
        """
        if isinstance(value, RetryPolicy):
            return value
        if value is None:
            return cls(retries=0)
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(retries=value)
        raise ValueError(f"retry must be a RetryPolicy, a number of retries or None, got {value!r}")

    def wait_bound_s(self, retry: int) -> float:
        """Upper bound of the wait before retry ``retry`` (1 = the first retry), seconds."""
        if retry < 1:
            raise ValueError(f"retry counts from 1, got {retry}")
        exponent = min(retry - 1, 64)  # 0.1 * 2**64 s is past any cap
        return min(self.max_wait_s, self.initial_wait_s * 2.0**exponent)

    def call(
        self,
        fn: Callable[..., T],
        *args: object,
        on_retry: Callable[[BaseException, float], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> T:
        """``fn(*args)``, sent again after each retryable error until retries run out.

        Args:
            fn: the request.
            *args: its arguments.
            on_retry: called with the error and the wait (seconds) before each retry.
            sleep: how to wait (tests pass a recorder).

        Returns:
            What ``fn`` returned.

        Raises:
            ServerOverloadedError, ServerUnavailableError: still refused after the last retry;
                the message adds how many attempts were made over how long.
            Exception: any error :func:`is_retryable` does not cover, at once, as ``fn``
                raised it.
        """
        retrying = self._retrying(on_retry, sleep=sleep, retryable=is_retryable)
        attempts = 0
        started = time.monotonic()

        def attempt() -> T:
            nonlocal attempts
            attempts += 1
            return fn(*args)

        try:
            return retrying(attempt)
        except ServerUnavailableError as exc:
            if attempts < 2 or not is_retryable(exc):
                raise
            raise type(exc)(
                f"{exc} (gave up after {attempts} attempts in "
                f"{time.monotonic() - started:.1f} s; allow more with retry=/--retries)"
            ) from None

    async def call_async(
        self,
        fn: Callable[[], Awaitable[T]],
        *,
        on_retry: Callable[[BaseException, float], None] | None = None,
        retryable: Callable[[BaseException], bool] = is_pool_retryable,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> T:
        """``await fn()``, awaited again after each ``retryable`` error until retries run out.

        The same waits as :meth:`call` (full jitter, bounds :meth:`wait_bound_s`).

        Args:
            fn: the request (a new coroutine each call).
            on_retry: called with the error and the wait (seconds) before each retry.
            retryable: which errors are sent again (default :func:`is_pool_retryable`).
            sleep: how to wait (tests pass a recorder).

        Returns:
            What ``fn`` returned.

        Raises:
            Exception: the last error, as ``fn`` raised it, once retries run out; any error
                ``retryable`` does not cover, at once.
        """
        return await self._retrying(on_retry, sleep=sleep, retryable=retryable, run=True)(fn)

    def _retrying(
        self,
        on_retry: Callable[[BaseException, float], None] | None,
        *,
        sleep: Callable[[float], Any],
        retryable: Callable[[BaseException], bool],
        run: bool = False,
    ) -> Any:
        """A ``tenacity`` retrier of this policy (``AsyncRetrying`` with ``run``)."""
        from tenacity import (
            AsyncRetrying,
            RetryCallState,
            Retrying,
            retry_if_exception,
            stop_after_attempt,
            wait_random_exponential,
        )

        def before_sleep(state: RetryCallState) -> None:
            if on_retry is not None and state.outcome is not None and state.next_action:
                on_retry(state.outcome.exception(), state.next_action.sleep)

        return (AsyncRetrying if run else Retrying)(
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_random_exponential(multiplier=self.initial_wait_s, max=self.max_wait_s),
            retry=retry_if_exception(retryable),
            before_sleep=before_sleep,
            sleep=sleep,
            reraise=True,
        )
