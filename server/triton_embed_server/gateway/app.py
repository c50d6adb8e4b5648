"""The gateway's Starlette application: routes, and what every request goes through.

Every route's handler is wrapped by :meth:`Gateway.endpoint`, in this order:

1. the API key (:mod:`~triton_embed_server.gateway.auth`), except on the health routes and
   ``/metrics``;
2. a ``POST`` route's body: declared JSON (415), within ``--max-body-mb`` (413), within
   its read timeout (408, connection closed), nested at most 128 levels (400), parsed
   (:mod:`~triton_embed_server.gateway.body`); the headers' own timeout is the protocol's
   (:mod:`~triton_embed_server.gateway.protocol`). Only then:
3. the in-flight bound: with ``--max-in-flight`` requests already in the gateway, 429 with
   ``Retry-After`` at once (the health routes, ``/metrics`` and ``/info`` are not counted),
   so a slow or stalled upload never holds a slot;
4. the handler, within the request's deadline (``--timeout-s``: past it its upstream calls
   are cancelled and the answer is 504) and only while its client is there: a client that
   disconnects cancels the handler and its upstream calls (no piece is started after);
5. its errors rendered in the route's API envelope (:mod:`~triton_embed_server.gateway.errors`;
   ``/rerank`` speaks TEI's API or vLLM's by its body, and its handler says which;
   a failure of the transport, :class:`~triton_embed.transport.failures.TransportError`, by
   the table over its kind, :func:`~triton_embed_server.gateway.errors.from_transport`);
   any other exception is logged with its traceback and answered 500 with a short message;
   a client that went away (while its body was read or while it was served) is logged in
   one line, without a traceback, and counted as status 499 (nginx's "client closed
   request"), never as a 5xx;
6. the request counted in the metrics (:mod:`~triton_embed_server.gateway.metrics`), with
   the inputs and tokens its handler served.

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
``GET /info``               TEI     :func:`~triton_embed_server.gateway.tei_api.info`
``GET /health``             TEI     :func:`~triton_embed_server.gateway.tei_api.health`
``POST /``                  TEI     :func:`~triton_embed_server.gateway.tei_api.embed`
``POST /invocations``       TEI     :func:`~triton_embed_server.gateway.tei_api.embed`
``GET /``, ``GET /ping``    TEI     :func:`~triton_embed_server.gateway.tei_api.health`
``GET /metrics``            (none)  Prometheus text format
==========================  ======  =====================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from triton_embed.options import RequestOptions, Truncation
from triton_embed.transport.catalog import (
    ModelInfo,
    ModelKind,
    RerankerInfo,
    ServedModel,
)
from triton_embed.transport.failures import TransportError
from triton_embed.transport.inference import Pool, TokenBudget
from triton_embed.transport.upstreams import UpstreamPool

from triton_embed_server.gateway import openai_api, protocol, rerank_api, score_api, tei_api
from triton_embed_server.gateway.auth import ApiKeyCheck
from triton_embed_server.gateway.body import read_json_body
from triton_embed_server.gateway.errors import (
    CLIENT_CLOSED_REQUEST,
    COHERE,
    OPENAI,
    QUOTE_CHARS,
    TEI,
    ClientGone,
    GatewayError,
    Internal,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    Timeout,
    Unavailable,
    from_transport,
    quote,
)
from triton_embed_server.gateway.folder_facts import folder_facts
from triton_embed_server.gateway.kinds import model_of_kind, wrong_kind
from triton_embed_server.gateway.merging import Merger
from triton_embed_server.gateway.metrics import GatewayMetrics
from triton_embed_server.gateway.settings import GatewaySettings, configure_logging

log = logging.getLogger("triton_embed.gateway")

#: Environment variable through which ``--workers`` processes get the settings (JSON).
SETTINGS_ENV = "TRITON_EMBED_GATEWAY_SETTINGS"

#: The paths whose errors are in Cohere's envelope (404 and 405 too).
COHERE_PATHS = ("/v1/rerank", "/v2/rerank")

Handler = Callable[["Gateway", Request, "RequestState"], Awaitable[Response]]


@dataclass
class RequestState:
    """A request's state across its wrapper and its handler.

    Attributes:
        model: the model the request resolved to (for the metrics).
        body: a ``POST`` route's body, parsed JSON (read before the handler runs).
        api: the envelope of its errors when the handler chose it (``/rerank``: TEI's or
            vLLM's API by the body), else ``None``: the route's.
        inputs: texts embedded or pairs scored (for the metrics; 0: none).
        tokens: their tokens, the sum of ``NUM_TOKENS``.
    """

    model: str = ""
    body: Any = None
    api: str | None = None
    inputs: int = 0
    tokens: int = 0


class Gateway:
    """One gateway's state: its upstreams, request merging, limits, key check and metrics.

    Args:
        settings: the parsed settings.
        pool: the upstreams (:class:`~triton_embed.transport.upstreams.UpstreamPool`, or a
            test double).
        metrics: the gateway's metrics (the pool's, when it has them).
        api_key: the key clients must send, or ``None``.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        pool: Pool,
        metrics: GatewayMetrics,
        api_key: str | None,
    ):
        self.settings = settings
        self.pool = pool
        self.metrics = metrics
        self.merger = Merger(pool, settings.merge_in_flight, metrics)
        self.auth = ApiKeyCheck(api_key)
        self.max_body_bytes = settings.max_body_bytes
        self.body_timeout_s = settings.body_timeout_s
        self.deadline_s = settings.timeout_s
        self.max_request_tokens = settings.max_request_tokens
        self.max_in_flight = settings.max_in_flight
        self.default_model = settings.default_model
        self.default_reranker = settings.default_reranker
        self.started_at = int(time.time())
        self.in_flight = 0

    def require_ready(self) -> None:
        """Raise :class:`Unavailable` unless some upstream is ready."""
        if not self.pool.any_ready():
            raise Unavailable("no upstream is ready; retry later")

    def model(self, name: str, kind: ModelKind | None = None) -> Any:
        """The model a request names (ensemble name or alias), of ``kind`` when given.

        Returns:
            A :class:`~triton_embed.transport.catalog.ModelInfo` for ``kind`` embedding, a
            :class:`~triton_embed.transport.catalog.RerankerInfo` for reranker, either
            without ``kind``.

        Raises:
            Unavailable: no upstream is ready.
            NotFound: no ready upstream serves a model of that name (lists the names).
            BadRequest: it is a model of the other kind (``code`` ``wrong_model_kind``; names
                its kind and the routes that serve it).
        """
        info: ServedModel | None = self.pool.catalog.resolve(name)
        if info is not None:
            if kind is not None and info.kind is not kind:
                raise wrong_kind(name, info.kind, kind)
            return info
        self.require_ready()
        names = ", ".join(self.pool.catalog.names()) or "none"
        raise NotFound(
            f"the model {quote(name)} does not exist; the models are: {names} (GET /v1/models)",
            param="model",
        )

    def reranker(self, name: str | None) -> RerankerInfo:
        """The reranker ``name``, else ``--default-reranker``, else the only one served.

        Raises:
            Unavailable, NotFound, BadRequest: as :meth:`model`; no reranker is served
                (404), or several and the request names none (400, lists them).
        """
        return model_of_kind(self, name, ModelKind.RERANKER, self.default_reranker)

    def vectors_model(self, name: str | None, kind: ModelKind) -> Any:
        """The model ``name`` of ``kind``, else ``--default-model`` if of it, else the only one.

        For the routes of one kind of vectors (``/embed_sparse``: sparse, ``/embed_all``:
        multi-vector).

        Raises:
            Unavailable, NotFound, BadRequest: as :func:`~.kinds.model_of_kind`.
        """
        info = self.pool.catalog.resolve(self.default_model) if self.default_model else None
        default = self.default_model if info and info.kind is kind else None
        return model_of_kind(self, name, kind, default)

    def pair_budget(self, model: RerankerInfo, field: str) -> TokenBudget:
        """The token budget of one rerank or score request (``--max-request-tokens``).

        Args:
            model: the reranker (a pair has at most its ``max_length`` tokens).
            field: the request field of the documents, for the message.
        """
        return TokenBudget(self.max_request_tokens, model.max_length, field)

    def token_budget(self, model: ModelInfo, options: RequestOptions, field: str) -> TokenBudget:
        """The token budget of one embedding request to ``model`` (``--max-request-tokens``).

        Args:
            model: the ensemble.
            options: the request options (``truncation=CHUNK`` lets a text have
                ``max_chunks`` windows of ``max_length`` tokens).
            field: the request field of the inputs, for the message.
        """
        per_text = model.max_length
        if per_text is not None and options.truncation is Truncation.CHUNK:
            per_text *= model.max_chunks
        return TokenBudget(self.max_request_tokens, per_text, field)

    def endpoint(
        self,
        route: str,
        api: str,
        handler: Handler,
        *,
        public: bool = False,
        counted: bool = True,
        body: bool = False,
    ) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` behind the key check, its body, the in-flight bound, the envelopes, metrics.

        Args:
            route: the path, the ``route`` label of the metrics.
            api: :data:`OPENAI`, :data:`TEI` or :data:`COHERE`: the error envelope.
            handler: the route's handler.
            public: no API key needed.
            counted: counts against ``--max-in-flight``.
            body: the route takes a JSON body (read into ``state.body`` first).
        """

        async def run(request: Request) -> Response:
            started = time.perf_counter()
            state = RequestState()
            entered = False
            try:
                if not public:
                    self.auth.check(request.headers.get("authorization"))
                if body:
                    state.body = await read_json_body(
                        request, self.max_body_bytes, self.body_timeout_s
                    )
                if counted:
                    if self.in_flight >= self.max_in_flight:
                        raise Overloaded(
                            f"the gateway is handling {self.in_flight} requests, its limit "
                            "(--max-in-flight); retry later, with backoff"
                        )
                    self.in_flight += 1
                    entered = True
                    self.metrics.in_flight.inc()
                response = await self._serve(handler, request, state, watch=body)
            except (GatewayError, TransportError) as failed:
                error = (
                    from_transport(failed, state.api or api)
                    if isinstance(failed, TransportError)
                    else failed
                )
                if error.status >= 500:
                    log.warning("%s %s: %d %s", request.method, route, error.status, error)
                response = error_response(error, state.api or api)
            except ClientGone as gone:
                log.info("%s %s: %s; counted as %d", request.method, route, gone,
                         CLIENT_CLOSED_REQUEST)  # fmt: skip
                response = Response(b"", status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it
            except Exception:
                log.exception("%s %s failed", request.method, route)
                response = error_response(
                    Internal("internal error in the gateway; its log has the details"),
                    state.api or api,
                )
            finally:
                if entered:
                    self.in_flight -= 1
                    self.metrics.in_flight.dec()
            served = response.status_code == 200
            self.metrics.observe(
                route,
                state.model,
                response.status_code,
                time.perf_counter() - started,
                state.inputs if served else 0,
                state.tokens if served else 0,
            )
            return response

        return run

    async def _serve(
        self, handler: Handler, request: Request, state: RequestState, *, watch: bool
    ) -> Response:
        """Run ``handler`` within the request's deadline, and only while its client is there.

        With ``watch`` (the body has been read, so the next ASGI message is the client's
        ``http.disconnect``), a watcher cancels this task when the client disconnects: the
        cancellation reaches the upstream calls in flight
        (:func:`~triton_embed.transport.inference.embed_texts`).

        Raises:
            ClientGone: the client disconnected.
            Timeout: the deadline passed (the upstream calls were cancelled).
        """
        task = asyncio.current_task()
        gone = False

        async def watch_client() -> None:
            nonlocal gone
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone = True
            if task is not None:
                task.cancel()

        watcher = asyncio.create_task(watch_client()) if watch else None
        try:
            async with asyncio.timeout(self.deadline_s):
                return await handler(self, request, state)
        except asyncio.CancelledError:
            if gone and task is not None and task.uncancel() == 0:
                raise ClientGone("the client disconnected before its answer") from None
            raise
        except TimeoutError:
            raise Timeout(
                f"the request did not finish within {self.deadline_s:g} s (--timeout-s); its "
                "upstream calls were cancelled; send fewer inputs per request, or retry later"
            ) from None
        finally:
            if watcher is not None:
                watcher.cancel()


def error_response(error: GatewayError, api: str) -> Response:
    """``error`` as a response in the envelope of ``api``."""
    envelopes = {OPENAI: error.openai_body, TEI: error.tei_body, COHERE: error.cohere_body}
    body = envelopes[api]()
    return Response(
        orjson.dumps(body),
        status_code=error.status,
        headers=error.headers(),
        media_type="application/json",
    )


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
            "POST /embed, POST /embed_sparse, POST /embed_all, POST /tokenize, POST /rerank, "
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
    pool = UpstreamPool(
        settings.targets,
        admin_key=settings.admin_key(),
        timeout_s=settings.timeout_s,
        observer=metrics,
        facts_reader=folder_facts,
        calls_per_model=settings.max_upstream_calls,
    )
    gateway = Gateway(settings, pool, metrics, settings.api_key())
    protocol.configure(
        settings.header_timeout_s,
        on_refused=lambda status: metrics.observe(
            "", "", status, settings.header_timeout_s if status == 408 else 0.0
        ),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await pool.start()
        log.info(
            "gateway listening on %s:%s in front of %s (%d of %d upstreams ready; API key %s)",
            settings.host,
            settings.port,
            ", ".join(settings.upstreams),
            sum(u.ready for u in pool.upstreams.values()),
            len(pool.upstreams),
            "required" if gateway.auth.enabled else "not required: every route is open",
        )
        try:
            yield
        finally:
            await pool.stop()

    return build_app(gateway, lifespan=lifespan)


def create_app_from_env() -> Starlette:
    """:func:`create_app` of the settings in :data:`SETTINGS_ENV` (``--workers`` processes)."""
    settings = GatewaySettings.from_json(os.environ[SETTINGS_ENV])
    configure_logging(settings.log_level)
    return create_app(settings)
