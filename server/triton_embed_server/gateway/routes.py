"""The gateway's routes, and its app for a process that serves.

:func:`build_app` puts each route's handler behind :meth:`~.app.Gateway.endpoint` (what every
request goes through); :func:`create_app` builds the gateway of the settings in the process
that serves (keys read there; the upstream pool, and the tenants file's watcher and
``SIGHUP`` handler, start and stop with the app; with ``--workers N`` each worker opens the
workers' shared store there, :mod:`~triton_embed_server.gateway.shared`).

==========================  ======  =====================================================
route                       API     handler
==========================  ======  =====================================================
``POST /v1/embeddings``     OpenAI  :func:`~triton_embed_server.gateway.openai_api.embeddings`
``GET /v1/models``          OpenAI  :func:`~triton_embed_server.gateway.openai_api.models`
``POST /v1/rerank``         Cohere  :func:`~triton_embed_server.gateway.rerank_api.rerank_v1`
``POST /v2/rerank``         Cohere  :func:`~triton_embed_server.gateway.rerank_api.rerank_v2`
``POST /rerank``            TEI     :func:`~triton_embed_server.gateway.rerank_api.rerank`
``POST /score``             vLLM    :func:`~triton_embed_server.gateway.score_api.score`
``POST /v1/score``          vLLM    :func:`~triton_embed_server.gateway.score_api.score`
``POST /embed``             TEI     :func:`~triton_embed_server.gateway.tei_api.embed`
``POST /embed_sparse``      TEI     :func:`~triton_embed_server.gateway.tei_api.embed_sparse`
``POST /embed_all``         TEI     :func:`~triton_embed_server.gateway.tei_api.embed_all`
``POST /tokenize``          TEI     :func:`~triton_embed_server.gateway.tei_api.tokenize`
``POST /decode``            TEI     :func:`~triton_embed_server.gateway.tei_decode.decode`
``GET /info``               TEI     :func:`~triton_embed_server.gateway.tei_api.info`
``GET /health``             TEI     :func:`~triton_embed_server.gateway.tei_api.health`
``POST /``                  TEI     :func:`~triton_embed_server.gateway.tei_api.embed`
``POST /invocations``       TEI     :func:`~triton_embed_server.gateway.tei_api.embed`
``GET /``, ``GET /ping``    TEI     :func:`~triton_embed_server.gateway.tei_api.health`
``GET /metrics``            (none)  Prometheus text format
``GET /admin/usage``        (none)  :func:`~triton_embed_server.gateway.admin_api.usage`
==========================  ======  =====================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from triton_embed.transport.upstreams import UpstreamPool

from triton_embed_server.gateway import (
    admin_api,
    openai_api,
    protocol,
    rerank_api,
    score_api,
    tei_api,
    tei_decode,
)
from triton_embed_server.gateway.app import Gateway, RequestState, error_response
from triton_embed_server.gateway.errors import (
    COHERE,
    OPENAI,
    QUOTE_CHARS,
    TEI,
    GatewayError,
    MethodNotAllowed,
    NotFound,
    quote,
)
from triton_embed_server.gateway.folder_facts import folder_facts
from triton_embed_server.gateway.metrics import GatewayMetrics
from triton_embed_server.gateway.settings import GatewaySettings, configure_logging
from triton_embed_server.gateway.shared import SharedStore
from triton_embed_server.gateway.tracing import tracing_of

log = logging.getLogger("triton_embed.gateway")

#: Environment variable through which ``--workers`` processes get the settings (JSON).
SETTINGS_ENV = "TRITON_EMBED_GATEWAY_SETTINGS"

#: The paths whose errors are in Cohere's envelope (404 and 405 too).
COHERE_PATHS = ("/v1/rerank", "/v2/rerank")


async def _no_route(request: Request, exc: HTTPException) -> Response:
    """An unknown path (404) or method (405), in the envelope its path suggests."""
    path = request.url.path
    path = path if len(path) <= QUOTE_CHARS else quote(path)
    api = COHERE if path in COHERE_PATHS else OPENAI if path.startswith("/v1/") else TEI
    if exc.status_code == 405:
        error: GatewayError = MethodNotAllowed(f"{path} does not take {request.method}")
    else:
        error = NotFound(
            f"no route {request.method} {path}; the routes are POST /v1/embeddings, GET "
            "/v1/models, POST /v1/rerank, POST /v2/rerank, POST /score, POST /v1/score, "
            "POST /embed, POST /embed_sparse, POST /embed_all, POST /tokenize, POST /decode, "
            "POST /rerank, "
            "GET /info, GET /health, GET /metrics (and TEI's POST /, POST /invocations, GET /, "
            "GET /ping)",
            code="unknown_route",
        )
    response = error_response(error, api)
    if exc.headers:
        response.headers.update(exc.headers)  # Allow: on a 405
    return response


async def _metrics(gateway: Gateway, request: Request, state: RequestState) -> Response:
    text, content_type = gateway.metrics.render()
    return Response(text, media_type=content_type)


def build_app(gateway: Gateway, *, lifespan: Callable | None = None) -> Starlette:
    """The Starlette app of ``gateway``'s routes."""
    e = gateway.endpoint
    routes = [
        Route(
            "/v1/embeddings",
            e("/v1/embeddings", OPENAI, openai_api.embeddings, body=True),
            methods=["POST"],
        ),
        Route("/v1/models", e("/v1/models", OPENAI, openai_api.models), methods=["GET"]),
        Route(
            "/v1/rerank", e("/v1/rerank", COHERE, rerank_api.rerank_v1, body=True), methods=["POST"]
        ),
        Route(
            "/v2/rerank", e("/v2/rerank", COHERE, rerank_api.rerank_v2, body=True), methods=["POST"]
        ),
        Route("/rerank", e("/rerank", TEI, rerank_api.rerank, body=True), methods=["POST"]),
        Route("/score", e("/score", OPENAI, score_api.score, body=True), methods=["POST"]),
        Route("/v1/score", e("/v1/score", OPENAI, score_api.score, body=True), methods=["POST"]),
        Route("/embed", e("/embed", TEI, tei_api.embed, body=True), methods=["POST"]),
        Route(
            "/embed_sparse",
            e("/embed_sparse", TEI, tei_api.embed_sparse, body=True),
            methods=["POST"],
        ),  # fmt: skip
        Route("/embed_all", e("/embed_all", TEI, tei_api.embed_all, body=True), methods=["POST"]),
        Route("/tokenize", e("/tokenize", TEI, tei_api.tokenize, body=True), methods=["POST"]),
        Route("/decode", e("/decode", TEI, tei_decode.decode, body=True), methods=["POST"]),
        Route("/info", e("/info", TEI, tei_api.info, counted=False), methods=["GET"]),
        # TEI's base-URL routes: POST / and /invocations embed, GET / and /ping are health.
        Route("/", e("/", TEI, tei_api.embed, body=True), methods=["POST"]),
        Route("/invocations", e("/invocations", TEI, tei_api.embed, body=True), methods=["POST"]),
    ]
    for path in ("/health", "/", "/ping"):
        health = e(path, TEI, tei_api.health, public=True, counted=False)
        routes.append(Route(path, health, methods=["GET"]))
    routes.append(
        Route("/metrics", e("/metrics", TEI, _metrics, public=True, counted=False), methods=["GET"])
    )
    routes.append(
        Route(
            "/admin/usage",
            e("/admin/usage", OPENAI, admin_api.usage, public=True, counted=False),
            methods=["GET"],
        )
    )
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: _no_route, 405: _no_route},
    )


