"""Contenders ``vllm_float`` / ``vllm_base64``: vLLM's OpenAI-compatible server.

:class:`VllmServer` starts ``python -m vllm.entrypoints.openai.api_server --runner pooling``
on a free loopback port; :func:`vllm_load` drives its ``/v1/embeddings`` endpoint over HTTP
with an asyncio/aiohttp load generator that decodes every response.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from triton_embed_server.launcher import free_port

from perf.corpora import MAX_TOKENS, MODEL

# vLLM drops torch to 1 thread per engine unless OMP_NUM_THREADS says otherwise; its server
# gets every core this process may use.
THREADS = os.environ.get("OMP_NUM_THREADS") or str(len(os.sched_getaffinity(0)))


def vllm_load(
    url: str,
    texts: list[str],
    batch: int,
    conc: int,
    seconds: float,
    fmt: str,
    text_tokens: list[int] | None = None,
) -> dict:
    """Load vLLM's ``/v1/embeddings`` with ``conc`` requests of ``batch`` texts in flight.

    Args:
        url: the server's ``/v1/embeddings`` URL.
        texts: texts to send, in turn.
        batch: texts per request.
        conc: requests in flight.
        seconds: measurement time.
        fmt: ``encoding_format`` asked for, ``float`` or ``base64``; every vector is decoded.
        text_tokens: tokens of each text (after truncation); the result's
            ``tokens_per_text`` is then the mean over the texts actually sent.

    Returns:
        A contender result.
    """
    return asyncio.run(_load(url, texts, batch, conc, seconds, fmt, text_tokens))


async def _load(
    url: str,
    texts: list[str],
    batch: int,
    conc: int,
    seconds: float,
    fmt: str,
    text_tokens: list[int] | None,
) -> dict:
    import aiohttp

    latencies: list[float] = []
    counts = {"texts": 0, "errors": 0, "tokens": 0}
    deadline = time.perf_counter() + seconds

    async def worker(session, k):
        i = k
        while time.perf_counter() < deadline:
            idx = [(i + j) % len(texts) for j in range(batch)]
            chunk = [texts[x] for x in idx]
            i += batch
            t0 = time.perf_counter()
            async with session.post(
                url,
                json={
                    "model": "bench",
                    "input": chunk,
                    "encoding_format": fmt,
                    "truncate_prompt_tokens": MAX_TOKENS,
                },
            ) as resp:
                body = await resp.json()
            if resp.status != 200:
                counts["errors"] += 1
                continue
            for item in body["data"]:  # decode like a real client
                emb = item["embedding"]
                np.frombuffer(base64.b64decode(emb), "<f4") if fmt == "base64" else np.asarray(
                    emb, np.float32
                )
            latencies.append(time.perf_counter() - t0)
            counts["texts"] += len(chunk)
            counts["tokens"] += sum(text_tokens[x] for x in idx) if text_tokens else 0

    connector = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session, k) for k in range(conc)))
        dt = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000
    return {
        "texts_s": counts["texts"] / dt,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
        "errors": counts["errors"],
        "tokens_per_text": counts["tokens"] / counts["texts"]
        if text_tokens and counts["texts"]
        else None,
    }


class VllmServer:
    """vLLM's OpenAI-compatible server in pooling mode on a free loopback port."""

    def __init__(self):
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="vllm-server-", suffix=".log", delete=False)

    def __enter__(self) -> VllmServer:
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(MODEL),
            "--served-model-name",
            "bench",
            "--runner",
            "pooling",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--enforce-eager",
            "--gpu-memory-utilization",
            "0.1",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", OMP_NUM_THREADS=THREADS)
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        import urllib.request

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited; log: {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"vLLM server not ready; log: {self.log.name}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
