"""Test doubles of the benchmark's HTTP servers: aiohttp apps on free loopback ports.

:class:`LocalHttpServer` runs an app in its own thread and event loop, so a load generator
of :mod:`perf.contenders.openai_load` (which runs its own loop) can drive it from the test.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable


class LocalHttpServer:
    """An aiohttp app on 127.0.0.1 (a free port), serving ``routes`` from its own thread.

    Args:
        routes: path -> ``async handler(request) -> web.Response``, for POST requests.

    Attributes:
        bodies: the JSON body of every request, in order of arrival.
        port: its port.
    """

    def __init__(self, routes: dict[str, Callable[..., Awaitable]]):
        from aiohttp import web

        self.bodies: list[dict] = []
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_post(path, handler)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        """``http://127.0.0.1:<port><path>``."""
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        """Stop the app and its thread."""
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
