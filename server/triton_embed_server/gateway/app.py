"""The gateway's Starlette application: routes, and what every request goes through.

Every route's handler is wrapped by :meth:`Gateway.endpoint`, in this order:

1. the API key selects the request's tenant (:mod:`~triton_embed_server.gateway.tenancy`;
   401 without one), and the tenant's token rate admits it (429 ``rate_limit_exceeded``),
   except on the health routes, ``/metrics`` and ``/admin/usage`` (the admin key's);
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
   the inputs and tokens its handler served, and in its tenant's bucket, usage row and
   counters (:mod:`~triton_embed_server.gateway.usage`);
7. with ``--otlp-endpoint``, all of it inside the request's server span
   (:mod:`~triton_embed_server.gateway.tracing`: tenant, model, status; the upstream calls'
   client spans are its children), except on the health routes, ``/metrics`` and
   ``/admin/usage``.

A handler's upstream work runs in :meth:`Gateway.upstream_turn`: the tenant's models (403),
its turn in the scheduler (:mod:`~triton_embed_server.gateway.fair`) and its priority level.

The routes and the app of the settings: :mod:`~triton_embed_server.gateway.routes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from triton_embed.options import RequestOptions, Truncation
from triton_embed.transport.catalog import (
    ModelInfo,
    ModelKind,
    RerankerInfo,
    ServedModel,
)
from triton_embed.transport.failures import TransportError
from triton_embed.transport.hybrid_info import VIEWS as HYBRID_VIEWS
from triton_embed.transport.inference import Pool, TokenBudget
from triton_embed.transport.priorities import REQUEST_PRIORITY

from triton_embed_server.gateway.body import read_json_body
from triton_embed_server.gateway.errors import (
    CLIENT_CLOSED_REQUEST,
    COHERE,
    OPENAI,
    TEI,
    ClientGone,
    GatewayError,
    Internal,
    NotFound,
    Overloaded,
    RateLimited,
    Timeout,
    Unavailable,
    from_transport,
    quote,
)
from triton_embed_server.gateway.fair import Scheduler, Ticket
from triton_embed_server.gateway.kinds import model_of_kind, wrong_kind
from triton_embed_server.gateway.merging import Merger
from triton_embed_server.gateway.metrics import GatewayMetrics
from triton_embed_server.gateway.settings import GatewaySettings
from triton_embed_server.gateway.shared import SharedStore, SharedUsageLedger
from triton_embed_server.gateway.tenancy import TenantRegistry
from triton_embed_server.gateway.tenants import Tenant
from triton_embed_server.gateway.tracing import GatewayTracing
from triton_embed_server.gateway.usage import UsageLedger

log = logging.getLogger("triton_embed.gateway")

#: The tenant of the request the current task serves (``None``: none identified yet, or a
#: public route); what a model-not-found message may list depends on it.
REQUEST_TENANT: contextvars.ContextVar[Tenant | None] = contextvars.ContextVar(
    "gateway_request_tenant", default=None
)

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
        reserved: tokens taken from the tenant's bucket as estimates (charged the difference).
        tenant: who sent it (``None`` before its key was checked, and on public routes).
    """

    model: str = ""
    body: Any = None
    api: str | None = None
    inputs: int = 0
    tokens: int = 0
    reserved: int = 0
    tenant: Tenant | None = None


