"""The upstream addresses: ``--upstream HOST:PORT[,HOST:PORT...]`` entries and their DNS names.

An entry is a host (a name, an IPv4 address, or an IPv6 address in brackets) and a gRPC
port. A name stands for every address it resolves to (A and AAAA records, :func:`resolve`),
so the pods behind a headless Kubernetes Service are each an upstream; the pool resolves
names again every few seconds (:mod:`~triton_embed_server.gateway.upstreams`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass


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
