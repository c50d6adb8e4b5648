"""Overload run: many concurrent clients against a real server; what is refused, and how fast.

Starts its own ``tritonserver`` (the shipped ``model_repository`` unless told otherwise), runs
``--clients`` concurrent clients for ``--seconds``, each in a closed loop (send a request, wait
for its answer, send the next; after a refusal wait ``--pause-s`` first, or with ``--backoff``
as the client library waits), then stops the server and prints the figures:

* refused requests: how many, their messages, and how fast the refusal came (p50/p99/max);
* admitted requests: how many, their latency (p50/p99/max) and the tokens/s they got;
* crashes: other errors, the server process gone, or ``/v2/health/ready`` not answering
  ready at any of the checks made every half second during the run and at its end.

    .venv/bin/python -m perf.overload                       # 200 clients, 30 s, 1 text each
    .venv/bin/python -m perf.overload --backoff             # refused clients back off
    .venv/bin/python -m perf.overload --texts-per-request 16 --json /tmp/overload.json

Each client has its own gRPC channel (``tritonclient.grpc.aio``); all of them run in one
asyncio loop of this process, on the same machine as the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from triton_embed.errors import QUEUE_FULL, QUEUE_TIMEOUT
from triton_embed.retry import RetryPolicy


@dataclass(frozen=True)
class Outcome:
    """One request of the load.

    Attributes:
        kind: ``ok``, ``queue_full``, ``queue_timeout`` or ``error``.
        seconds: from sending to the answer.
        texts: texts in the request.
        tokens: tokens the server counted (``NUM_TOKENS`` summed; 0 when refused).
        message: the error's status and message (empty when ``ok``).
    """

    kind: str
    seconds: float
    texts: int
    tokens: int = 0
    message: str = ""


def classify(status: str, message: str) -> str:
    """``queue_full``, ``queue_timeout`` or ``error`` for a failed request.

    Args:
        status: the gRPC status (``StatusCode.UNAVAILABLE``, ...).
        message: the server's message.
    """
    if "UNAVAILABLE" in status and QUEUE_FULL in message:
        return "queue_full"
    if "UNAVAILABLE" in status and QUEUE_TIMEOUT in message:
        return "queue_timeout"
    return "error"


def _pause(pause_s: float | RetryPolicy, refused_in_a_row: int) -> float:
    """A client's wait after its ``refused_in_a_row``-th refusal in a row, seconds."""
    if isinstance(pause_s, RetryPolicy):  # full jitter, as the client library waits
        return random.uniform(0.0, pause_s.wait_bound_s(refused_in_a_row))
    return pause_s


def _running(deadline: float, stop: threading.Event | None) -> bool:
    return time.monotonic() < deadline and not (stop is not None and stop.is_set())


async def _client_loop(
    url: str,
    payload: np.ndarray,
    deadline: float,
    stop: threading.Event | None,
    pause_s: float | RetryPolicy,
    outcomes: list[Outcome],
    model: str,
) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aio

    client = aio.InferenceServerClient(url)
    refused_in_a_row = 0
    try:
        while _running(deadline, stop):
            inp = grpcclient.InferInput("TEXT", list(payload.shape), "BYTES")
            inp.set_data_from_numpy(payload)
            t0 = time.perf_counter()
            try:
                result = await client.infer(model, [inp])
            except Exception as exc:  # noqa: BLE001 - every failure is recorded, none is fatal
                elapsed = time.perf_counter() - t0
                status = str(exc.status()) if hasattr(exc, "status") else type(exc).__name__
                message = exc.message() if hasattr(exc, "message") else str(exc)
                kind = classify(status or "", message or "")
                outcomes.append(
                    Outcome(kind, elapsed, len(payload), message=f"{status} {message}".strip())
                )
                refused_in_a_row += 1
                await asyncio.sleep(_pause(pause_s, refused_in_a_row))
                continue
            refused_in_a_row = 0
            elapsed = time.perf_counter() - t0
            tokens = int(result.as_numpy("NUM_TOKENS").sum())
            outcomes.append(Outcome("ok", elapsed, len(payload), tokens))
    finally:
        await client.close()


