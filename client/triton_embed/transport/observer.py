"""What the upstream pool reports as it works: a small protocol, and a default that drops it.

The pool (:class:`~triton_embed.transport.upstreams.UpstreamPool`) tells its observer when
an upstream comes into use or is taken out, when DNS no longer returns one, and when a call
is sent again to another upstream. The HTTP gateway passes its Prometheus metrics
(``triton_embed_server.gateway.metrics.GatewayMetrics``, which implements
:class:`PoolObserver`); the bulk job passes nothing and gets :data:`NO_OBSERVER`, so it needs
no ``prometheus_client``.
"""

from __future__ import annotations

from typing import Protocol


class PoolObserver(Protocol):
    """Receives the upstream pool's events."""

    def set_upstream(self, upstream: str, up: bool) -> None:
        """``upstream`` (``ip:port``) came into use (``up``) or was taken out."""

    def forget_upstream(self, upstream: str) -> None:
        """``upstream`` is gone: DNS no longer returns it."""

    def count_retry(self) -> None:
        """A call was sent again to another upstream after the first one failed."""


class _NoObserver:
    """A :class:`PoolObserver` that records nothing."""

    def set_upstream(self, upstream: str, up: bool) -> None:  # noqa: D102
        pass

    def forget_upstream(self, upstream: str) -> None:  # noqa: D102
        pass

    def count_retry(self) -> None:  # noqa: D102
        pass


#: The observer of a pool nobody watches.
NO_OBSERVER: PoolObserver = _NoObserver()