class Gateway:
    """One gateway's state: its upstreams, request merging, limits, key check and metrics.

    Args:
        settings: the parsed settings.
        pool: the upstreams (:class:`~triton_embed.transport.upstreams.UpstreamPool`, or a
            test double).
        metrics: the gateway's metrics (the pool's, when it has them).
        api_key: the key clients must send, or ``None`` (one tenant, or an open gateway;
            ignored when ``tenants`` is given).
        tenants: the tenants (``--tenants``); ``None``: those of ``api_key``.
        admin_key: the servers' admin key, which also opens ``GET /admin/usage``
            (``None``: that route is closed).
        tracing: the request spans (``--otlp-endpoint``, :mod:`~.tracing`); ``None``: none.
        store: the ``--workers`` processes' shared store (:mod:`~.shared`): slots and usage
            for the whole gateway; ``None``: this process's own.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        pool: Pool,
        metrics: GatewayMetrics,
        api_key: str | None,
        tenants: TenantRegistry | None = None,
        admin_key: str | None = None,
        tracing: GatewayTracing | None = None,
        store: SharedStore | None = None,
    ):
        self.settings = settings
        self.tracing = tracing
        self.pool = pool
        self.metrics = metrics
        self.merger = Merger(pool, settings.merge_in_flight, metrics)
        self.tenancy = tenants or TenantRegistry.from_sources(None, api_key)
        self.scheduler = Scheduler(settings.max_upstream_requests, store)
        self.usage = UsageLedger() if store is None else SharedUsageLedger(store)
        self.admin_key = admin_key
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
            if info.kind is ModelKind.HYBRID and kind in HYBRID_VIEWS:
                return info.view(kind)  # BGE-M3's dense, sparse or ColBERT head
            if kind is not None and info.kind is not kind:
                raise wrong_kind(name, info.kind, kind)
            return info
        self.require_ready()
        names = ", ".join(self.visible(self.pool.catalog.names())) or "none"
        raise NotFound(
            f"the model {quote(name)} does not exist; the models are: {names} (GET /v1/models)",
            param="model",
        )

    def visible(self, names: list[str]) -> list[str]:
        """Those of the served model ``names`` the current request's tenant may use.

        A message that lists models lists only these, so that a tenant restricted to some
        models (``models`` in the tenants file) does not learn the others' names.
        """
        tenant = REQUEST_TENANT.get()
        if tenant is None or tenant.models is None:
            return list(names)
        return [
            n for n in names
            if (m := self.resolve_name(n)) is not None
            and self.tenancy.may_use(tenant, m, self.resolve_name)
        ]  # fmt: skip

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
        multi-vector); a hybrid ``--default-model`` serves both.

        Raises:
            Unavailable, NotFound, BadRequest: as :func:`~.kinds.model_of_kind`.
        """
        info = self.pool.catalog.resolve(self.default_model) if self.default_model else None
        serves = info is not None and (info.kind is kind or info.kind is ModelKind.HYBRID)
        default = self.default_model if serves else None
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

    @contextlib.asynccontextmanager
    async def upstream_turn(
        self, state: RequestState, model: str, estimate: int
    ) -> AsyncIterator[Ticket]:
        """A request's upstream work: its tenant's rights, its turn, its priority level.

        Checks the tenant may use ``model`` (403), takes ``estimate`` tokens from its bucket
        (429 when at or below 0; charged the difference when answered), waits for its turn in the
        scheduler (:mod:`~triton_embed_server.gateway.fair`: interactive first, fair shares
        by tokens within a class, ``max_concurrency``), and sends the upstream calls made
        in the body at the tenant's Triton priority level
        (:data:`~triton_embed.transport.upstreams.REQUEST_PRIORITY`). Set the ticket's
        ``tokens`` to the tokens served.

        Args:
            state: the request's state (its tenant).
            model: the ensemble's name the request resolved to.
            estimate: its tokens, estimated (:func:`~.fair.estimate_tokens`).

        Raises:
            Forbidden: the tenant may not use ``model``.
        """
        tenant = state.tenant
        if tenant is None:
            raise Internal("a request reached the upstreams without a tenant")
        self.tenancy.check_model(tenant, model, self.resolve_name)
        self.tenancy.reserve(tenant, max(1, estimate))
        state.reserved += max(1, estimate)
        ticket = Ticket(
            tenant.name, tenant.priority.level, tenant.weight, tenant.max_concurrency,
            max(1, estimate),
        )  # fmt: skip
        async with self.scheduler.turn(ticket):
            level = REQUEST_PRIORITY.set(tenant.priority.level)
            try:
                yield ticket
            finally:
                REQUEST_PRIORITY.reset(level)

    def _check_named_model(self, state: RequestState) -> None:
        """403 for a served model the body names and the tenant may not use, first.

        Before the handler's checks, so that a tenant learns nothing of a model it may not
        use (its kind, its limits) from a 400; an unknown name is left to the handler (404).

        Raises:
            Forbidden: as :meth:`upstream_turn`.
        """
        body, tenant = state.body, state.tenant
        if tenant is None or not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return
        named = self.resolve_name(body["model"])
        if named is not None:
            self.tenancy.check_model(tenant, named, self.resolve_name, body["model"])

    def resolve_name(self, name: str) -> str | None:
        """The ensemble a model name or alias stands for, or ``None``."""
        info = self.pool.catalog.resolve(name)
        return None if info is None else info.name

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

        async def traced(request: Request) -> Response:
            tracing = self.tracing
            if tracing is None or public:  # probes and scrapes make no spans
                return await run(request, RequestState())
            state = RequestState()
            with tracing.request_span(request.method, route, request.headers) as span:
                response = await run(request, state)
                tenant = "" if state.tenant is None else state.tenant.name
                served = response.status_code == 200
                inputs, tokens = (state.inputs, state.tokens) if served else (0, 0)
                tracing.finish(span, response.status_code, tenant, state.model, inputs, tokens)
            return response

        async def run(request: Request, state: RequestState) -> Response:
            started = time.perf_counter()
            entered = False
            refusal = None
            unread = body  # a body not read to its end: the connection is closed after the answer
            try:
                if not public:
                    state.tenant = self.tenancy.identify(request.headers.get("authorization"))
                    REQUEST_TENANT.set(state.tenant)
                    self.tenancy.admit(state.tenant)
                if body:
                    state.body = await read_json_body(
                        request, self.max_body_bytes, self.body_timeout_s
                    )
                    unread = False
                    self._check_named_model(state)
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
                if error.status == 429:
                    refusal = "rate_limited" if isinstance(error, RateLimited) else "overloaded"
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
            if unread:  # its rest would be read as the next request's headers
                response.headers["connection"] = "close"
            served = response.status_code == 200
            self.metrics.observe(
                route,
                state.model,
                response.status_code,
                time.perf_counter() - started,
                state.inputs if served else 0,
                state.tokens if served else 0,
            )
            if not public:
                self._account(state, response.status_code, refusal)
            return response

        return traced

    def _account(self, state: RequestState, status: int, refusal: str | None) -> None:
        """A tenant's answered request: its bucket, its usage row and its counters."""
        tenant = state.tenant
        name = "" if tenant is None else tenant.name
        served = status == 200
        inputs, tokens = (state.inputs, state.tokens) if served else (0, 0)
        usd = self.tenancy.usd_per_million_tokens
        self.metrics.observe_tenant(name, status, inputs, tokens, usd)
        if refusal is not None:
            self.metrics.count_refusal(name, refusal)
        if tenant is not None:
            self.tenancy.charge(tenant, tokens - state.reserved)
            if served:
                self.usage.record(tenant.name, inputs, tokens)

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
