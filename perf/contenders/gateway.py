"""Contenders ``gateway_float`` / ``gateway_base64``: our HTTP gateway in front of the ensemble.

:class:`GatewayServer` starts ``python -m triton_embed_server.gateway`` (one uvicorn worker,
as shipped; the process is the launcher's :class:`~triton_embed_server.run.launcher.Gateway`) on
a free loopback port in front of a running :class:`TritonServer`, the one the ``triton_pa``
and ``triton_client`` contenders load; :func:`gateway_load` drives its
OpenAI ``/v1/embeddings`` route with the load generator that drives vLLM's server
(:mod:`perf.contenders.openai_load`): same texts, same decoding, only ``model`` and the
truncation field differ. :class:`RerankGateway` is the same gateway in front of a reranker's
server, :mod:`perf.rerank`'s ``gateway`` contender (:func:`gateway_rerank_load`).
"""

from __future__ import annotations

import functools
import subprocess
import time

from triton_embed_server.run.launcher import Gateway, TritonServer, stopped_on_failure

from perf.contenders.openai_load import (
    embeddings_load,
    http_answer,
    probe_rerank,
    request_body,
    rerank_load,
)
from perf.corpora import PairCorpus

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
            if (
                http_answer(f"{self.base_url}/health")[0] == 200
                and http_answer(self.url, probe)[0] == 200
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"gateway not ready to embed after {READY_TIMEOUT_S:.0f} s:\n"
            + self.launcher.log_tail()
        )

    def __exit__(self, *exc) -> None:
        self.launcher.stop()


#: The gateway's rerank route (Jina's and Cohere's ``POST /v1/rerank``).
RERANK_ROUTE = "/v1/rerank"


def gateway_rerank_load(
    url: str, corpus: PairCorpus, docs: int, conc: int, seconds: float, model: str
) -> dict:
    """The gateway's rerank route loaded by :func:`~perf.contenders.openai_load.rerank_load`.

    The body is Jina's and Cohere's ``{model, query, documents, top_n}``, ``top_n`` = every
    document (each score is answered and decoded).
    """
    return rerank_load(url, corpus, docs, conc, seconds, model=model, options={"top_n": docs})


class RerankGateway:
    """Our gateway in front of a reranker's server, on its rerank route when it has one.

    A context manager. Entering starts the launcher's gateway, waits until ``/v1/models``
    lists ``reranker`` and sends one rerank request (:func:`probe_rerank`). Where the gateway
    lists no reranker or has no rerank route yet (an older gateway), it is stopped and
    :attr:`note` says why (:attr:`url` is then ``None``); nothing is raised. Leaving stops
    the process it started.

    Args:
        server: the running server.
        reranker: the reranker ensemble's name (the requests' ``model``).
        ready_timeout_s: how long to wait for ``/v1/models`` to list it (a gateway lists its
            upstreams' models within seconds of its start; one without rerank support never
            lists a reranker, and this is the time that costs).
    """

    def __init__(self, server: TritonServer, reranker: str, ready_timeout_s: float = 20.0):
        self.reranker = reranker
        self.launcher = Gateway(
            [server.grpc_url], server.admin_key, model=reranker, ready_timeout_s=ready_timeout_s
        )
        self.url: str | None = None
        self.note: str | None = None

    def __enter__(self) -> RerankGateway:
        try:
            self.launcher.start()
        except RuntimeError as exc:
            first = str(exc).splitlines()[0].rstrip(":")
            self.note = (
                f"{first} (GET /v1/models): this gateway serves no reranker yet, or it started "
                f"too slowly (its log: {self.launcher.log_path})"
            )
            return self
        url = f"{self.launcher.base_url}{RERANK_ROUTE}"
        problem = probe_rerank(url, self.reranker, {"top_n": 1})
        if problem:
            self.launcher.stop()
            self.note = f"the gateway has no working rerank route yet: {problem}"
        else:
            self.url = url
        return self

    def __exit__(self, *exc) -> None:
        self.launcher.stop()
