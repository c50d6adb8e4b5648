"""Contenders ``gateway_float`` / ``gateway_base64``: our HTTP gateway in front of the ensemble.

:class:`GatewayServer` starts ``python -m triton_embed_server.gateway`` (one uvicorn worker,
as shipped) on a free loopback port in front of a running :class:`TritonServer`, the one
the ``triton_pa`` and ``triton_client`` contenders load; :func:`gateway_load` drives its
OpenAI ``/v1/embeddings`` route with the load generator that drives vLLM's server
(:mod:`perf.contenders.openai_load`): same texts, same decoding, only ``model`` and the
truncation field differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from triton_embed_server.launcher import TritonServer, free_port

from perf.contenders.openai_load import embeddings_load, request_body

ENSEMBLE = "embed"  # the requests' ``model``: the ensemble's name
# The gateway's truncation field: END at the model's token budget, what vLLM's
# truncate_prompt_tokens=256 does (the ensemble's default too; sent so the two agree).
TRUNCATION = {"truncate": "END"}
READY_TIMEOUT_S = 60.0


def gateway_load(
    url: str,
    texts: list[str],
    batch: int,
    conc: int,
    seconds: float,
    fmt: str,
    text_tokens: list[int] | None = None,
) -> dict:
    """Load the gateway's ``/v1/embeddings`` with ``conc`` requests of ``batch`` texts in flight.

    Args:
        url: the gateway's ``/v1/embeddings`` URL (:attr:`GatewayServer.url`).
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
        model=ENSEMBLE,
        options=TRUNCATION,
        text_tokens=text_tokens,
    )


class GatewayServer:
    """A gateway process on a free loopback port in front of ``server``; a context manager.

    Entering starts it with the server's admin key (it reads the ensembles' configs) and no
    API key, waits until ``GET /health`` answers 200 and one embedding request succeeds,
    and raises ``RuntimeError`` with its log's tail if it does not within
    :data:`READY_TIMEOUT_S`. Leaving stops the process it started (SIGTERM, then SIGKILL
    after 30 s).

    Attributes:
        port: the gateway's port on 127.0.0.1.
        proc: the gateway process (``proc.pid`` for a profiler), once entered.
        log_path: its stdout and stderr.
    """

    def __init__(self, server: TritonServer, workers: int = 1):
        self.server = server
        self.workers = workers
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        fd, path = tempfile.mkstemp(prefix="gateway-", suffix=".log")
        os.close(fd)
        self.log_path = path

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI ``/v1/embeddings`` URL."""
        return f"{self.base_url}/v1/embeddings"

    def command(self) -> list[str]:
        """The gateway's command line."""
        return [
            sys.executable, "-m", "triton_embed_server.gateway",
            "--upstream", self.server.grpc_url, "--host", "127.0.0.1",
            "--port", str(self.port), "--workers", str(self.workers),
        ]  # fmt: skip

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the gateway's log."""
        with open(self.log_path, errors="replace") as f:
            return f.read()[-chars:]

    def __enter__(self) -> GatewayServer:
        env = {**os.environ, "TRITON_EMBED_ADMIN_KEY": self.server.admin_key}
        env.pop("TRITON_EMBED_GATEWAY_API_KEY", None)  # no client key: every route open
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        probe = request_body(["ready?"], "base64", ENSEMBLE, TRUNCATION)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gateway exited {self.proc.returncode}; log {self.log_path}:\n"
                    + self.log_tail()
                )
            if _status(f"{self.base_url}/health") == 200 and _status(self.url, probe) == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"gateway not ready after {READY_TIMEOUT_S:.0f} s; log {self.log_path}:\n"
            + self.log_tail()
        )

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _status(url: str, body: dict | None = None) -> int | None:
    """The HTTP status of a GET (or a JSON POST of ``body``); ``None`` if nothing answered."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None
