"""The upstream Triton servers: addresses, health, the model catalog, choice and retry.

``--upstream HOST:PORT[,HOST:PORT...]`` names gRPC endpoints. A host name is resolved again
every :data:`RESOLVE_INTERVAL_S` seconds to all its A/AAAA records, so the pods behind a
headless Kubernetes Service come and go with DNS; each address is one :class:`Upstream`
with one ``tritonclient.grpc.aio.InferenceServerClient`` (one channel, reused by every
request).

Every :data:`HEALTH_INTERVAL_S` seconds each upstream is checked: ``is_server_ready``, then
the models it has READY (the repository index) and their configs (both restricted APIs:
sent with the admin key, :mod:`triton_embed.admin`). The configs become the
:class:`~triton_embed.transport.catalog.Catalog`.

A request's upstream is the ready one that has the model READY with the fewest requests
outstanding from this gateway (least outstanding requests; ties rotate). A call that fails
because its upstream is unreachable (gRPC ``UNAVAILABLE`` other than a queue refusal, a
broken connection) takes that upstream out at once, and the call is sent once more to
another upstream (embedding is idempotent); the next health check puts the upstream back
when it answers ready again. A queue refusal ("Exceeds maximum queue size") is sent once
more to another upstream too, without taking the refusing one out. A model the upstream no
longer has (gRPC ``NOT_FOUND``) is dropped from its models and the call goes elsewhere.
Every other error (bad input, deadline) is final.

What the pool meets (upstreams in and out, calls sent again) goes to its observer
(:mod:`~triton_embed.transport.observer`): the HTTP gateway's metrics, or nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from triton_embed.admin import grpc_headers, is_refused
from triton_embed.transport.addresses import Target, address, resolve
from triton_embed.transport.catalog import Catalog, FolderFacts, config_facts
from triton_embed.transport.failures import (
    QUEUE_FULL,
    ErrorKind,
    TransportError,
    classify,
    server_message,
    short_message,
    status_name,
)
from triton_embed.transport.hybrid_info import any_served_model
from triton_embed.transport.observer import NO_OBSERVER, PoolObserver
from triton_embed.transport.priorities import PriorityGate, gate, priority_kwargs
from triton_embed.transport.tracing import call_span, capture

log = logging.getLogger("triton_embed.gateway")

#: Seconds between health checks of every upstream.
HEALTH_INTERVAL_S = 2.0
#: Seconds between DNS resolutions of the upstream host names.
RESOLVE_INTERVAL_S = 5.0
#: Seconds one health-check call may take.
HEALTH_TIMEOUT_S = 5.0
#: Health checks in a row that may time out before an upstream is taken out: a server busy
#: with a large batch on a small host can be slow to answer, without being gone (a refused
#: connection takes it out at once).
SLOW_CHECKS_TOLERATED = 2
#: Seconds after which an upstream's model configs are read again (a reload may change them).
CONFIG_REFRESH_S = 30.0
#: Seconds a removed upstream's channel stays open for the calls still on it.
CLOSE_GRACE_S = 30.0
#: The largest gRPC message either way (Triton's and tritonclient's limit, INT32_MAX).
MAX_MESSAGE_BYTES = 2**31 - 1
#: gRPC channel arguments: messages as large as Triton allows, and a short reconnect backoff
#: (gRPC's default grows from 1 s to 120 s, which would keep a restarted server out for
#: minutes; docs/operations.md, "A dead tritonserver").
CHANNEL_ARGS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


def grpc_client(url: str) -> Any:
    """A ``tritonclient.grpc.aio.InferenceServerClient`` for ``url`` (:data:`CHANNEL_ARGS`)."""
    from tritonclient.grpc.aio import InferenceServerClient

    return InferenceServerClient(url, channel_args=list(CHANNEL_ARGS))


def bytes_input(name: str, elements: Sequence[bytes]) -> Any:
    """A ``tritonclient.grpc.InferInput`` ``[n, 1]`` ``BYTES`` holding ``elements``.

    Built from a numpy ``object`` array (a ``numpy.bytes_`` array strips trailing ``0x00``
    bytes).
    """
    from tritonclient.grpc import InferInput

    array = np.empty((len(elements), 1), dtype=object)
    array[:, 0] = elements
    tensor = InferInput(name, [len(elements), 1], "BYTES")
    tensor.set_data_from_numpy(array)
    return tensor


def raw_outputs(response: Any) -> dict[str, bytes]:
    """``{output name: raw bytes}`` of a ``ModelInferResponse`` (gRPC ``raw_output_contents``).

    Triton lists the outputs in its own order (``NUM_TOKENS`` may come before
    ``EMBEDDING``), so they are taken by name; :mod:`triton_embed.codec` reads the bytes.
    """
    return {
        output.name: raw
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=False)
    }


def _one_line(exc: BaseException) -> str:
    """The server's message of ``exc`` on one line, at most 300 characters (for ``problem``)."""
    return " ".join(short_message(server_message(exc)).split())[:300]


