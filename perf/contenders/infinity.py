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

Given a cross-encoder folder (``reranker=``, torch engine), the same server is
:mod:`perf.rerank`'s ``infinity`` contender on its ``/rerank`` route
(:attr:`InfinityServer.rerank_url`; no vector check).
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
#: The same export quantized to int8 by ONNX Runtime's dynamic quantization (optimum's
#: ``avx512_vnni`` config: int8 weights per channel, activations quantized per call), as
#: ``model_quantized.onnx``, the file Infinity's optimum engine picks on CPU.
ONNX_INT8_MODEL = HERE / "model-onnx-int8"
SERVED_MODEL = "bench"
#: Infinity's default batch size is 32; the issue's rough run used 32 as well.
BATCH_SIZE = 32
ENGINES = ("torch", "onnx")  # contender suffix -> Infinity --engine torch / optimum
#: Engine -> the model folder Infinity is given (None: the shipped model, by path).
FOLDERS = {"torch": None, "onnx": ONNX_MODEL, "onnx_int8": ONNX_INT8_MODEL}
#: Least cosine of Infinity's vectors to sentence-transformers' before it is measured: the
#: float32 engines compute the same vectors (0.9999); int8 rounds them (the check's
#: 256-token text measured 0.980), so 0.95 there, a sanity floor: its accuracy is what
#: perf.precision's gate on 300 texts reports.
COSINE_FLOOR = {"torch": 0.9999, "onnx": 0.9999, "onnx_int8": 0.95}


def available(engine: str = "onnx") -> bool:
    """Whether ``perf/setup_infinity.sh`` has run (its venv and the engine's model exist)."""
    folder = FOLDERS[engine]
    return EXECUTABLE.exists() and (folder is None or any(folder.glob("*.onnx")))


class InfinityServer:
    """``infinity_emb v2`` with one engine on a free loopback port.

    Args:
        engine: ``torch``, ``onnx`` (Infinity's ``optimum`` engine on ONNX Runtime) or
            ``onnx_int8`` (the same engine on :data:`ONNX_INT8_MODEL`).
        reranker: a cross-encoder folder to serve instead of the embedding model (on
            :attr:`rerank_url`; its engine's own folder is not used, and no vectors checked).

    Raises (on enter):
        RuntimeError: not installed, failed to start within 300 s, or its vectors differ from
            sentence-transformers'.
    """

    def __init__(self, engine: str, reranker: Path | None = None):
        if engine not in FOLDERS:
            raise ValueError(f"engine must be one of {tuple(FOLDERS)}, got {engine!r}")
        self.engine = engine
        self.reranker = reranker
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/embeddings"
        self.rerank_url = f"http://127.0.0.1:{self.port}/rerank"
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix=f"infinity-{engine}-", suffix=".log")

    def __enter__(self) -> InfinityServer:
        if not available(self.engine):
            raise RuntimeError("Infinity is not installed: run bash perf/setup_infinity.sh")
        folder = FOLDERS[self.engine]
        model, cwd = (MODEL, REPO_ROOT) if folder is None else (Path("."), folder)
        if self.reranker is not None:
            model, cwd = self.reranker, REPO_ROOT
        pooling = ["--pooling-method", "mean"] if self.reranker is None else []
        # The optimum engine is given the model as "." from inside its folder: Infinity 0.0.78
        # passes an absolute local path on as an ONNX file name, which optimum then refuses.
        cmd = [
            str(EXECUTABLE), "v2", "--model-id", str(model), "--served-model-name", SERVED_MODEL,
            "--engine", "torch" if self.engine == "torch" else "optimum",
            *pooling, "--device", "cpu", "--batch-size", str(BATCH_SIZE),
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
        if self.reranker is None:
            with stopped_on_failure(self.__exit__):
                self.check_vectors()
        return self

    def embed(self, texts: list[str]) -> np.ndarray:
        """Infinity's unit vectors of ``texts``, ``[len(texts), dim]`` float64."""
        import json

        body = json.dumps(request_body(texts, "base64", SERVED_MODEL, {})).encode()
        request = urllib.request.Request(
            self.url, data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            got = np.stack(decode(json.load(answer), "base64")).astype(np.float64)
        return got / np.linalg.norm(got, axis=1, keepdims=True)

    def check_vectors(self) -> None:
        """Raise RuntimeError unless two texts' vectors match sentence-transformers'.

        Match: cosine at least the engine's :data:`COSINE_FLOOR`.
        """
        from sentence_transformers import SentenceTransformer

        texts = ["a short text", "a long text that runs past the budget " * 40]
        reference = SentenceTransformer(str(MODEL), device="cpu")
        reference.max_seq_length = MAX_TOKENS
        expected = reference.encode(texts, normalize_embeddings=True)
        cosine = np.sum(self.embed(texts) * expected, axis=1)
        if not np.all(cosine >= COSINE_FLOOR[self.engine]):
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
