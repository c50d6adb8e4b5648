"""Contenders ``infinity_torch`` / ``infinity_onnx``: the Infinity embedding server.

Infinity (``infinity-emb`` 0.0.78, https://github.com/michaelfeil/infinity) is the server
people pick to embed on CPU. :class:`InfinityServer` starts ``infinity_emb v2`` from its own
virtual environment (``perf/setup_infinity.sh``; its pins clash with the project's) on a free
loopback port, with its ``torch`` engine (sentence-transformers) or its ``optimum`` engine
(ONNX Runtime, on the ONNX export that script makes), ``--batch-size`` :data:`BATCH_SIZE`,
mean pooling (the model's own). Before it is measured, its vectors for two texts (one longer
than the model's 256-token budget) are checked against sentence-transformers in this process:
cosine >= 0.9999, so every contender computes the same embeddings.

It is driven with the load generator that drives vLLM's server and our gateway
(:func:`perf.contenders.openai_load.embeddings_load` on :attr:`InfinityServer.url`, ``model``
:data:`SERVED_MODEL`). Infinity truncates at the budget by itself and has no truncation field,
so no option is sent.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
from triton_embed_server.run.launcher import (
    REPO_ROOT,
    free_port,
    stop_process,
    stopped_on_failure,
)

from perf.contenders.openai_load import decode, request_body, wait_healthy
from perf.corpora import MAX_TOKENS, MODEL

HERE = REPO_ROOT / "perf" / ".infinity"
EXECUTABLE = HERE / "venv" / "bin" / "infinity_emb"
ONNX_MODEL = HERE / "model-onnx"
SERVED_MODEL = "bench"
#: Infinity's default batch size is 32; the issue's rough run used 32 as well.
BATCH_SIZE = 32
ENGINES = ("torch", "onnx")  # contender suffix -> Infinity --engine torch / optimum


def available() -> bool:
    """Whether ``perf/setup_infinity.sh`` has run (its venv and ONNX model exist)."""
    return EXECUTABLE.exists() and (ONNX_MODEL / "model.onnx").exists()


class InfinityServer:
    """``infinity_emb v2`` with one engine on a free loopback port.

    Args:
        engine: ``torch`` or ``onnx`` (Infinity's ``optimum`` engine on ONNX Runtime).

    Raises (on enter):
        RuntimeError: not installed, failed to start within 300 s, or its vectors differ from
            sentence-transformers'.
    """

    def __init__(self, engine: str):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.engine = engine
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/embeddings"
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix=f"infinity-{engine}-", suffix=".log")

    def __enter__(self) -> InfinityServer:
        if not available():
            raise RuntimeError("Infinity is not installed: run bash perf/setup_infinity.sh")
        model, cwd = (MODEL, REPO_ROOT) if self.engine == "torch" else (Path("."), ONNX_MODEL)
        # The optimum engine is given the model as "." from inside its folder: Infinity 0.0.78
        # passes an absolute local path on as an ONNX file name, which optimum then refuses.
        cmd = [
            str(EXECUTABLE), "v2", "--model-id", str(model), "--served-model-name", SERVED_MODEL,
            "--engine", "torch" if self.engine == "torch" else "optimum",
            "--pooling-method", "mean", "--device", "cpu", "--batch-size", str(BATCH_SIZE),
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            HF_HUB_CACHE=str(HERE / "hub-cache"),  # its optimized ONNX graph is cached here
            INFINITY_ANONYMOUS_USAGE_STATS="0",
            DO_NOT_TRACK="1",
        )
        env.pop("VIRTUAL_ENV", None)
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        problem = wait_healthy(self.proc, f"http://127.0.0.1:{self.port}/health", 300)
        if problem:
            self.__exit__()
            raise RuntimeError(f"Infinity ({self.engine}) {problem}:\n{self.log_tail()}")
        with stopped_on_failure(self.__exit__):
            self.check_vectors()
        return self

    def check_vectors(self) -> None:
        """Raise RuntimeError unless two texts' vectors match sentence-transformers'."""
        import json

        from sentence_transformers import SentenceTransformer

        texts = ["a short text", "a long text that runs past the budget " * 40]
        reference = SentenceTransformer(str(MODEL), device="cpu")
        reference.max_seq_length = MAX_TOKENS
        expected = reference.encode(texts, normalize_embeddings=True)
        body = json.dumps(request_body(texts, "base64", SERVED_MODEL, {})).encode()
        request = urllib.request.Request(
            self.url, data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            got = np.stack(decode(json.load(answer), "base64"))
        got = got / np.linalg.norm(got, axis=1, keepdims=True)
        cosine = np.sum(got * expected, axis=1)
        if not np.all(cosine >= 0.9999):
            raise RuntimeError(
                f"Infinity ({self.engine}) vectors differ from sentence-transformers' "
                f"(cosine {cosine.round(5).tolist()}); the comparison would be unfair"
            )

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def __exit__(self, *exc) -> None:
        stop_process(self.proc, 30)