class Upstream:
    """One upstream Triton server, as the gateway sees it.

    Attributes:
        address: ``ip:port`` dialled.
        target: the ``--upstream`` entry it came from.
        client: its ``tritonclient.grpc.aio.InferenceServerClient``.
        ready: whether it is in use (ready at the last check, no failure since).
        models: names of the models it had READY at the last check.
        configs: ``{model name: config}`` of those models.
        outstanding: calls this gateway has on it now.
    """

    def __init__(self, address: str, target: Target, client: Any):
        self.address = address
        self.target = target
        self.client = client
        self.ready = False
        self.models: frozenset[str] = frozenset()
        self.configs: dict[str, dict[str, Any]] = {}
        self.configs_read_at = 0.0
        self.outstanding = 0
        self.problem = "not checked yet"
        self.slow_checks = 0

    def __repr__(self) -> str:
        state = "ready" if self.ready else f"out ({self.problem})"
        return f"Upstream({self.address}, {state}, outstanding={self.outstanding})"


class UpstreamPool:
    """The upstreams of one gateway: health, catalog, least-outstanding choice, one retry.

    Args:
        targets: the ``--upstream`` entries.
        admin_key: the servers' admin key (for the repository index and configs), or ``None``.
        timeout_s: deadline of one inference call, seconds.
        observer: told of upstream health and retries (:class:`~.observer.PoolObserver`;
            the gateway's metrics); default: nobody.
        client_factory: ``url -> InferenceServerClient`` (tests pass a fake).
        resolver: ``async (host, port) -> [ip, ...]`` (tests pass a fake).
        facts_reader: ``embedder config -> FolderFacts`` (default
            :func:`~.catalog.config_facts`; the gateway passes one that reads model folders).
        calls_per_model: calls in flight to one model on one upstream (``None``: any); more
            wait here by priority level (:func:`~.priorities.gate`), not past a step's
            ``max_queue_size`` where Triton says 429.
    """

    def __init__(
        self,
        targets: Sequence[Target],
        *,
        admin_key: str | None,
        timeout_s: float,
        observer: PoolObserver = NO_OBSERVER,
        client_factory: Callable[[str], Any] = grpc_client,
        resolver: Callable[[str, int], Awaitable[list[str]]] | None = None,
        facts_reader: Callable[[Mapping[str, Any]], FolderFacts] = config_facts,
        health_interval_s: float = HEALTH_INTERVAL_S,
        resolve_interval_s: float = RESOLVE_INTERVAL_S,
        calls_per_model: int | None = None,
    ):
        self.targets, self.calls_per_model = list(targets), calls_per_model
        self._gates: dict[tuple[str, str], PriorityGate] = {}
        self.timeout_s = timeout_s
        self.observer = observer
        self._headers = grpc_headers(admin_key) or None
        self._client_factory = client_factory
        self._resolver = resolver or resolve
        self._facts_reader = facts_reader
        self._facts: dict[tuple[str, str, str], FolderFacts] = {}
        self.health_interval_s = health_interval_s
        self.resolve_interval_s = resolve_interval_s
        self.upstreams: dict[str, Upstream] = {}
        self.catalog = Catalog()
        self._turn = 0
        self._resolved_at = float("-inf")
        self._task: asyncio.Task | None = None
        self._closing: set[asyncio.Task] = set()
        self._warned_key = False

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve and check every upstream once, then keep doing so in the background."""
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="upstream-health")

    async def stop(self) -> None:
        """Stop the checks and close every channel."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._closing):
            task.cancel()
        for upstream in self.upstreams.values():
            await _close(upstream.client)
        self.upstreams.clear()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.refresh()
            except Exception:  # the loop must survive anything; say what happened
                log.exception("upstream health check failed")

    async def refresh(self) -> None:
        """One round: resolve the host names when due, check every upstream, rebuild the catalog."""
        if time.monotonic() - self._resolved_at >= self.resolve_interval_s:
            await self._resolve_all()
        await asyncio.gather(*(self._check(u) for u in list(self.upstreams.values())))
        self._rebuild_catalog()

    # ---- addresses ----------------------------------------------------------------------

    async def _resolve_all(self) -> None:
        self._resolved_at = time.monotonic()
        wanted: dict[str, Target] = {}
        for target in self.targets:
            if target.is_ip:
                ips = [target.host]
            else:
                try:
                    ips = await self._resolver(target.host, target.port)
                except OSError as exc:
                    log.warning(
                        "cannot resolve upstream %s (%s); keeping its addresses", target, exc
                    )
                    ips = [u.address for u in self.upstreams.values() if u.target == target]
                    wanted.update({a: target for a in ips})
                    continue
            wanted.update({address(ip, target.port): target for ip in ips})
        for addr, target in wanted.items():
            if addr not in self.upstreams:
                self.upstreams[addr] = Upstream(addr, target, self._client_factory(addr))
                self.observer.set_upstream(addr, False)
                log.info("upstream %s (from %s) added", addr, target)
        for addr in [a for a in self.upstreams if a not in wanted]:
            upstream = self.upstreams.pop(addr)
            self.observer.forget_upstream(addr)
            log.info("upstream %s removed: %s no longer resolves to it", addr, upstream.target)
            task = asyncio.create_task(_close_later(upstream.client, CLOSE_GRACE_S))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    # ---- health -------------------------------------------------------------------------

    async def _check(self, upstream: Upstream) -> None:
        client = upstream.client
        try:
            if not await client.is_server_ready(client_timeout=HEALTH_TIMEOUT_S):
                self._set_out(upstream, "not ready")
                return
            index = await client.get_model_repository_index(
                headers=self._headers, as_json=True, client_timeout=HEALTH_TIMEOUT_S
            )
            models = frozenset(
                m["name"] for m in index.get("models", []) if m.get("state") == "READY"
            )
            stale = time.monotonic() - upstream.configs_read_at >= CONFIG_REFRESH_S
            wanted = models if stale else models - upstream.configs.keys()
            configs = {k: v for k, v in upstream.configs.items() if k in models}
            for name in sorted(wanted):
                config = await client.get_model_config(
                    name, headers=self._headers, as_json=True, client_timeout=HEALTH_TIMEOUT_S
                )
                configs[name] = config.get("config", {})
        except Exception as exc:  # tritonclient errors, a closed channel
            message = short_message(server_message(exc))
            if status_name(exc) == "DEADLINE_EXCEEDED" and upstream.ready:
                upstream.slow_checks += 1
                if upstream.slow_checks <= SLOW_CHECKS_TOLERATED:
                    log.warning(
                        "upstream %s answered no health check within %g s (%d in a row)",
                        upstream.address,
                        HEALTH_TIMEOUT_S,
                        upstream.slow_checks,
                    )
                    return
            if is_refused(message) and not self._warned_key:
                self._warned_key = True
                log.error(
                    "upstream %s refused to list its models: the gateway needs the servers' "
                    "admin key (TRITON_EMBED_ADMIN_KEY, TRITON_EMBED_ADMIN_KEY_FILE, "
                    "--admin-key-file, or the default key file of the user running it)",
                    upstream.address,
                )
            self._set_out(upstream, _one_line(exc))
            return
        if stale:
            upstream.configs_read_at = time.monotonic()
        upstream.configs = configs
        upstream.models = models
        if not upstream.ready:
            names = ", ".join(sorted(models)) or "none"
            log.info("upstream %s is ready (models READY: %s)", upstream.address, names)
        upstream.ready = True
        upstream.problem = ""
        upstream.slow_checks = 0
        self.observer.set_upstream(upstream.address, True)

    def _set_out(self, upstream: Upstream, problem: str) -> None:
        """Take ``upstream`` out of use until a health check finds it ready."""
        if upstream.ready or upstream.problem != problem:
            log.warning("upstream %s taken out: %s", upstream.address, problem)
        upstream.ready = False
        upstream.problem = problem
        self.observer.set_upstream(upstream.address, False)

    def _rebuild_catalog(self) -> None:
        infos = []
        for upstream in sorted(self.upstreams.values(), key=lambda u: u.address):
            if not upstream.ready:
                continue
            for name in sorted(upstream.configs):
                info = any_served_model(
                    upstream.configs[name],
                    upstream.configs,
                    lambda: self._embedder_facts(upstream, name),  # noqa: B023 - called at once
                )
                if info is not None:
                    infos.append(info)
        self.catalog = Catalog.build(infos)

    def _embedder_facts(self, upstream: Upstream, name: str) -> FolderFacts | None:
        """Pooling and normalization of ensemble ``name``'s embedder (cached per config)."""
        steps = upstream.configs[name].get("ensemble_scheduling", {}).get("step", [])
        embedder = upstream.configs.get(steps[-1].get("model_name", "")) if steps else None
        if not embedder:
            return None
        params = embedder.get("parameters") or {}
        key = tuple(
            str((params.get(k) or {}).get("string_value", ""))
            for k in ("model_path", "pooling", "normalize")
        )
        if key not in self._facts:
            self._facts[key] = self._facts_reader(embedder)
        return self._facts[key]

    # ---- requests -----------------------------------------------------------------------

    def any_ready(self) -> bool:
        """Whether at least one upstream is ready."""
        return any(u.ready for u in self.upstreams.values())

    def choose(self, model: str, exclude: Sequence[Upstream] = ()) -> Upstream | None:
        """The ready upstream with ``model`` READY and the fewest calls outstanding.

        Ties go to the next upstream in turn, so equal upstreams share the load.
        """
        candidates = [
            u for u in self.upstreams.values() if u.ready and model in u.models and u not in exclude
        ]
        if not candidates:
            return None
        self._turn = (self._turn + 1) % len(candidates)
        rotated = candidates[self._turn :] + candidates[: self._turn]
        return min(rotated, key=lambda u: u.outstanding)

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Sequence[bytes]],
        outputs: Sequence[str],
        parameters: Mapping[str, Any] | None = None,
    ) -> dict[str, bytes]:
        """One inference call, on the best upstream, sent once more elsewhere if it fails.

        Each attempt is a client span of the call's trace, if any (:mod:`.tracing`).

        Args:
            model: the model to call (an ensemble or one of its steps).
            inputs: ``{input name: n BYTES elements}``, sent as ``[n, 1]`` tensors.
            outputs: the outputs to ask for.
            parameters: KServe v2 request parameters.

        Returns:
            ``{output name: raw bytes}`` (:func:`raw_outputs`).

        Raises:
            TransportError: ``NO_UPSTREAM``: no ready upstream has ``model`` READY, or the
                channel closed under the call.
            Exception: the ``tritonclient`` error of the last attempt (the caller maps it,
                :func:`~triton_embed.transport.failures.upstream_error`).
        """
        from tritonclient.grpc import InferRequestedOutput
        from tritonclient.utils import InferenceServerException

        tensors_in = [bytes_input(name, elements) for name, elements in inputs.items()]
        requested = [InferRequestedOutput(name) for name in outputs]
        tried: list[Upstream] = []
        error: BaseException | None = None
        parent = capture()  # the trace of the request's work: each attempt is a client span
        for attempt in range(2):
            upstream = self.choose(model, exclude=tried)
            if upstream is None:
                break
            if attempt:
                self.observer.count_retry()
            tried.append(upstream)
            upstream.outstanding += 1
            try:
                async with gate(self._gates, (upstream.address, model), self.calls_per_model):
                    with call_span(parent, model, upstream.address) as headers:
                        result = await upstream.client.infer(
                            model, tensors_in, outputs=requested, headers=headers,
                            client_timeout=self.timeout_s, **priority_kwargs(parameters),
                        )  # fmt: skip
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = exc
                if not self._may_retry(upstream, model, exc):
                    raise
                continue
            finally:
                upstream.outstanding -= 1
            return raw_outputs(result.get_response())
        if isinstance(error, InferenceServerException):
            raise error
        if error is not None:  # a channel closed under the call: the upstream was removed
            raise TransportError(ErrorKind.NO_UPSTREAM, f"no upstream could take the call: {error}")
        if not self.any_ready():
            raise TransportError(ErrorKind.NO_UPSTREAM, "no upstream is ready; retry later")
        raise TransportError(
            ErrorKind.NO_UPSTREAM, f"no ready upstream has the model {model!r} READY; retry later"
        )

    def _may_retry(self, upstream: Upstream, model: str, exc: BaseException) -> bool:
        """Whether a failed call may go to another upstream; takes a dead upstream out."""
        failure = classify(exc)
        if failure.kind is ErrorKind.OVERLOADED:
            return QUEUE_FULL in failure.message  # a queue timeout already waited 30 s
        if failure.kind is ErrorKind.MODEL_MISSING:
            upstream.models = upstream.models - {model}
            return True
        if _is_closed_channel(exc):  # the upstream was removed while the call started
            return True
        if failure.kind is ErrorKind.UNREACHABLE:
            self._set_out(upstream, _one_line(exc))
            return True
        return False

    def describe(self) -> list[dict[str, Any]]:
        """Every upstream's state, for logs and tests."""
        return [
            {
                "address": u.address,
                "target": str(u.target),
                "ready": u.ready,
                "models": sorted(u.models),
                "outstanding": u.outstanding,
                "problem": u.problem,
            }
            for u in self.upstreams.values()
        ]


def _is_closed_channel(exc: BaseException) -> bool:
    """A call on a channel already closed (``grpc.aio.UsageError``)."""
    import grpc

    return isinstance(exc, grpc.aio.UsageError)


async def _close(client: Any) -> None:
    with contextlib.suppress(Exception):
        await client.close()


async def _close_later(client: Any, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    await _close(client)
