"""Contenders ``gateway_float`` / ``gateway_base64``: our HTTP gateway in front of the ensemble.

:class:`GatewayServer` starts ``python -m triton_embed_server.gateway`` (one uvicorn worker,
as shipped; the process is the launcher's :class:`~triton_embed_server.run.launcher.Gateway`) on
a free loopback port in front of a running :class:`TritonServer`, the one the ``triton_pa``
and ``triton_client`` contenders load; :func:`gateway_load` drives its
OpenAI ``/v1/embeddings`` route with the load generator that drives vLLM's server
(:mod:`perf.contenders.openai_load`): same texts, same decoding, only ``model`` and the
truncation field differ.
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
import urllib.error
import urllib.request

from triton_embed_server.run.launcher import Gateway, TritonServer, stopped_on_failure

from perf.contenders.openai_load import embeddings_load, request_body

ENSEMBLE = "embed"  # the requests' ``model``: the ensemble's name
# The gateway's truncation field: END at the model's token budget, what vLLM's
# truncate_prompt_tokens=256 does (the ensemble's default too; sent so the two agree).
TRUNCATION = {"truncate": "END"}
READY_TIMEOUT_S = 60.0


# ``gateway_load(url, texts, batch, conc, seconds, fmt, text_tokens=None)``: the gateway's
# ``/v1/embeddings`` (:attr:`GatewayServer.url`) loaded by
# :func:`~perf.contenders.openai_load.embeddings_load`, naming the ensemble and truncating at END.
gateway_load = functools.partial(embeddings_load, model=ENSEMBLE, options=TRUNCATION)


class GatewayServer:
    """A gateway on a free loopback port in front of ``server``, ready to embed; a context manager.

    The process is :class:`triton_embed_server.run.launcher.Gateway`'s (the server's admin key, no
    API key, one uvicorn worker unless ``workers``). Entering starts it and then also waits
    until ``GET /health`` answers 200 and one embedding request succeeds, raising
    ``RuntimeError`` with its log's tail if that does not happen within
    :data:`READY_TIMEOUT_S`. Leaving stops the process it started (SIGTERM, then SIGKILL
    after 30 s).
    """

    def __init__(self, server: TritonServer, workers: int = 1, extra_args: list[str] = ()):
        self.launcher = Gateway(
            [server.grpc_url],
            server.admin_key,
            workers=workers,
            ready_timeout_s=READY_TIMEOUT_S,
            extra_args=list(extra_args),
        )

    @property
    def port(self) -> int:
        """The gateway's port on 127.0.0.1."""
        return self.launcher.port

    @property
    def proc(self) -> subprocess.Popen | None:
        """The gateway process (``proc.pid`` for a profiler), once entered."""
        return self.launcher.process

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return self.launcher.base_url

    @property
    def url(self) -> str:
        """The OpenAI ``/v1/embeddings`` URL."""
        return f"{self.base_url}/v1/embeddings"

    def __enter__(self) -> GatewayServer:
        self.launcher.start()
        with stopped_on_failure(self.launcher.stop):
            self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        probe = request_body(["ready?"], "base64", ENSEMBLE, TRUNCATION)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gateway exited {self.proc.returncode}:\n{self.launcher.log_tail()}"
                )
            if _status(f"{self.base_url}/health") == 200 and _status(self.url, probe) == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"gateway not ready to embed after {READY_TIMEOUT_S:.0f} s:\n"
            + self.launcher.log_tail()
        )

    def __exit__(self, *exc) -> None:
        self.launcher.stop()


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
