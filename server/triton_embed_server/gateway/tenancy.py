"""The tenants in force at run time: who a request is, its rights and rate, and reloads.

:class:`TenantRegistry` holds the :class:`~.tenants.Tenants` of the file (or of the one
``--api-key-file`` key, or of an open gateway) and one token bucket per tenant with a rate
(:class:`~.quota.TokenBucket`). It answers, for each request, in this order:

1. who: the key of ``Authorization: Bearer <key>`` selects a tenant (:meth:`identify`);
   none or an unknown key is 401 (``invalid_api_key``);
2. its rate: a tenant whose bucket is empty is 429 ``rate_limit_exceeded`` with
   ``Retry-After`` (:meth:`admit`); a served request is charged its tokens (:meth:`charge`);
3. its models: a model the tenant may not use is 403 ``model_not_allowed``
   (:meth:`check_model`, where the request's model is resolved).

The file is read again on ``SIGHUP`` and when its modification time changes (checked every
:data:`WATCH_INTERVAL_S` seconds). A reload swaps the whole table at once: a request holds
the :class:`~.tenants.Tenant` it was identified as until it is answered, so none in flight
is dropped or changed; a tenant keeps its bucket's level across reloads (by name). A bad
file is refused with its line and reason in the log, and the tenants in force stay. With
``--workers N`` each worker reads the file itself and the buckets are the workers' shared
ones (:mod:`~triton_embed_server.gateway.shared`): a tenant's rate holds for the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from triton_embed_server.gateway.errors import Forbidden, RateLimited, Unauthorized, quote
from triton_embed_server.gateway.quota import TokenBucket
from triton_embed_server.gateway.tenants import (
    Tenant,
    Tenants,
    TenantsFileError,
    key_tenants,
    load_tenants,
    open_tenants,
)

if TYPE_CHECKING:
    from triton_embed_server.gateway.shared import SharedStore, SharedTokenBucket

log = logging.getLogger("triton_embed.gateway")

#: Seconds between checks of the tenants file's modification time.
WATCH_INTERVAL_S = 2.0


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header, or ``None``."""
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return None
    return given.strip()