async def _loop_lag(deadline: float, stop: threading.Event | None, lags: list[float]) -> None:
    """How late this process's event loop wakes from a 10 ms sleep: the load generator's share."""
    while _running(deadline, stop):
        t0 = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(time.perf_counter() - t0 - 0.01)


async def _ready_monitor(
    url: str, deadline: float, stop: threading.Event | None, checks: list[bool]
) -> None:
    import tritonclient.grpc.aio as aio

    client = aio.InferenceServerClient(url)
    try:
        while _running(deadline, stop):
            try:
                checks.append(bool(await client.is_server_ready(client_timeout=5)))
            except Exception:  # noqa: BLE001 - not answering is what is counted
                checks.append(False)
            await asyncio.sleep(0.5)
    finally:
        await client.close()


@dataclass
class LoadRun:
    """What :func:`run_load` saw.

    Attributes:
        outcomes: every request.
        ready_checks: ``/v2/health/ready`` (gRPC ``ServerReady``) every half second.
        loop_lags_s: how late the load generator's event loop woke from 10 ms sleeps; the
            part of every measured latency that is this process, not the server.
        seconds: the run's wall time.
    """

    outcomes: list[Outcome]
    ready_checks: list[bool]
    loop_lags_s: list[float]
    seconds: float


def run_load(
    url: str,
    texts: list[str],
    clients: int,
    seconds: float,
    pause_s: float | RetryPolicy = 0.1,
    model: str = "embed",
    stop: threading.Event | None = None,
) -> LoadRun:
    """Run ``clients`` closed-loop clients for ``seconds``; each sends ``texts`` per request.

    Args:
        url: gRPC ``host:port``.
        texts: the texts of every request.
        clients: concurrent clients, one gRPC channel each.
        seconds: how long each keeps sending.
        pause_s: a client's wait after a refusal before its next request: fixed seconds, or
            the client library's backoff (a :class:`~triton_embed.retry.RetryPolicy`: a
            random wait in ``[0, wait_bound_s(k)]`` after the k-th refusal in a row).
        model: the ensemble's name.
        stop: ends the run early once set (a load in a background thread).

    Returns:
        :class:`LoadRun`.
    """
    payload = np.array([[t.encode("utf-8")] for t in texts], dtype=object)

    async def main() -> LoadRun:
        run = LoadRun([], [], [], 0.0)
        deadline = time.monotonic() + seconds
        await asyncio.gather(
            _ready_monitor(url, deadline, stop, run.ready_checks),
            _loop_lag(deadline, stop, run.loop_lags_s),
            *(
                _client_loop(url, payload, deadline, stop, pause_s, run.outcomes, model)
                for _ in range(clients)
            ),
        )
        return run

    t0 = time.perf_counter()
    run = asyncio.run(main())
    run.seconds = time.perf_counter() - t0
    return run