def create_app(settings: GatewaySettings) -> Starlette:
    """The gateway app for ``settings``: its upstream pool starts and stops with the app.

    Reads the API key and the admin key (their files or the environment) here, in the
    process that serves.

    Raises:
        OSError, ValueError: a key file cannot be read or holds no usable key.
    """
    metrics = GatewayMetrics()
    admin_key = settings.admin_key()
    store = None if settings.shared_dir is None else SharedStore(settings.shared_dir)
    pool = UpstreamPool(
        settings.targets,
        admin_key=admin_key,
        timeout_s=settings.timeout_s,
        observer=metrics,
        facts_reader=folder_facts,
        calls_per_model=settings.max_upstream_calls,
    )
    tracing = tracing_of(settings.otlp_endpoint)
    tenants = settings.tenant_registry(store)
    gateway = Gateway(settings, pool, metrics, None, tenants, admin_key, tracing, store)
    protocol.configure(
        settings.header_timeout_s,
        on_refused=lambda status: metrics.observe(
            "", "", status, settings.header_timeout_s if status == 408 else 0.0
        ),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await pool.start()
        tenancy = gateway.tenancy
        log.info(
            "gateway listening on %s:%s in front of %s (%d of %d upstreams ready; API key %s)",
            settings.host,
            settings.port,
            ", ".join(settings.upstreams),
            sum(u.ready for u in pool.upstreams.values()),
            len(pool.upstreams),
            (
                f"required: tenants {', '.join(sorted(tenancy.tenants.tenants))}"
                if tenancy.enabled
                else "not required: every route is open"
            ),
        )
        watcher = None
        if tenancy.path is not None:
            tenancy.install_sighup(asyncio.get_running_loop())
            watcher = asyncio.create_task(tenancy.watch())
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            await pool.stop()
            if tracing is not None:
                tracing.shutdown()  # exports the spans still buffered
            if store is not None:
                store.close()

    return build_app(gateway, lifespan=lifespan)


def create_app_from_env() -> Starlette:
    """:func:`create_app` of the settings in :data:`SETTINGS_ENV` (``--workers`` processes)."""
    settings = GatewaySettings.from_json(os.environ[SETTINGS_ENV])
    configure_logging(settings.log_level)
    return create_app(settings)
