"""Contenders ``vllm_float`` / ``vllm_base64``: vLLM's OpenAI-compatible server.

:class:`VllmServer` starts ``python -m vllm.entrypoints.openai.api_server --runner pooling``
on a free loopback port; :func:`vllm_load` drives its ``/v1/embeddings`` endpoint over HTTP
with the asyncio/aiohttp load generator of :mod:`perf.contenders.openai_load`, which decodes
every response (the gateway's contenders use the same one).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from triton_embed_server.run.launcher import free_port

from perf.contenders.openai_load import embeddings_load
from perf.corpora import MAX_TOKENS, MODEL

# vLLM drops torch to 1 thread per engine unless OMP_NUM_THREADS says otherwise; its server
# gets every core this process may use.
THREADS = os.environ.get("OMP_NUM_THREADS") or str(len(os.sched_getaffinity(0)))
SERVED_MODEL = "bench"  # --served-model-name: the requests' ``model``
TRUNCATION = {"truncate_prompt_tokens": MAX_TOKENS}  # vLLM's truncation field


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

    The request names :data:`SERVED_MODEL` and truncates at the model's budget with vLLM's
    ``truncate_prompt_tokens`` (:data:`TRUNCATION`); the load generator is
    :func:`~perf.contenders.openai_load.embeddings_load`.

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
    return embeddings_load(
        url,
        texts,
        batch,
        conc,
        seconds,
        fmt,
        model=SERVED_MODEL,
        options=TRUNCATION,
        text_tokens=text_tokens,
    )


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
            SERVED_MODEL,
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