class BackgroundLoad:
    """:func:`run_load` in a thread, for as long as a ``with`` block lasts.

    ``with BackgroundLoad(url, texts, clients=100) as load: ...``; afterwards ``load.run``
    holds its :class:`LoadRun`.
    """

    def __init__(
        self, url: str, texts: list[str], clients: int, pause_s: float | RetryPolicy = 0.1
    ):
        self._args = (url, texts, clients, 3600.0, pause_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.run: LoadRun | None = None
        self.error: BaseException | None = None

    def _main(self) -> None:
        try:
            self.run = run_load(*self._args, stop=self._stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller in __exit__
            self.error = exc

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        if self.error is not None:
            raise self.error


def _ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    ms = np.asarray(values) * 1000.0
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
        "max_ms": round(float(ms.max()), 1),
    }


def summarize(run: LoadRun) -> dict:
    """The figures of a run (see the module docstring).

    Returns:
        ``requests``, ``admitted``, ``refused`` (= ``queue_full`` + ``queue_timeout``),
        ``errors``, latency percentiles (``refusal_queue_full``, ``refusal_queue_timeout``,
        ``admitted_latency``, ``client_loop_lag``), ``admitted_tokens_per_s``,
        ``ready_checks``, ``not_ready_checks``, ``messages`` (each distinct error message with
        its count).
    """
    outcomes, checks, elapsed_s = run.outcomes, run.ready_checks, run.seconds
    by_kind: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_kind.setdefault(o.kind, []).append(o)
    ok = by_kind.get("ok", [])
    full = by_kind.get("queue_full", [])
    timed_out = by_kind.get("queue_timeout", [])
    messages: dict[str, int] = {}
    for o in outcomes:
        if o.message:
            messages[o.message] = messages.get(o.message, 0) + 1
    return {
        "requests": len(outcomes),
        "admitted": len(ok),
        "refused": len(full) + len(timed_out),
        "queue_full": len(full),
        "queue_timeout": len(timed_out),
        "errors": len(by_kind.get("error", [])),
        "refusal_queue_full": _ms([o.seconds for o in full]),
        "refusal_queue_timeout": _ms([o.seconds for o in timed_out]),
        "admitted_latency": _ms([o.seconds for o in ok]),
        "client_loop_lag": _ms(run.loop_lags_s),
        "admitted_texts": sum(o.texts for o in ok),
        "admitted_tokens_per_s": round(sum(o.tokens for o in ok) / elapsed_s, 1),
        "seconds": round(elapsed_s, 1),
        "ready_checks": len(checks),
        "not_ready_checks": checks.count(False),
        "messages": dict(sorted(messages.items(), key=lambda kv: -kv[1])),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.overload``: exit 1 on any crash (error, server gone, not ready)."""
    from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

    from perf.corpora import exact_texts

    parser = argparse.ArgumentParser(prog="python -m perf.overload", description=__doc__)
    parser.add_argument("--clients", type=int, default=200, help="default %(default)s")
    parser.add_argument("--seconds", type=float, default=30.0, help="default %(default)s")
    parser.add_argument("--texts-per-request", type=int, default=1, help="default %(default)s")
    parser.add_argument("--tokens", type=int, default=50, help="tokens per text (default 50)")
    parser.add_argument(
        "--pause-s", type=float, default=0.1, help="a client's wait after a refusal (0.1)"
    )
    parser.add_argument(
        "--backoff",
        action="store_true",
        help="after a refusal wait as the client library does (full jitter, 0.1 s doubling "
        "to 5 s) instead of --pause-s",
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=REPO_ROOT / "model_repository",
        help="repository to serve (default: the shipped one)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)

    texts = exact_texts(args.tokens, args.texts_per_request)
    server = TritonServer(model_repository=args.model_repository)
    server.start()
    print(f"tritonserver pid {server.process.pid}, log {server.log_path}", flush=True)
    try:
        run_load(server.grpc_url, texts, clients=2, seconds=3.0)  # warm-up
        pause: float | RetryPolicy = RetryPolicy() if args.backoff else args.pause_s
        run = run_load(server.grpc_url, texts, args.clients, args.seconds, pause)
        alive = server.process.poll() is None
        ready = server.is_ready()
    finally:
        code = server.stop()
    figures = summarize(run)
    figures.update(
        clients=args.clients,
        texts_per_request=args.texts_per_request,
        tokens_per_text=args.tokens,
        after_refusal="client library backoff" if args.backoff else f"{args.pause_s} s pause",
        model_repository=str(args.model_repository),
        server_alive_at_end=alive,
        server_ready_at_end=ready,
        server_exit_code=code,
    )
    crashes = figures["errors"] + figures["not_ready_checks"] + (not alive) + (not ready)
    figures["crashes"] = crashes
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
