"""Addresses of Triton servers: the client's ``host:port``, the pool's entries and DNS names.

The client library dials one gRPC ``host:port`` (:data:`DEFAULT_URL`, :func:`check_url`).
The upstream pool takes ``--upstream HOST:PORT[,HOST:PORT...]`` entries: an entry is a host
(a name, an IPv4 address, or an IPv6 address in brackets) and a gRPC port. A name stands for
every address it resolves to (A and AAAA records, :func:`resolve`), so the pods behind a
headless Kubernetes Service are each an upstream; the pool resolves names again every few
seconds (:mod:`~triton_embed.transport.upstreams`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from triton_embed.errors import InvalidInputError

#: Where the client library looks for a server: Triton's default gRPC port on loopback.
DEFAULT_URL = "127.0.0.1:8001"
#: The ensemble the client library calls unless told otherwise.
DEFAULT_MODEL = "embed"
#: The reranker ensemble ``triton-embed rerank`` calls unless told otherwise (the name
#: docs/rerank.md gives it: ``repository add --name rerank``).
DEFAULT_RERANKER = "rerank"


def check_url(url: str) -> str:
    """Check that ``url`` is a gRPC ``host:port``, as ``tritonclient.grpc`` takes it.

    Returns:
        ``url`` unchanged.

    Raises:
        InvalidInputError: ``url`` has a scheme (``http://...``), which gRPC would try to
            resolve as a host name ("Misformatted domain name"); the message says what to pass.
    """
    if "://" in url:
        host_port = url.split("://", 1)[1].rstrip("/")
        raise InvalidInputError(
            f"url {url!r} has a scheme: pass host:port of the server's gRPC port (8001 by "
            f"default), without http://, e.g. {host_port or DEFAULT_URL!r}"
        )
    return url


@dataclass(frozen=True)
class Target:
    """One ``--upstream`` entry: a host (name or IP) and a gRPC port."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Target:
        """Parse ``host:port`` (an IPv6 address in brackets: ``[::1]:8001``).

        Raises:
            ValueError: no port, a port outside 1-65535, or an empty host (names the entry).
        """
        entry = text.strip()
        host, sep, port_text = entry.rpartition(":")
        if entry.startswith("["):
            host = host.removeprefix("[").removesuffix("]")
        problem = None
        if not sep or not host or ":" in host and not entry.startswith("["):
            problem = "is not HOST:PORT (an IPv6 address goes in brackets: [::1]:8001)"
        elif not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            problem = f"has port {port_text!r}; a port is a number from 1 to 65535"
        if problem:
            raise ValueError(f"upstream {entry!r} {problem}")
        return cls(host, int(port_text))

    @property
    def is_ip(self) -> bool:
        """Whether ``host`` is an IP address (no DNS resolution needed)."""
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True

    def __str__(self) -> str:
        return address(self.host, self.port)


def address(ip: str, port: int) -> str:
    """``ip:port`` as gRPC dials it (``[ip]:port`` for IPv6)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def parse_upstreams(values: str | Sequence[str]) -> list[Target]:
    """Targets of one or more comma-separated ``HOST:PORT`` lists, duplicates dropped.

    Raises:
        ValueError: an entry is malformed, or there is none.
    """
    texts = [values] if isinstance(values, str) else list(values)
    targets: list[Target] = []
    for text in texts:
        for entry in text.split(","):
            if entry.strip():
                target = Target.parse(entry)
                if target not in targets:
                    targets.append(target)
    if not targets:
        raise ValueError("no upstream given: pass --upstream HOST:PORT[,HOST:PORT...]")
    return targets


async def resolve(host: str, port: int) -> list[str]:
    """Every IPv4 and IPv6 address of ``host`` (A and AAAA records), sorted.

    Raises:
        OSError: the name does not resolve.
    """
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})
