"""uvicorn's HTTP/1.1 protocol with a request-header timeout and a header size limit.

uvicorn (0.54) has a keep-alive timeout between requests but no timeout while it reads a
request's headers: a connection that sends nothing, or trickles its headers a byte at a time,
stays open for ever (issue 20: 190 stalled connections were all still open after 60 s). The
ASGI app cannot help, because uvicorn calls it only once the headers are complete; so the
limit lives in the protocol, one level below: :class:`HttpToolsProtocol` and
:class:`H11Protocol` are uvicorn's own protocols (``uvicorn.protocols.http``) with
:class:`HeaderLimits` mixed in, passed to uvicorn as ``http=``
(:mod:`~triton_embed_server.gateway.command`).

* The headers of a request must be complete within ``--header-timeout-s`` seconds, counted
  from the connection's start for its first request and from the first byte of each later
  request on a kept-alive connection (nginx's ``client_header_timeout``; between requests
  uvicorn's keep-alive timeout applies). Past it the gateway answers 408 and closes the
  connection; a connection that sent nothing at all is closed the same way.
* At most :data:`MAX_HEADER_BYTES` may arrive before the headers are complete (nginx's
  ``large_client_header_buffers`` is 4 x 8 KiB); more is 431 and the connection is closed.
  (uvicorn's h11 parser has a 16 KiB limit of its own, answered 400.)

The body's timeout is the app's (:func:`triton_embed_server.gateway.body.read_body`). Both
answers are counted in ``triton_embed_gateway_requests_total`` with ``route=""`` (the path was
not read), through :attr:`HeaderLimits.on_refused`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, ClassVar

import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol as _H11Protocol

log = logging.getLogger("triton_embed.gateway")

#: Seconds a request's headers may take (``--header-timeout-s``'s default).
DEFAULT_HEADER_TIMEOUT_S = 20.0
#: Bytes a request may send before its headers are complete.
MAX_HEADER_BYTES = 64 * 1024

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def _refusal(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response: ``status``, TEI's error envelope, ``Connection: close``."""
    body = orjson.dumps({"error": message, "error_type": "Validation"})
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body))
    )
    return head + body


class HeaderLimits:
    """Mixin for a uvicorn HTTP/1.1 protocol: the header timeout and size limit above.

    It relies only on what both of uvicorn's protocols have: ``connection_made``,
    ``data_received``, ``connection_lost``, ``loop``, ``transport`` and ``cycle`` (the
    request being answered; a new one exactly when a request's headers are complete).

    Attributes:
        header_timeout_s: seconds a request's headers may take (set by :func:`configure`).
        max_header_bytes: bytes allowed before the headers are complete.
        on_refused: called with the status (408, 431) of each refused request (metrics).
    """

    header_timeout_s: ClassVar[float] = DEFAULT_HEADER_TIMEOUT_S
    max_header_bytes: ClassVar[int] = MAX_HEADER_BYTES
    on_refused: ClassVar[Callable[[int], None] | None] = None

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:  # noqa: D102
        super().connection_made(transport)  # type: ignore[misc]
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._header_tail = b""
        self._arm()

    def _arm(self) -> None:
        self._header_bytes = 0
        self._header_tail = b""
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:  # noqa: D102
        cycle = self.cycle
        if self._header_timer is None and (cycle is None or cycle.response_complete):
            self._arm()  # the first byte of the next request on a kept-alive connection
        reading_headers = self._header_timer is not None
        if reading_headers:
            # The headers' bytes in this read: up to their end (a blank line, which may
            # straddle reads) if it is here; checked before the parser sees them, since it
            # completes headers that arrive in one read however large.
            seen = self._header_tail + data
            end = seen.find(b"\r\n\r\n")
            self._header_bytes += len(data) if end < 0 else end + 4 - len(self._header_tail)
            self._header_tail = seen[-3:]
            if self._header_bytes > self.max_header_bytes:
                self._refuse(
                    431,
                    f"the request's headers are over {self.max_header_bytes} bytes; send fewer "
                    "or shorter headers",
                )
                return
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not cycle or self.transport.is_closing():
            self._disarm()  # headers complete (a new request cycle), or refused by uvicorn

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _timed_out(self) -> None:
        self._header_timer = None
        self._refuse(
            408,
            f"the request's headers did not arrive within {self.header_timeout_s:g} s "
            "(--header-timeout-s); send the whole request at once",
        )

    def _refuse(self, status: int, message: str) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        log.info("connection refused with %d: %s", status, message)
        self.transport.write(_refusal(status, message))
        self.transport.close()
        if self.on_refused is not None:
            self.on_refused(status)


def configure(header_timeout_s: float, on_refused: Callable[[int], None] | None = None) -> None:
    """Set the header timeout and the refusal counter of this process's gateway protocols.

    uvicorn makes one protocol object per connection from the class it is given, so the
    settings are the class's (one gateway app per process; each ``--workers`` process
    configures its own, :func:`~triton_embed_server.gateway.routes.create_app`).

    Raises:
        ValueError: ``header_timeout_s`` is not > 0.
    """
    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s must be > 0, got {header_timeout_s}")
    HeaderLimits.header_timeout_s = header_timeout_s
    # A plain function stored on the class would be bound to each protocol object.
    HeaderLimits.on_refused = None if on_refused is None else staticmethod(on_refused)  # type: ignore[assignment]


class H11Protocol(HeaderLimits, _H11Protocol):
    """uvicorn's h11 protocol with :class:`HeaderLimits`."""


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _HttpToolsProtocol
except ImportError:  # httptools not installed: uvicorn falls back to h11 too
    HttpToolsProtocol: type | None = None
else:

    class HttpToolsProtocol(HeaderLimits, _HttpToolsProtocol):  # type: ignore[no-redef]
        """uvicorn's httptools protocol with :class:`HeaderLimits`."""


def protocol_class() -> type:
    """The protocol to serve with: httptools' when it is installed, else h11's."""
    return HttpToolsProtocol or H11Protocol
