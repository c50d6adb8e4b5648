"""The HTTP load generator of the OpenAI-compatible contenders (vLLM's server, our gateway).

:func:`embeddings_load` keeps ``conc`` ``POST /v1/embeddings`` requests of ``batch`` texts in
flight for a while (asyncio + aiohttp, one connection per request in flight) and decodes
every vector of every answer, as a real client would. Only the request's ``model`` and its
extra fields (each server's name of the truncation option) differ between the servers.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import time
import urllib.request
from typing import Any

import numpy as np


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float) -> str | None:
    """Poll ``GET url`` (a server's health route) every second until it answers.

    Args:
        proc: the server's process.
        url: its health URL.
        timeout_s: how long to wait.

    Returns:
        ``None`` once it answered; ``"exited"`` if ``proc`` exited first, ``"not ready"`` if
        ``timeout_s`` passed.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return "exited"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return None
        except OSError:
            time.sleep(1)
    return "not ready"


def request_body(texts: list[str], fmt: str, model: str, options: dict[str, Any]) -> dict[str, Any]:
    """One ``/v1/embeddings`` request body.

    Args:
        texts: the ``input`` list.
        fmt: ``encoding_format``, ``float`` or ``base64``.
        model: the ``model`` field.
        options: further fields, e.g. ``{"truncate_prompt_tokens": 256}`` (vLLM) or
            ``{"truncate": "END"}`` (the gateway).

    Returns:
        The JSON object to send.
    """
    return {"model": model, "input": texts, "encoding_format": fmt, **options}


def decode(body: dict[str, Any], fmt: str) -> list[np.ndarray]:
    """The vectors of an answer, each float32 ``[dim]``.

    ``base64``: the little-endian float32 bytes of each vector; ``float``: a JSON list.
    """
    if fmt == "base64":
        return [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in body["data"]]
    return [np.asarray(d["embedding"], np.float32) for d in body["data"]]


def embeddings_load(
    url: str,
    texts: list[str],
    batch: int,
    conc: int,
    seconds: float,
    fmt: str,
    *,
    model: str,
    options: dict[str, Any],
    text_tokens: list[int] | None = None,
) -> dict:
    """Load a ``/v1/embeddings`` endpoint with ``conc`` requests of ``batch`` texts in flight.

    Args:
        url: the server's ``/v1/embeddings`` URL.
        texts: texts to send, in turn.
        batch: texts per request.
        conc: requests in flight.
        seconds: measurement time; the requests in flight at its end are waited for and
            counted (the time includes them).
        fmt: ``encoding_format`` asked for, ``float`` or ``base64``; every vector is decoded.
        model: the request's ``model``.
        options: further request fields (:func:`request_body`).
        text_tokens: tokens of each text (after truncation); the result's
            ``tokens_per_text`` is then the mean over the texts actually sent.

    Returns:
        A contender result; with errors, ``detail`` holds the first one.
    """
    import aiohttp

    deadline = time.perf_counter() + seconds
    latencies: list[float] = []
    counts = {"texts": 0, "errors": 0, "tokens": 0}
    problems: list[str] = []

    async def worker(session, k):
        i = k
        while time.perf_counter() < deadline:
            idx = [(i + j) % len(texts) for j in range(batch)]
            chunk = [texts[x] for x in idx]
            i += batch
            t0 = time.perf_counter()
            try:
                async with session.post(url, json=request_body(chunk, fmt, model, options)) as resp:
                    body = await resp.json(content_type=None)
            except (aiohttp.ClientError, ValueError) as exc:
                counts["errors"] += 1
                problems.append(f"{type(exc).__name__}: {exc}")
                continue
            if resp.status != 200:
                counts["errors"] += 1
                problems.append(f"HTTP {resp.status}: {str(body)[:300]}")
                continue
            decode(body, fmt)  # like a real client
            latencies.append(time.perf_counter() - t0)
            counts["texts"] += len(chunk)
            counts["tokens"] += sum(text_tokens[x] for x in idx) if text_tokens else 0

    async def run() -> float:
        connector = aiohttp.TCPConnector(limit=conc)
        async with aiohttp.ClientSession(connector=connector) as session:
            t0 = time.perf_counter()
            await asyncio.gather(*(worker(session, k) for k in range(conc)))
            return time.perf_counter() - t0

    dt = asyncio.run(run())
    lat = np.asarray(latencies) * 1000
    result = {
        "texts_s": counts["texts"] / dt,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
        "errors": counts["errors"],
        "tokens_per_text": counts["tokens"] / counts["texts"]
        if text_tokens and counts["texts"]
        else None,
    }
    if problems:
        result["detail"] = problems[0]
    return result
