"""Contenders ``vllm_float`` / ``vllm_base64``: vLLM's OpenAI-compatible server.

:class:`VllmServer` starts ``python -m vllm.entrypoints.openai.api_server --runner pooling``
on a free loopback port; :func:`vllm_load` drives its ``/v1/embeddings`` endpoint over HTTP
with the asyncio/aiohttp load generator of :mod:`perf.contenders.openai_load`, which decodes
every response (the gateway's contenders use the same one). With a cross-encoder folder
(``model=``) the same server is :mod:`perf.rerank`'s ``vllm_server``, on its ``/rerank``
route (:attr:`VllmServer.rerank_url`).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from triton_embed_server.run.launcher import free_port, stop_process

from perf.contenders.openai_load import embeddings_load, wait_healthy
from perf.corpora import MAX_TOKENS, MODEL

# vLLM drops torch to 1 thread per engine unless OMP_NUM_THREADS says otherwise; its server
# gets every core this process may use.
THREADS = os.environ.get("OMP_NUM_THREADS") or str(len(os.sched_getaffinity(0)))
SERVED_MODEL = "bench"  # --served-model-name: the requests' ``model``
TRUNCATION = {"truncate_prompt_tokens": MAX_TOKENS}  # vLLM's truncation field


# ``vllm_load(url, texts, batch, conc, seconds, fmt, text_tokens=None)``: vLLM's
# ``/v1/embeddings`` loaded by :func:`~perf.contenders.openai_load.embeddings_load`, naming
# :data:`SERVED_MODEL` and truncating at the model's budget with ``truncate_prompt_tokens``.
vllm_load = functools.partial(embeddings_load, model=SERVED_MODEL, options=TRUNCATION)


class VllmServer:
    """vLLM's OpenAI-compatible server in pooling mode on a free loopback port.

    Args:
        dtype: its ``--dtype`` (float32, as users of a float32 checkpoint get it on CPU;
            bfloat16 for the precision benchmark's peer at that precision).
        model: the model folder (default: the shipped all-MiniLM-L6-v2).
        max_model_len: its ``--max-model-len``, tokens per input (default: that model's
            256-token budget).
        extra_args: further command-line arguments (e.g. ``--hf-overrides`` for a SPLADE
            folder, as vLLM's docs tell its users).
    """

    def __init__(
        self,
        dtype: str = "float32",
        model: Path = MODEL,
        max_model_len: int = MAX_TOKENS,
        extra_args: tuple[str, ...] = (),
    ):
        self.dtype = dtype
        self.extra_args = extra_args
        self.model = model
        self.max_model_len = max_model_len
        self.port = free_port()
        self.embeddings_url = f"http://127.0.0.1:{self.port}/v1/embeddings"
        #: The Jina-style rerank route (``{model, query, documents}``; vLLM's scoring API).
        self.rerank_url = f"http://127.0.0.1:{self.port}/rerank"
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="vllm-server-", suffix=".log", delete=False)

    def __enter__(self) -> VllmServer:
        return self.start().wait_ready()

    def start(self) -> VllmServer:
        """Start the server's process; returns at once (:meth:`wait_ready` waits for it)."""
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            SERVED_MODEL,
            "--runner",
            "pooling",
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--enforce-eager",
            "--gpu-memory-utilization",
            "0.1",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", OMP_NUM_THREADS=THREADS)
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        return self

    def wait_ready(self, timeout_s: float = 300.0) -> VllmServer:
        """Wait until ``/health`` answers.

        Raises:
            RuntimeError: it exited or was not ready within ``timeout_s`` (it is stopped).
        """
        problem = wait_healthy(self.proc, f"http://127.0.0.1:{self.port}/health", timeout_s)
        if problem:
            self.__exit__()
            raise RuntimeError(f"vLLM server {problem}; log: {self.log.name}")
        return self

    def __exit__(self, *exc) -> None:
        stop_process(self.proc, 60)