class TenantRegistry:
    """The tenants in force, their buckets, and reloading their file.

    Args:
        tenants: the tenants to start with.
        path: the tenants file (``None``: no file, nothing to reload).
        clock: monotonic seconds for the buckets (tests pass their own).
        store: the store the ``--workers`` processes share
            (:class:`~triton_embed_server.gateway.shared.SharedStore`): the buckets live
            there, one per tenant for the whole gateway; ``None``: in this process.
    """

    def __init__(
        self,
        tenants: Tenants,
        path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        store: SharedStore | None = None,
    ):
        self.tenants = tenants
        self.path = path
        self.clock = clock
        self.store = store
        self.buckets: dict[str, TokenBucket | SharedTokenBucket] = {}
        self._mtime = self._file_mtime()
        self._sync_buckets()

    @classmethod
    def from_sources(
        cls, tenants_file: Path | None, api_key: str | None, store: SharedStore | None = None
    ) -> TenantRegistry:
        """The tenants of ``--tenants``, else of ``--api-key-file``'s key, else an open gateway.

        Args:
            tenants_file: the tenants file, or ``None``.
            api_key: the one key of ``--api-key-file``, or ``None``.
            store: where the buckets live with ``--workers N`` (``None``: in this process).

        Raises:
            TenantsFileError: the file cannot be read or is not valid (line and reason).
        """
        if tenants_file is not None:
            return cls(load_tenants(tenants_file), tenants_file, store=store)
        return cls(key_tenants(api_key) if api_key else open_tenants(), store=store)

    @property
    def enabled(self) -> bool:
        """Whether a key is required."""
        return not self.tenants.open

    @property
    def usd_per_million_tokens(self) -> float:
        """The cost of a token, from the file (0: not known)."""
        return self.tenants.usd_per_million_tokens

    def _file_mtime(self) -> float | None:
        if self.path is None:
            return None
        try:
            return os.stat(self.path).st_mtime
        except OSError:
            return None

    def _sync_buckets(self) -> None:
        buckets = {}
        for name, tenant in self.tenants.tenants.items():
            if tenant.tokens_per_minute is None:
                continue
            burst = tenant.burst or tenant.tokens_per_minute
            bucket = self.buckets.get(name)
            if bucket is None and self.store is not None:
                bucket = self.store.bucket(name, tenant.tokens_per_minute, burst)
            elif bucket is None:
                bucket = TokenBucket(tenant.tokens_per_minute, burst, self.clock)
            else:
                bucket.reconfigure(tenant.tokens_per_minute, burst)
            buckets[name] = bucket
        self.buckets = buckets

    def identify(self, authorization: str | None) -> Tenant:
        """The tenant of a request's ``Authorization`` header.

        Raises:
            Unauthorized: keys are required and the header is missing, not ``Bearer``, or
                holds a key of no tenant (the key is never logged or quoted).
        """
        if self.tenants.open:
            return self.tenants.identify(None)  # type: ignore[return-value]
        key = bearer_key(authorization)
        if key is None:
            raise Unauthorized(
                "missing API key: send the header 'Authorization: Bearer <key>' (the openai "
                "SDK sends its api_key so)"
            )
        tenant = self.tenants.identify(key)
        if tenant is None:
            raise Unauthorized("invalid API key")
        return tenant

    def admit(self, tenant: Tenant) -> None:
        """Let ``tenant``'s request in unless its token bucket is empty.

        Raises:
            RateLimited: the bucket is at or below 0; ``Retry-After`` is when it is not.
        """
        bucket = self.buckets.get(tenant.name)
        if bucket is None:
            return
        wait_s = bucket.retry_after_s()
        if wait_s:
            raise self._limited(tenant, wait_s)

    def reserve(self, tenant: Tenant, tokens: int) -> None:
        """Take a request's estimated ``tokens`` from ``tenant``'s bucket as it goes upstream.

        Raises:
            RateLimited: the bucket is at or below 0 (nothing taken).
        """
        bucket = self.buckets.get(tenant.name)
        if bucket is None:
            return
        wait_s = bucket.reserve(tokens)
        if wait_s:
            raise self._limited(tenant, wait_s)

    def charge(self, tenant: Tenant, tokens: int) -> None:
        """Take ``tokens`` from ``tenant``'s bucket (if it has one; negative: give back)."""
        bucket = self.buckets.get(tenant.name)
        if bucket is not None and tokens:
            bucket.charge(tokens)

    @staticmethod
    def _limited(tenant: Tenant, wait_s: int) -> RateLimited:
        return RateLimited(
            f"tenant {tenant.name!r} is over its token rate ({tenant.tokens_per_minute} "
            f"tokens per minute, burst {tenant.burst}); retry after {wait_s} s",
            retry_after_s=wait_s,
        )

    @staticmethod
    def may_use(tenant: Tenant, model: str, resolve: Callable[[str], str | None]) -> bool:
        """Whether ``tenant`` may use the ensemble ``model``.

        Args:
            tenant: the tenant.
            model: the ensemble's name.
            resolve: the ensemble a name or alias of the tenant's ``models`` stands for.
        """
        if tenant.models is None or model in tenant.models:
            return True
        return any(resolve(name) == model for name in tenant.models)

    def check_model(
        self,
        tenant: Tenant,
        model: str,
        resolve: Callable[[str], str | None],
        named: str | None = None,
    ) -> None:
        """Refuse a model ``tenant`` may not use.

        Args:
            tenant: the request's tenant.
            model: the ensemble the request resolved to.
            resolve: the ensemble a name or alias of the tenant's ``models`` stands for.
            named: the name the request gave (an alias is not resolved in the message);
                ``None``: the request named none, the message says "the default model"
                (a tenant learns no name it may not use).

        Raises:
            Forbidden: no name of the tenant's ``models`` is ``model`` or stands for it.
        """
        if self.may_use(tenant, model, resolve):
            return
        allowed = ", ".join(sorted(tenant.models))
        which = "the gateway's default model" if named is None else f"the model {quote(named)}"
        raise Forbidden(
            f"tenant {tenant.name!r} may not use {which}; its models are: {allowed}",
            param="model",
        )

    def reload(self) -> bool:
        """Read the file again; keep the tenants in force when it is not valid.

        Returns:
            Whether the new tenants are in force.
        """
        if self.path is None:
            return False
        self._mtime = self._file_mtime()
        try:
            tenants = load_tenants(self.path)
        except TenantsFileError as exc:
            log.error("tenants file refused, the %d tenants in force stay: %s",
                      len(self.tenants.tenants), exc)  # fmt: skip
            return False
        self.tenants = tenants
        self._sync_buckets()
        log.info("tenants reloaded from %s: %s", self.path, ", ".join(sorted(tenants.tenants)))
        return True

    def changed(self) -> bool:
        """Whether the file's modification time differs from the last read's."""
        return self.path is not None and self._file_mtime() != self._mtime

    def install_sighup(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Reload on ``SIGHUP`` (in the event loop, between requests' steps).

        Returns:
            Whether the handler was installed (not on platforms without ``SIGHUP``).
        """
        if self.path is None or not hasattr(signal, "SIGHUP"):
            return False
        try:
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        except (NotImplementedError, RuntimeError, ValueError):
            return False
        return True

    async def watch(self, interval_s: float = WATCH_INTERVAL_S) -> None:
        """Reload whenever the file's modification time changes; runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            if self.changed():
                self.reload()
